// Package filelock is a dlock backend kept in a directory on one host: the
// zero-set-up default of the dlock CLI. It has the lease semantics of every
// other backend (TTL, renewal by the core watchdog, expiry when the holder
// stops renewing, owner-checked refresh and release, fencing tokens), offers
// every mode (exclusive, shared read locks with dlock.WithShared, semaphores
// with dlock.WithLimit) and needs nothing but a writable directory.
//
//	l, err := filelock.New("/var/lib/myapp/locks")
//	...
//	err = dlock.Do(ctx, l, "nightly-report", func(ctx context.Context, lk *dlock.Lock) error { ... })
//
// docs/filelock.md describes the files in the directory, the record format
// and its rule across versions, writer preference, how breaks reach a
// holder and how waiters are woken.
//
// # Guarantees
//
//   - Mutual exclusion between all goroutines and processes on one host
//     that use Lockers on the same directory, on a local filesystem: at any
//     wall-clock instant a key has one unexpired exclusive lease, or any
//     number of shared ones, or at most N limited ones (WithLimit(N)), and
//     a holder that watches Lock.Lost() stops before its lease can expire.
//     Modes do not mix (*dlock.NotAcquiredError naming the holders); a
//     WithLimit request whose limit differs from the holders' fails with
//     dlock.ErrLimitMismatch. The next grant after the last holder sets the
//     mode and limit afresh.
//   - Every shared or limited holder is a lease of its own: refresh, release
//     and abort are owner-checked per holder, and one holder's renewals
//     never extend another's lease.
//   - Fencing tokens of a key strictly increase with each acquisition, in
//     every mode (one counter per key), across releases, expiries, Locker
//     instances, process restarts, crashes and power loss, while the
//     directory survives. Guard keeps its fences in the directory too.
//   - A holder that crashes, is killed or hangs keeps others out for at
//     most one TTL after its last renewal, in every mode.
//   - A lock held for more than 100 ms learns at once that its lease was
//     removed by a Break or Expire through a Locker of this process or, with
//     inotify (Linux), by any process's write of its record.
//   - Writers have preference (driver: Writer preference): a blocking
//     exclusive Acquire that is refused registers as a waiting writer, and
//     while a registration is live new shared requests are refused, even on
//     a free key. It ends when the writer is granted the key or gives up,
//     or lapses one TTL after its last attempt (a dead writer process).
//     TryAcquire and limited requests do not register.
//   - A record that cannot be decoded fails its key with an error naming
//     the file, rather than restarting its tokens.
//
// # Not guaranteed
//
//   - Fair or FIFO order: there is no queue; a release wakes every waiter
//     and the first to take the record's flock wins. Waiting writers are
//     served in no particular order, and readers kept out by them wait as
//     long as writers keep coming. List reports Waiters as -1.
//   - Writer preference against processes of versions without shared locks.
//   - A break told at once to a holder without inotify (WithInotify(false),
//     or not Linux), when another process broke it: it learns at its next
//     renewal.
//   - Anything across hosts, or on network filesystems (NFS, SMB, FUSE).
//   - Lease lengths under wall-clock steps: leases are measured by
//     CLOCK_REALTIME. A step forwards can end leases early (another process
//     may acquire while the holder believes it holds), a step backwards
//     lengthens them. The holder's own deadline is monotonic, and fencing
//     tokens stay correct.
//   - Exclusion against programs that edit the directory's files by other
//     means than this package.
//   - Containers sharing a directory, unless it is the same filesystem
//     object and they see the same wall clock.
//   - Sharing a directory between users: files are created 0600.
//   - Durability of releases, renewals and registrations: only acquisitions
//     fsync the directory. After a power loss a released lease can reappear
//     until its recorded expiry, and a renewal or registration can be
//     forgotten; exclusion and token order are unaffected.
//   - Progress past a process stopped (SIGSTOP, a frozen VM) in the middle
//     of a record update: it holds the key's flock, so other processes'
//     calls on that key wait, up to their contexts, until it continues or
//     dies. Stopped between updates, its lease runs out as usual.
//   - Tokens after the directory or a key's record is removed: they restart.
//
// # Portability
//
// flock(2) and rename(2) through package syscall: Linux and the BSD-derived
// systems (macOS), with inotify only on Linux (elsewhere waiters poll). It
// does not build on Windows.
package filelock
