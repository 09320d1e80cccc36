// Package guard is the resource side of fencing. A lock is a lease: a
// holder that pauses past its TTL (a GC pause, a stalled VM, a partition)
// can come back believing it still holds the lock after another holder
// took it. A guard sits in front of the protected resource and refuses
// such a holder: every operation carries the holder's dlock.Fence
// (Lock.Fence()), and the guard admits it only if it is not older than the
// fences the resource already accepted.
//
// # The rule
//
// Every guard keeps, per resource, a dlock.FenceRecord: the last
// exclusive fence it admitted and the highest token it admitted in any
// mode (Seen). It applies dlock.FenceRecord.Admit, and nothing else, to
// that record and the caller's fence (f):
//
//   - A token of 0 is never admitted (it is no lock's token).
//   - An exclusive fence (f.Shared false) is admitted if f.Token is above
//     Seen, or equal to the last exclusive fence's token from the same
//     non-empty owner with nothing admitted above it (the same holder
//     again). It becomes the resource's highest fence. A writer that
//     paused past its lease is refused once anyone granted after it used
//     the resource, a reader or permit holder included: every grant of a
//     key, in any mode, takes the key's next token.
//   - A shared fence (f.Shared: the fence of a Shared or Limited lock) is
//     admitted if f.Token is at least the last exclusive fence's token,
//     and it only raises Seen. Shared holders overlap, so they must not
//     fence each other out; what fences them out is the next exclusive
//     holder, whose token is above every token handed out for the key
//     before.
//
// A refused operation does nothing and returns a *dlock.StaleTokenError
// (errors.Is(err, dlock.ErrStaleToken)) naming the resource, the refused
// token and owner and the token it had to reach (dlock.FenceRecord.Bar),
// and reports one
// dlock.Event of Kind dlock.EventRejected to the dlock.Observer given to the
// guard's constructor with dlock.WithObserver.
//
// # Vocabulary
//
// Every guard implements Guard: Highest, and the fenced Put and Get of
// named values kept per resource. Get is fenced like Put and records an
// exclusive fence the same way (a fenced read): once a newer holder has
// read, an older holder's later write is refused, which makes a fenced
// read-modify-write safe. Guards that can run arbitrary Go code under the
// check (Memory, filelock.Guard) also implement Doer. Remote guards offer
// the store's own fenced operations besides (redislock.Guard.Eval,
// etcdlock.Guard.Txn).
//
// Implementations share Checker (argument checks, the rule, the refusal
// error and its Event) and are tested with the suite in guard/guardtest.
//
// # Guarantees
//
//   - Once a guard admitted a fence for a resource, it never admits an
//     exclusive fence with an older token for it again, nor a shared one
//     older than the last exclusive fence, for as long as the guard keeps its
//     state (Memory: the value's lifetime; filelock.Guard: the directory;
//     remote guards: the store's data).
//   - The check, the record of the new highest fence and the operation
//     (Put, Get, or Do's fn) happen with no other admitted operation on the
//     same resource in between.
//   - Remote guards return by the call's context: a store that does not
//     answer in time gives an error wrapping dlock.ErrUnavailable and the
//     context's error, on every backend (guardtest's StalledStore case).
//   - Invalid arguments (a nil context, an empty, over-long (more than
//     dlock.MaxKeyLen bytes), non-UTF-8 or NUL-containing resource or
//     name) are errors (wrapping dlock.ErrInvalidOption for the context,
//     dlock.ErrInvalidKey otherwise), never panics; nothing is recorded.
//     A context that has already ended returns its error and does nothing.
//
// # Not guaranteed
//
//   - Anything about operations that bypass the guard: every reader and
//     writer of the resource must go through it with its fence.
//   - Exclusion between shared holders: they are all admitted, in any
//     order, until an exclusive holder's fence is admitted.
//   - Ordering between resources: each resource has its own highest fence.
//   - That an operation whose call failed (a context that ended during a
//     remote call, an I/O error) did not take effect; it stays fenced.
//   - That a holder whose lock was lost is refused before its successor
//     used the resource: a guard knows only the fences it has seen, not
//     the lock service. Until the next holder's first fenced operation,
//     the old holder's fence is still the highest and is admitted.
package guard
