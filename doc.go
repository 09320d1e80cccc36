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
// # Writing a backend
//
// A backend implements Backend (one acquisition attempt) and Lease
// (owner-checked refresh and release), optionally Watcher (release
// notifications), BatchRenewer (many renewals in one round trip), Aborter
// (undo an attempt whose reply was lost) and LossNotifier (report a loss it
// notices on its own). NewAcquirer turns that into a Locker with the common
// wait loop, watchdog and Lock handle; package dlocktest checks the result.
package dlock
