// Package driver is the interface a lock service implements to plug into
// dlock: one acquisition attempt, an owner-checked lease, and optional
// capabilities (release notifications, a server-side queue, batched
// renewal, undoing an attempt whose outcome is unknown, reporting a loss
// noticed by the server, breaking a lock for an operator: Breaker).
//
// Most code should use package dlock and a backend package (redislock,
// etcdlock, filelock, ...) instead. This package is for writing a backend,
// the way database/sql/driver is for writing a database driver: a backend
// implements Driver, hands it to dlock.NewEngine, and gets the common wait
// loop, the watchdog that renews leases and closes Lost() at the local
// deadline, the *dlock.Lock handle and the Observer calls. The conformance
// suite in package dlocktest checks the result.
//
// This package imports nothing from dlock, so that dlock can import it.
// A backend package imports both: errors and data it reports (ErrNotHeld,
// ErrTransient, *dlock.NotAcquiredError with its Holders, dlock.Info) are
// dlock's vocabulary.
//
// # What a backend must guarantee
//
//   - Every step is idempotent for the same Request.Owner: a client's own
//     retry after a lost reply gets the lease it already has (Try, Queue),
//     and a retried Release or Refresh is harmless.
//   - Refresh and Release act only while the server still records this
//     owner (compare-and-expire, compare-and-delete).
//   - Tokens strictly increase each time the key is granted, for every
//     mode, while the backend keeps its data (see Fencing below).
//   - A call may be abandoned when its context ends: the engine does not
//     wait for a backend that ignores contexts, and undoes the attempt
//     later (Lease.Release of a late grant, Aborter.Abort of an attempt
//     whose outcome is unknown).
//
// # Modes
//
// A Request has a Mode: Exclusive (one holder), Shared (any number of
// Shared holders, no Exclusive one: a read lock) or Limited (at most
// Request.Limit Limited holders: a semaphore). A backend states what it
// supports in Spec; the engine refuses the rest with an error naming the
// mode before calling the driver, so a driver never silently turns a
// shared request into an exclusive one.
//
// The key's mode and, for Limited, its limit are those of its current
// holders. A request of another mode is refused like any request for a
// held key (a *dlock.NotAcquiredError). A Limited request whose Limit
// differs from the current holders' is an error wrapping
// dlock.ErrLimitMismatch that names both limits: two callers that
// disagree on the size of a semaphore must not silently share it as two
// different ones. Once the last holder is gone, the next grant sets the
// mode and limit afresh.
//
// # Writer preference
//
// A backend that offers Shared locks gives writers preference: once an
// Exclusive request is waiting for the key, new Shared requests are refused
// (with a *dlock.NotAcquiredError) until that writer has been granted the
// key, has given up, or has died, so a stream of overlapping readers cannot
// starve it. Queueing backends (Queuer) get this from their FIFO queue: a
// reader queued behind a writer waits for it. Others record the writer's
// intent: every attempt of one blocking Acquire carries the same
// Request.Waiter, and a refused Exclusive attempt registers that id as a
// waiting writer on the key, with an expiry of its own no later than the
// attempt's TTL after the attempt, renewed by each later attempt (the
// engine attempts at least every TTL/3 while it waits). The registration
// ends when the waiter is granted the key, when the engine calls
// Leaver.Leave (the Acquire ended without the key) or when it expires (the
// waiting process died): a dead writer keeps readers out for at most one
// TTL. A Shared request refused because a writer waits should name it
// among the NotAcquiredError's holders, as a dlock.Holder without an owner
// whose Mode is Exclusive and whose TTL is the time left on the
// registration (memlock, filelock), so that a caller is not told "refused"
// with nobody named.
//
// # Fencing
//
// Each grant, whatever its mode, takes the next token of the key's single
// counter. So an Exclusive holder's token is above every earlier holder's,
// shared or not, and guards can fence writers against everyone who held
// the key before. Shared and Limited holders overlap, so their tokens order
// their grants but not their operations: a guard checks their fences
// against the highest exclusive fence it accepted without recording them
// (see dlock.Fence).
package driver

import (
	"context"
	"time"
)

// Mode is how a request shares its key. Its values equal dlock.Mode's.
type Mode uint8

const (
	// Exclusive: one holder at a time (the default).
	Exclusive Mode = iota
	// Shared: any number of Shared holders and no Exclusive one.
	Shared
	// Limited: at most Request.Limit Limited holders.
	Limited
)

