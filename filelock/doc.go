// Package filelock is a dlock backend kept in a directory on one host: the
// zero-set-up default of the dlock CLI. It has the lease semantics of every
// other backend (TTL, renewal by the core watchdog, expiry when the holder
// stops renewing, owner-checked refresh and release, fencing tokens) and
// needs nothing but a writable directory.
//
//	l, err := filelock.New("/var/lib/myapp/locks")
//	...
//	err = dlock.Do(ctx, l, "nightly-report", func(ctx context.Context, lk *dlock.Lock) error { ... })
//
// # Guarantees
//
// Mutual exclusion between all goroutines and processes on one host that
// use Lockers on the same directory, on a local filesystem: at any wall-clock
// instant at most one unexpired lease exists per key, and a holder that
// watches Lock.Lost() stops before its lease can expire (the core's local,
// monotonic deadline ends before the recorded expiry).
//
// Fencing tokens of a key strictly increase with each acquisition, across
// releases, expiries, Locker instances and process restarts, and across
// crashes and power loss, for as long as the directory survives. Use them
// with a guard; Guard is one whose state lives in the directory too.
//
// A holder that crashes (or is killed, or hangs) keeps others out for at
// most one TTL.
//
// # Not guaranteed
//
//   - Anything across hosts, or on network filesystems (NFS, SMB, FUSE
//     mounts of remote storage): flock(2) and rename(2) semantics there
//     vary, and hosts do not share a clock. Use a network backend.
//   - Leases are measured by the host's wall clock (CLOCK_REALTIME), because
//     processes do not share Go's monotonic clock. A wall-clock step
//     forwards (NTP step, manual change) can end leases early, so another
//     process may acquire while the holder still believes it holds the
//     lock; a step backwards lengthens leases, including those of crashed
//     holders. The holder's own local deadline is monotonic: it still
//     closes Lost() on time on the holder's side. Fencing tokens stay
//     correct in both cases.
//   - Exclusion against programs that edit the directory's files by other
//     means than this package.
//   - Directories shared between containers work only when they are the
//     same filesystem object and the containers see the same wall clock.
//   - Sharing a directory between users: files are created 0600, so every
//     process using a directory should run as the same user.
//   - Durability of releases and renewals: only acquisitions fsync the
//     directory. After a power loss a released lease can reappear until its
//     recorded expiry (at most one TTL), and a renewal can be forgotten
//     (the lease then ends at its previous expiry). Neither affects
//     exclusion or token order.
//
// # Storage
//
// For each key, with id = the first 32 hex digits (128 bits) of SHA-256(key):
//
//   - <dir>/<id>.lease: the lease record, JSON
//     {"key","owner","token","expires_unix_nano","metadata","counter"}.
//     It is only ever replaced whole: written to <id>.lease.tmp, fsynced and
//     renamed over the record, so readers and crashes see the old or the
//     new record, never a torn one. Acquisitions also fsync the directory,
//     making the new counter durable before the token is handed out.
//     After a release or expiry the record keeps key and counter (the
//     highest token ever issued); the next acquisition gets counter+1.
//   - <dir>/<id>.flock: an empty file on which every read-modify-write of
//     the record (acquire, refresh, release, abort, Expire) takes an
//     exclusive flock(2). The wait is non-blocking attempts with short
//     jittered sleeps (50µs doubling to 5ms), so it always honours the
//     caller's context; goroutines of one process queue on an in-process
//     semaphore first, so only one of them polls the flock at a time.
//
// A Guard on the directory adds <id>.fence, <id>.fence.flock and, for the
// values it keeps, <id>.data files (see Guard), written with the same
// discipline.
//
// Reading a record needs no flock (List, and the fast path of a TryAcquire
// on a held key). Files are created 0600 and the directory 0700 when New
// creates it. A key's two files stay after its last release, by design:
// deleting the record would restart its tokens, and deleting a flock file
// while someone waits on it would split the lock. Removing a directory is
// safe only when no process uses it; doing so restarts every key's tokens.
// A record that cannot be decoded (edited by hand, say) makes its key fail
// with an error naming the file rather than silently restarting tokens;
// delete the file to reset the key.
//
// # Waiting
//
// Locker implements dlock.Watcher. A release, abort or Expire through any
// Locker of the process on the same directory wakes the process's waiters at
// once. On Linux an inotify watch on the directory, held only while someone
// in the process waits, wakes waiters when another process rewrites or
// removes the record. Every waiter also re-checks on a jittered timer every
// poll interval (WithPollInterval, default DefaultPollInterval), so a missed
// notification or an expiry (which writes nothing) delays it by at most
// that, and the core acquire loop additionally polls on its own backoff,
// capped by the time left on the holder's lease. Subscriptions own no
// goroutine; the inotify reader is stopped when the last waiter leaves.
//
// # Portability
//
// flock(2) and rename(2) are used through package syscall: the package
// builds on Linux and the BSD-derived systems (macOS), with inotify only on
// Linux (elsewhere waiters poll). It does not build on Windows.
package filelock
