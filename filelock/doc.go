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
// # Guarantees
//
// Mutual exclusion between all goroutines and processes on one host that
// use Lockers on the same directory, on a local filesystem: at any wall-clock
// instant a key has either one unexpired exclusive lease, or any number of
// unexpired shared ones, or at most N unexpired limited ones (WithLimit(N)),
// and a holder that watches Lock.Lost() stops before its lease can expire
// (the core's local, monotonic deadline ends before the recorded expiry).
// Modes do not mix: a request of another mode than the current holders' is
// refused (*dlock.NotAcquiredError naming them), and a WithLimit request
// whose limit differs from the current holders' fails with an error
// wrapping dlock.ErrLimitMismatch that names both limits. Once the last
// holder is gone the next grant sets the mode and limit afresh.
//
// Every shared or limited holder is a lease of its own (own owner, token,
// expiry and Lost()): refresh, release and abort are owner-checked per
// holder, and one holder's renewals never extend another's lease.
//
// Fencing tokens of a key strictly increase with each acquisition, in every
// mode (one counter per key: a writer's token is above every earlier
// reader's, writer's and permit's), across releases, expiries, Locker
// instances and process restarts, and across crashes and power loss, for
// as long as the directory survives. Use them with a guard; Guard is one
// whose state lives in the directory too.
//
// A holder that crashes (or is killed, or hangs) keeps others out for at
// most one TTL after its last renewal, in every mode: a crashed reader's
// lease or a crashed permit holder's permit ends at its own expiry.
//
// A holder learns at once that its lease was removed behind its back: a
// lock held for more than 100 ms has its Locker read the key's record
// whenever a Break or Expire through a Locker of this process, or (with
// inotify, on Linux) any process's write of the record, touches the key
// (one read for all the Locker's holders of the key, at most every 50
// ms), and its Lost() closes when the record no longer lists it. Without
// inotify, a removal by another process is found by the next renewal.
//
// Writers have preference over readers (driver: Writer preference). A
// blocking exclusive Acquire refused by the key's holders registers itself
// as a waiting writer of the key, and while a registration is live new
// shared requests are refused, also on a key that has just become free,
// so overlapping readers cannot starve a writer. The registration ends when
// that writer is granted the key, when its Acquire ends without the key
// (the core calls Leave, which removes it at once), or when it lapses:
// it expires one TTL after the attempt that last renewed it (each attempt
// renews it once it is past half its length, and the core attempts at
// least every TTL/3), so a writer process that dies keeps readers out for
// at most one TTL after its last attempt. TryAcquire does not register.
// Limited requests ignore registrations (they conflict with exclusive
// holders anyway).
//
// # Not guaranteed
//
//   - Fair or FIFO order. There is no queue: a release wakes every waiter
//     (in-process at once, in other processes through inotify or their
//     poll), and the first attempt to take the record's flock wins. Waiting
//     writers are served in no particular order, a writer's TryAcquire may
//     overtake a waiting writer, and readers kept out by waiting writers
//     can wait for as long as writers keep coming. List reports Waiters as
//     -1.
//   - Writer preference against processes of a version before shared
//     locks: their waiting writers do not register (see Storage).
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
//   - Durability of releases, renewals and waiting writers' registrations:
//     only acquisitions fsync the directory (and registrations are not
//     fsynced at all). After a power loss a released
//     lease can reappear until its recorded expiry (at most one TTL), and a
//     renewal or a registration can be forgotten (the lease then ends at
//     its previous expiry; the writer registers again at its next
//     attempt). None of this affects exclusion or token order.
//   - Progress past a process stopped (SIGSTOP, a frozen VM) in the middle
//     of one of its record updates: the update holds the key's flock, so
//     every other process's calls on that key wait (up to their contexts)
//     until it continues or dies. Stopped between updates, as nearly all
//     of a holder's time is, its lease runs out as usual.
//
// # Storage
//
// For each key, with id = the first 32 hex digits (128 bits) of SHA-256(key):
//
//   - <dir>/<id>.lease: the lease record, JSON
//     {"key","owner","token","expires_unix_nano","metadata","counter"},
//     plus, when used, "mode" ("shared" or "limited"), "limit" and
//     "holders" (a list of {"owner","token","expires_unix_nano","metadata"}).
//     An exclusive holder is stored in the top-level lease fields alone,
//     exactly as before shared locks existed. Shared and limited holders
//     are stored in "holders" with "mode" and "limit", and the top-level
//     lease fields then repeat the holder whose lease ends last: the
//     top-level lease always covers every holder. Expired holders are
//     dropped at the record's next write.
//     It is only ever replaced whole: written to <id>.lease.tmp, fsynced and
//     renamed over the record, so readers and crashes see the old or the
//     new record, never a torn one. Acquisitions also fsync the directory,
//     making the new counter durable before the token is handed out.
//     After a release or expiry the record keeps key and counter (the
//     highest token ever issued); the next acquisition gets counter+1.
//   - <dir>/<id>.writers: the waiting writers' registrations, JSON
//     {"key","writers":[{"waiter","expires_unix_nano"}]}, present only
//     while there are some (expired ones are dropped at its next write).
//     They live apart from the record because every contended blocking
//     exclusive Acquire registers: this file holds no counter, so it is
//     replaced by rename without any fsync, keeping a contended exclusive
//     lock as cheap as before writer preference. A writers file that is
//     missing, torn (after a power loss) or unreadable counts as no
//     registration, and a registration that cannot be written costs the
//     writer its preference, never its lock.
//   - <dir>/<id>.flock: an empty file on which every read-modify-write of
//     the record or the writers file (acquire, refresh, release, abort,
//     registration, Leave, Expire) takes an exclusive flock(2). The wait is non-blocking attempts with short
//     jittered sleeps (50µs doubling to 5ms), so it always honours the
//     caller's context; goroutines of one process queue on an in-process
//     semaphore first, so only one of them polls the flock at a time.
//
// Mixed versions (a rolling upgrade): versions before shared locks read
// the top-level lease fields only, so they see a shared or limited key as
// held (by the covering holder) until the last holder's lease ends, never
// as free, and tokens stay in one sequence (every version issues
// counter+1). Such a version cannot take shared locks and its waiting
// writers do not register. It rewrites a record only for its own
// exclusive lease, for a grant once every lease has expired, or for
// Expire (which drops every holder anyway), and never touches the writers
// file. This version reads a record whose "mode" it
// does not know, or whose fields do not fit together, as held by its
// top-level lease until that expires and then as free (keeping the
// counter), and never rewrites it before then (Expire excepted): the rule
// any later format must keep is that the top-level lease covers every
// holder.
//
// A Guard on the directory adds <id>.fence, <id>.fence.flock and, for the
// values it keeps, <id>.data files (see Guard), written with the same
// discipline.
//
// Reading a record needs no flock (List, and the fast path of an attempt
// refused without writing anything: a held key, a fresh registration). Files are created 0600 and the directory 0700 when New
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
// Locker implements dlock.Watcher. A release (of any one holder), abort,
// Expire or Leave through any Locker of the process on the same directory
// wakes the process's waiters at once. On Linux an inotify watch on the
// directory, held while someone in the process waits or holds a lock for
// more than 100 ms (which listens for breaks: see Guarantees), wakes
// waiters when another process rewrites or removes the record. Every waiter also re-checks on a jittered timer every
// poll interval (WithPollInterval, default DefaultPollInterval), so a missed
// notification or an expiry (which writes nothing) delays it by at most
// that, and the core acquire loop additionally polls on its own backoff,
// capped by the time left on the holders' leases (and, for a reader kept
// out by waiting writers, on their registrations). A waiting writer writes
// the writers file when it registers and when it renews the registration
// (about twice per TTL); inotify wakes other processes' waiters on those
// writes too (the one that matters is a registration's removal), each for
// one cheap unlocked read. A waiter's subscription owns no goroutine; a
// key held past 100 ms has one per Locker, reading the record at most
// every 50 ms. The inotify reader is stopped when the last subscription
// on the directory ends.
//
// # Portability
//
// flock(2) and rename(2) are used through package syscall: the package
// builds on Linux and the BSD-derived systems (macOS), with inotify only on
// Linux (elsewhere waiters poll). It does not build on Windows.
package filelock