// String returns "exclusive", "shared" or "limited".
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	case Limited:
		return "limited"
	}
	return "mode(" + itoa(int(m)) + ")"
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// Spec describes a driver to the engine. It is read once, by
// dlock.NewEngine.
type Spec struct {
	// Name labels the backend in errors and Observer events ("redis",
	// "etcd", "file", ...).
	Name string
	// MinTTL is the shortest lease the backend accepts. Zero means
	// dlock.MinTTL.
	MinTTL time.Duration
	// Shared and Limited say which modes besides Exclusive the driver
	// implements.
	Shared, Limited bool
	// OptionPackage is the import path of the package whose options
	// (Setting) the backend's New applies; dlock.NewEngine refuses an
	// option of any other package but the core's. Empty means the package
	// that defines the driver's type, which is right unless the backend
	// keeps its driver type and its options in different packages.
	OptionPackage string
}

// Driver is one lock service. Try is its only required method; the
// optional capabilities below are discovered by type assertion.
type Driver interface {
	Spec() Spec
	// Try makes one attempt to take req.Key for req.Owner. When the key is
	// held it returns a *dlock.NotAcquiredError naming the holders (and
	// the time left on their leases where known). An attempt that failed
	// without observing a holder and without leaving anything behind, and
	// may succeed if repeated, returns an error wrapping
	// dlock.ErrTransient. Any other error ends Acquire, and the engine
	// calls Aborter.Abort in case the attempt took effect after all.
	Try(ctx context.Context, req *Request) (Grant, error)
}

// Request is one acquisition attempt. The engine validates it before the
// driver sees it: the key is 1..dlock.MaxKeyLen bytes of UTF-8 without NUL,
// the TTL within [Spec.MinTTL, dlock.MaxTTL] in whole milliseconds, the
// metadata within dlock.MaxMetadataLen, the mode one the Spec admits.
type Request struct {
	Key string
	// Owner is a fresh random 128-bit id (32 hex digits) for every
	// attempt, so a later attempt never touches an earlier one's lease.
	Owner string
	// TTL is the requested lease length.
	TTL time.Duration
	// Metadata is stored with the lease and shown to other clients. Never
	// nil; the driver must not modify it.
	Metadata map[string]string
	// Mode and, for Limited, Limit (>= 1) say how the key is shared.
	Mode  Mode
	Limit int
	// WaitID identifies a waiting Acquire across its attempts, once its
	// subscription has one (see WaitIDer); empty otherwise. A backend may
	// queue it so that a release wakes this waiter alone.
	WaitID string
	// Waiter identifies the blocking Acquire this attempt belongs to: a
	// random id, the same for all its attempts, set from the first; empty
	// for TryAcquire. A driver that records waiting writers (see Writer
	// preference) registers a refused Exclusive attempt under it.
	Waiter string
	// Attempt numbers the attempts of one acquisition from 1. Nothing
	// from an earlier attempt (a registration, a queue entry) can exist
	// for the first, which lets a driver try a cheaper request then.
	Attempt int
}

// Grant is what a driver returns for a successful attempt.
type Grant struct {
	Lease Lease
	// Token is the fencing token of this acquisition (never 0).
	Token uint64
	// TTL is the effective lease length, when the server's differs from
	// the request's (etcd rounds up to whole seconds; a ZooKeeper session
	// has its own timeout). Zero means Request.TTL. The engine renews with
	// and counts the local deadline from the effective length.
	TTL time.Duration
	// Start, if set, is when the request that began the lease's current
	// validity was sent: before the attempt for a backend that reuses a
	// lease, or during it for a queued attempt whose lease was renewed
	// while it waited. It must never be later than that request's send
	// time (the engine counts the local deadline from it; a Start after
	// the grant arrived is ignored). Zero means the start of the attempt.
	Start time.Time
	// EndsWithClient says the lease ends as soon as the client that holds
	// it closes its connection or session, not only when it expires or is
	// released (a ZooKeeper ephemeral node goes with its session): a
	// holder's clean exit frees the key at once. dlock.RunOnce refuses an
	// atLeastFor on such a lease.
	EndsWithClient bool
	// Linger, when longer than the TTL, is the longest the server may
	// keep the lease after its holder died without releasing it, counted
	// from its death (a ZooKeeper session outlives its client's last
	// message by the session timeout, rounded up to the server's tick).
	// Zero means the TTL: the lease ends at most a TTL after its last
	// renewal. dlock.RunOnce refuses an atMostFor below it.
	Linger time.Duration
}

