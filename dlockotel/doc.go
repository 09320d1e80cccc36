// Package dlockotel traces dlock's locks with OpenTelemetry. Wrap any
// backend's Locker:
//
//	locker := dlockotel.Wrap(redislock.New(client)) // the global TracerProvider
//	lk, err := locker.Acquire(ctx, "invoice:42")   // a span under ctx's span
//
// Everything that takes a dlock.Locker (dlock.Do, WithLock, RunOnce,
// AcquireAll) is traced by passing it the wrapped Locker.
//
// # Spans
//
// "dlock.acquire", one per Acquire or TryAcquire, child of the span in the
// call's context, from the call to its return. Attributes: dlock.operation
// ("acquire" or "try_acquire"), dlock.key_class, dlock.backend,
// dlock.mode, dlock.attempts, dlock.wait_ms, dlock.result ("acquired",
// "contended", "timeout", "error") and, when acquired, dlock.token and
// dlock.owner. Its status is Error for the results timeout (the wait
// ended: WithWait, the context's deadline or cancellation) and error (bad
// input, a backend failure), with dlock.error and error.type; it stays
// Unset for "contended": a TryAcquire that finds the key held got an
// answer, which is the point of a TryAcquire (RunOnce's other replicas
// skip a run that way every time). The context the backend is called with
// carries this span, so a client library's own spans nest under it.
//
// "dlock.hold", one per acquired Lock, from its acquisition (where the
// acquire span ends) to its release or loss. It is a child of the same
// span as the acquire span (its sibling, following it) and links to the
// acquire span. Attributes: dlock.key_class, dlock.backend, dlock.mode,
// dlock.token, dlock.owner; at its end dlock.end ("released" or "lost"),
// dlock.held_ms, dlock.renewals (successful renewals) and, when lost,
// dlock.loss_reason. Span events: "renew_failed" (dlock.result "error" or
// "refused", dlock.error, error.type) for each renewal that failed,
// "lock_lost" (dlock.loss_reason, dlock.held_ms, dlock.error) and
// "released" (dlock.held_ms; dlock.error when the server-side release
// failed). Its status is Error when the lock was lost or its release
// failed.
//
// # Keys
//
// Keys may hold names or ids that must not leave the process, so by
// default spans carry only dlock.key_class ("all" unless WithKeyClass maps
// keys to classes) and error texts are reduced to their kind ("dlock:
// lock not acquired: context deadline exceeded"); dlock's error messages
// quote the key. WithRawKey adds the dlock.key attribute and full error
// texts.
//
// # Guarantees
//
//   - A wrapped Locker behaves as the Locker it wraps: the same Locks,
//     errors and options; tracing adds one dlock.WithCallObserver option
//     to each call and never changes an outcome. A panic in the tracing
//     (a TracerProvider's, a key-class function's) is recovered: a
//     panicking key-class function gives the class "unknown".
//   - Every call with a non-nil context ends its acquire span before it
//     returns. Every Lock it returns has one hold span, ended exactly once,
//     at the first of its release and its loss (dlock reports only the
//     first), including a loss that happens while the Lock is being
//     handed out.
//   - The acquire span is a child of the caller's span, and the hold span
//     a child of the same span, whatever the caller does with its context
//     afterwards (the hold span keeps only the parent's span context).
//   - No goroutine, timer or background work of its own: spans are
//     started and ended on the goroutines that report the Events.
//
// # Not guaranteed
//
//   - A Lock that is never released and never lost (leaked by its holder,
//     or held at process exit) leaves its hold span unended, so it is
//     never exported.
//   - Span events and ends reported by dlock's watchdog (renewal failures,
//     losses) run on the watchdog's goroutine: with a synchronous span
//     processor (sdktrace.WithSyncer) a slow exporter there delays the
//     Events of other locks of the same Locker (never their Lost()). Use
//     a batching processor (sdktrace.WithBatcher), as in production.
//   - A Locker not built on dlock.Engine (a user's own implementation)
//     reports no Events: its acquire spans get their result and wait from
//     the call's outcome, and no hold span is made.
//   - A call with a nil context makes no span (the Locker refuses it).
//     List and Break, of a Locker that is a dlock.Lister or dlock.Breaker,
//     are passed through untraced (dlock.Break works on a wrapped Locker).
//   - Tokens are recorded as int64: no backend issues one above 2^63-1.
package dlockotel
