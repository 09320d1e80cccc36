// Package memlock is an in-process dlock.Locker for unit tests and hermetic
// examples, and the reference backend: read it first to see how a backend
// plugs into package dlock/driver. It has the same lease semantics as the
// network backends (TTL, watchdog renewal, local deadline, fencing tokens,
// owner-checked release, release notifications) and offers every mode:
// exclusive, shared (dlock.WithShared) and counted (dlock.WithLimit).
//
// Guarantees: within one Locker, at most one exclusive holder per key, or
// any number of shared holders, or at most N holders of a key locked with
// WithLimit(N); tokens strictly increase per key for as long as the Locker
// exists, in every mode.
//
// Writers have preference (driver: Writer preference): once an exclusive
// Acquire waits for a key, new shared requests are refused until it has
// the key or gives up, so overlapping readers cannot starve it.
//
// Not guaranteed: anything between processes (the state lives in one
// process), and FIFO order: a release wakes every waiter of the key and
// the first attempt to arrive wins.
package memlock