// Lease is the server-side half of a held lock. Both methods must be safe
// to call more than once and concurrently.
type Lease interface {
	// Refresh extends the lease to ttl from the moment the request is sent,
	// only if it is still held by this owner (compare-and-expire). It
	// returns an error wrapping dlock.ErrNotHeld when the server no longer
	// holds it for this owner; any other error is treated as transient.
	Refresh(ctx context.Context, ttl time.Duration) error
	// Release removes the lease only if it is still this owner's
	// (compare-and-delete) and wakes waiters. A lease that is no longer
	// held returns an error wrapping dlock.ErrNotHeld and nothing changes.
	Release(ctx context.Context) error
}

// Renewal is one lease due for renewal, with the TTL to set.
type Renewal struct {
	Lease Lease
	TTL   time.Duration
}

// BatchRenewer is implemented by drivers that renew many leases in one
// round trip (a Redis pipeline, one SQL statement). RefreshBatch calls
// done(i, err) once for each renewal, as soon as its outcome is known (a
// driver that talks to several servers reports each server's renewals when
// that server answers, so a hung one delays only its own), from any
// goroutine, before it returns; err has the same meaning as for
// Lease.Refresh. A renewal without a report counts as failed.
type BatchRenewer interface {
	RefreshBatch(ctx context.Context, rs []Renewal, done func(i int, err error))
}

// Watcher is implemented by drivers that can notify waiters of a release.
// Acquire subscribes before its next attempt, so a release that happens
// between the attempt and the wait still wakes it.
type Watcher interface {
	// Watch starts listening for releases of key. The returned
	// subscription's channel receives (without blocking the sender) when
	// the key may have become free. An error makes Acquire fall back to
	// polling.
	Watch(ctx context.Context, key string) (Subscription, error)
}

// ReadyWatcher is implemented by Watchers that may hold a subscription for
// key that is listening already (one a finished wait of the same key
// left behind): Ready hands it over without network I/O, or returns nil.
// A blocking Acquire asks before its first attempt, so that this attempt
// already carries the WaitID and is queued if refused: a contended
// Acquire then costs one attempt and a wake-up, not an attempt, a
// SUBSCRIBE and a second attempt.
type ReadyWatcher interface {
	Ready(key string) Subscription
}

// Subscription is a live interest in a key's release.
type Subscription interface {
	C() <-chan struct{}
	Close()
}

// WaitIDer is implemented by subscriptions that name their waiter: the
// driver wakes waiters one at a time by that id, and Acquire passes it to
// every later attempt in Request.WaitID.
type WaitIDer interface {
	WaitID() string
}

// Queuer is implemented by drivers with a server-side FIFO queue (etcd,
// ZooKeeper). A blocking Acquire calls Queue instead of polling Try: the
// driver enqueues req and waits for its turn itself, watching only its
// predecessor, and removes its queue entry if ctx ends first (returning the
// context's error or a *dlock.NotAcquiredError). TryAcquire still uses Try.
type Queuer interface {
	Queue(ctx context.Context, req *Request) (Grant, error)
}

// Leaver is implemented by drivers that record waiters under
// Request.Waiter (writer preference without a queue). When a blocking
// Acquire whose attempts carried waiter ends without the key (its context
// ended, or an attempt failed), the engine calls Leave in the background,
// with its own bounded context, so that a writer that gave up stops
// keeping readers out at once instead of at its registration's expiry.
// Leave must be harmless for an unknown waiter.
type Leaver interface {
	Leave(ctx context.Context, key, waiter string) error
}

// Aborter is implemented by drivers that can undo an attempt whose outcome
// is unknown (the reply was lost or the context ended mid-request): it
// removes req.Owner's lease on req.Key if one was granted.
type Aborter interface {
	Abort(ctx context.Context, req *Request) error
}

// LossNotifier is implemented by leases whose backend can notice a loss on
// its own (a session expiring, a watch on the key). The engine calls Bind
// once, when the lock is handed out, with a function the backend calls,
// from any goroutine, when the lease is known or suspected to be lost
// (cause wrapping dlock.ErrNotHeld when the server says it is gone). The
// returned stop function (may be nil) is called once when the lock ends,
// released or lost; it must not block.
type LossNotifier interface {
	Bind(lose func(cause error)) (stop func())
}

// Settler is implemented by leases whose Release succeeds before every
// server has answered (a quorum): Settle waits, within ctx (the caller's
// own, which may be shorter than the Release's), for the servers that had
// not answered when Release returned, so that the caller can see the
// lease gone everywhere it could. The engine calls it after a successful
// Release, from every caller waiting for that release; it must be safe
// to call concurrently and more than once, must not block past ctx, and
// has no result: it can never turn a release into a failure.
type Settler interface {
	Settle(ctx context.Context)
}
