// Package dlock is the core of dlock: distributed locks that are safe by
// default. This module is standard library only; each backend (redislock,
// filelock, memlock, ...) is its own package or module and brings only its
// own dependencies.
//
// # A lock is a lease
//
// A distributed lock is a lease: the server grants key to one owner for a
// TTL. If the holder crashes, the lease expires and someone else can take
// the key; if the holder merely pauses (a GC pause, a stalled VM, a
// partition) past the TTL, the lease expires all the same, and when the
// holder resumes it may still believe it holds the lock. No lock service
// can prevent that: the holder learns of the expiry only when it next
// looks. What dlock promises is therefore split in two.
//
// Liveness and best-effort exclusion, from the lock:
//   - While no fault occurs, at most one holder holds a key.
//   - With auto-refresh on (the default) a watchdog renews the lease every
//     TTL/3, batched per backend client.
//   - Every Lock keeps a local deadline on the monotonic clock: the start of
//     the last successful acquire or renewal request, plus TTL, minus a
//     clock-drift allowance (TTL*DefaultDriftFactor + DefaultDriftMin). If
//     no renewal has succeeded by then, Lost() closes. Because the server's
//     expiry counts from a later moment (when it received the request) and
//     the drift allowance covers bounded clock-rate differences, Lost()
//     closes before the server can grant the key to anyone else.
//   - Release and Refresh only act if the server still records this owner
//     (compare-and-delete, compare-and-expire), so a late or retried release
//     never frees someone else's lock.
//
// Safety, from fencing:
//   - Every Lock carries a fencing token that strictly increases each time
//     the key changes hands (while the backend keeps its data; each backend
//     documents when tokens can repeat). Send Token() (or Fence()) with
//     every write to the protected resource, and have the resource refuse
//     tokens older than the newest it has seen: package guard and the
//     backends' guards do exactly that. Then a holder that paused past its
//     lease is refused even though it believes it holds the lock.
//
// Lost() is checked by the holder, so it cannot protect against a pause
// between the check and the write; fencing can. Use the lock to avoid
// wasted work; use the lock plus fencing when correctness depends on it.
//
// # Using a lock
//
//	l := redislock.New(redisClient)           // any backend: a dlock.Locker
//	err := dlock.Do(ctx, l, "inventory:42", func(ctx context.Context, lk *dlock.Lock) error {
//		// ctx is cancelled if the lock is lost.
//		return store.Decrement(ctx, "item-42", lk.Fence())
//	}, dlock.WithTTL(10*time.Second))
//
// Acquire waits for the key, woken by the backend's release notification
// and, as a fallback, by a bounded jittered poll (WithBackoff). TryAcquire
// makes one attempt and returns an error wrapping ErrNotAcquired when the
// key is held. Every call takes a context and returns when it ends.
//
// # Faults: hung is not dead
//
// A dead server refuses connections and every client notices at once; a
// hung one (SIGSTOP, a stalled link, a lost reply) is what breaks locks,
// because a client library left to itself waits for its own timeouts (a
// default go-redis client: 3s per read, then retries). dlock does not rely
// on the user's client settings.
//
// Guaranteed:
//   - Lost() closes at the local deadline whatever any backend call is
//     doing: deadlines and hold caps fire on timers that never wait on I/O,
//     a renewal in flight delays neither another lock's deadline nor its
//     renewal, and a lock taken meanwhile is scheduled at once. A renewal
//     whose success arrives after the deadline does not revive the lock.
//   - Every call (Acquire, TryAcquire, Refresh, Release) returns by its
//     context's deadline even when the server never answers. An attempt in
//     flight at the deadline gets four recent round trips (5 to 100ms) to
//     answer, so that a healthy server's answer (the holder, or the lock)
//     is what the caller hears; a queue wait, which ends on its own when
//     its context does, gets 100ms to report its holder. A call abandoned
//     then goes on in the background and is undone if it turns out to have
//     succeeded.
//   - ErrNotAcquired means a holder was observed. An attempt that got no
//     answer before the context ended is ErrUnavailable (joined with the
//     context's error), and so is one whose connection the server refused
//     or reset (the network error kept in the chain); another failed one
//     is the backend's error: an outage is never reported as "held". Only
//     an attempt that had been waiting for its answer less than a second
//     when it returned (the context's end cut it off), after an answer
//     that named a holder, is not yet overdue: that holder is what the
//     wait reports.
//   - Retried steps are harmless: a retried acquisition by the same owner
//     gets the lease it already has; Release may be called again and
//     concurrently, sends one request at a time, and reports a release
//     whose reply was lost as released.
//   - A nil *Lock, a nil context and a panicking function in Do give errors
//     or a released lock, never a panic of dlock's own.
//   - Break (on backends that implement Breaker: all of dlock's) removes a
//     key's leases atomically and never lowers its token counter: the next
//     holder's token is above every broken one's, and the broken holder's
//     Lost() closes at its next renewal at the latest.
//
// Not guaranteed:
//   - The local deadline is only as good as the clocks and the scheduler:
//     the drift allowance covers bounded clock-rate differences and a
//     timer firing a little late (the watchdog also learns the timer's
//     recent lateness and fires that much early), not a server clock that
//     jumps, not a process paused or starved of CPU for longer than that,
//     and not a holder paused between its check of Lost() and its write
//     (fencing covers all of these).
//   - Losing a lock costs CPU (1-2us; 10-50us under the race detector).
//     When thousands of locks of one Locker come due at once (a hung server
//     takes all their renewals) the watchdog starts early by the measured
//     cost, by at most a quarter of the TTL; a process that needs longer
//     than that to close them all loses the last ones late.
//   - An abandoned request that reaches the server after its undo (a link
//     that delivers a held request late) may leave a lease nobody holds;
//     it expires at its TTL.
//   - A holder whose lease was broken (Break) keeps running until its
//     next renewal: fence its writes with the token.
//   - A lease deleted on the server behind the holder's back (an operator,
//     a failover that lost the write) is noticed at the next renewal
//     (TTL/3) except on backends that watch their leases (etcd).
//
// # Writing a backend
//
// A backend implements driver.Driver (its Spec and one acquisition
// attempt, Try) and driver.Lease (owner-checked refresh and release),
// optionally driver.Watcher (release notifications), driver.Queuer (a
// server-side FIFO queue), driver.BatchRenewer (many renewals in one round
// trip, each reported as soon as known), driver.Aborter (undo an attempt
// whose outcome is unknown) and driver.LossNotifier (report a loss it
// notices on its own); a driver with a method ListHeld(ctx, prefix)
// ([]dlock.Info, error) gives its Engine a working List. Its steps must be idempotent for the same owner (a
// client's own retry after a lost reply). NewEngine turns that into a
// Locker with the common wait loop, watchdog, Lock handle and Observer
// calls; package dlocktest, including its fault section, checks the
// result. Package memlock is the reference backend.
package dlock
