// Package dlockprom exports dlock's Events as Prometheus metrics. Its
// Observer implements dlock.Observer; pass it to any backend with
// dlock.WithObserver:
//
//	obs, err := dlockprom.New(prometheus.DefaultRegisterer)
//	if err != nil { ... }
//	locker := redislock.New(client, dlock.WithObserver(obs))
//
// # Metrics
//
// All in the namespace dlock, labelled by backend (the backend's name:
// "redis", "memory", ...) and key_class:
//
//   - dlock_acquire_duration_seconds histogram {result}: time from an
//     Acquire or TryAcquire call to its return.
//   - dlock_acquire_total counter {result="acquired|contended|timeout|error"}.
//   - dlock_hold_duration_seconds histogram: time a lock was held, observed
//     once per lock when it is released or lost.
//   - dlock_locks_held gauge: locks acquired through an observed Locker and
//     not yet released or lost.
//   - dlock_waiters gauge: Acquire and TryAcquire calls in progress.
//   - dlock_renew_total counter {result="ok|error|refused"}.
//   - dlock_lost_total counter {reason="deadline|not_held|hold_cap|backend"}.
//   - dlock_fencing_rejected_total counter: stale fences refused by a guard
//     built with dlock.WithObserver(obs) (key_class is computed from the
//     guard's resource name).
//
// # Cardinality
//
// Raw keys are never used as label values. By default every key falls in
// the single class "all". WithKeyClass sets a function mapping a key to its
// class ("invoice:123" to "invoice", say); it must return a small, fixed
// set of values, since every distinct value creates a time series per
// metric and label combination. The series count is about
// backends × key classes × (4 results × 2 + 3 renew results + 4 reasons + 4).
//
// # Guarantees
//
//   - Observe never blocks on I/O and never panics: it takes only a short
//     internal mutex; a panicking key-class function is recovered and its
//     key counted in the class "unknown".
//   - dlock_locks_held never goes below zero for one lock: a lock is
//     counted down once, on the first of its EventLost and EventRelease,
//     and only if its acquisition was observed. Its hold time is observed
//     once, at the same moment.
//   - New never panics: a nil Registerer or a registration conflict (the
//     same metrics already registered, by a second New on the same
//     Registerer for example) is returned as an error, and nothing stays
//     registered on failure.
//
// # Not guaranteed
//
//   - dlock_waiters and dlock_locks_held count only what the Observer saw:
//     an Observer attached to a Locker after locks were taken does not count
//     those locks, and locks of other processes are not counted at all (a
//     sum across instances gives the fleet's view).
//   - A lock that is neither released nor lost (leaked by its holder) stays
//     counted in dlock_locks_held and keeps a small entry in the Observer's
//     memory.
//   - Histograms use fixed buckets (WithBuckets changes them); quantiles
//     computed from them are approximations.
package dlockprom
