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
// # Alerts and dashboard
//
// The module's directory ships two files to load as they are:
//
//   - alerts.yml: Prometheus alerting rules (rule_files in prometheus.yml).
//     DlockAcquireSlow: acquire latency p99 over half the TTL;
//     DlockContentionHigh: over 30 % of acquisitions did not get the lock
//     (results contended and timeout); DlockRenewalsFailing: over 5 % of
//     lease renewals failed; DlockAcquireTimeouts: over 5 % timeouts — each held
//     10 minutes, severity warning. DlockFencingRejected (critical) and
//     DlockLockLost (warning) fire at once on any increase, also on the
//     first one of a process (a counter series created by it).
//     The TTL is not a metric: the recording rule dlock:lock_ttl_seconds
//     holds it, 30 s (dlock.DefaultTTL); edit it to your TTL.
//     alerts_test.yml holds promtool unit tests of the rules
//     (promtool test rules alerts_test.yml).
//   - dashboard.json: a Grafana dashboard (import it; schemaVersion 39)
//     with a data source variable and backend and key_class filters:
//     contention by key class, acquisitions by result, acquire latency and
//     hold time p50/p99, a hold-time heatmap, waiters, locks held, renewal
//     failures, losses by reason and fencing rejections.
//
// The module's tests check both files against a scrape of real metrics:
// every metric, label and label value they use is one the Observer
// exports.
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
