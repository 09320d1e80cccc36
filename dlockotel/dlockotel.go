package dlockotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/dlock-go/dlock/dlockotel"

// Span names.
const (
	SpanAcquire = "dlock.acquire"
	SpanHold    = "dlock.hold"
)

// Span event names on the hold span.
const (
	EventRenewFailed = "renew_failed"
	EventLockLost    = "lock_lost"
	EventReleased    = "released"
)

// Attribute keys.
const (
	AttrBackend    = attribute.Key("dlock.backend")     // the backend's name: "redis", "memory", ...
	AttrKeyClass   = attribute.Key("dlock.key_class")   // the key's class (WithKeyClass)
	AttrKey        = attribute.Key("dlock.key")         // the raw key, only with WithRawKey
	AttrOperation  = attribute.Key("dlock.operation")   // "acquire" or "try_acquire"
	AttrMode       = attribute.Key("dlock.mode")        // "exclusive", "shared", "limited"
	AttrAttempts   = attribute.Key("dlock.attempts")    // attempts sent to the backend
	AttrWaitMS     = attribute.Key("dlock.wait_ms")     // time from the call to its return, ms
	AttrResult     = attribute.Key("dlock.result")      // dlock.Result: acquired, contended, timeout, error; ok, refused, error for renewals
	AttrToken      = attribute.Key("dlock.token")       // the fencing token
	AttrOwner      = attribute.Key("dlock.owner")       // the holder's owner id
	AttrHeldMS     = attribute.Key("dlock.held_ms")     // time held, ms
	AttrRenewals   = attribute.Key("dlock.renewals")    // successful renewals during the hold
	AttrEnd        = attribute.Key("dlock.end")         // how the hold ended: "released" or "lost"
	AttrLossReason = attribute.Key("dlock.loss_reason") // dlock.LossReason
	AttrError      = attribute.Key("dlock.error")       // the error's text (redacted unless WithRawKey)
	AttrErrorType  = attribute.Key("error.type")        // a short, fixed class of the error
)

// DefaultKeyClass is the key class of every key when WithKeyClass is not
// used.
const DefaultKeyClass = "all"

// UnknownKeyClass is the key class of a key whose class function panicked
// or returned "".
const UnknownKeyClass = "unknown"

// Option configures Wrap.
type Option func(*config)

type config struct {
	tp       trace.TracerProvider
	keyClass func(string) string
	rawKey   bool
}

// WithTracerProvider sets the TracerProvider the spans are made with. The
// default, and what a nil tp keeps, is otel.GetTracerProvider() (the
// global one, also when it is set after Wrap).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp != nil {
			c.tp = tp
		}
	}
}

// WithKeyClass sets the function that maps a lock's key to its
// dlock.key_class attribute ("invoice:123" to "invoice", say). It is called
// once per Acquire or TryAcquire; it must be fast and must not block. A nil
// f keeps the default: every key in the class "all".
func WithKeyClass(f func(key string) string) Option {
	return func(c *config) {
		if f != nil {
			c.keyClass = f
		}
	}
}

// WithRawKey records the raw key as the dlock.key attribute and errors'
// full texts (which name the key) in span statuses and events. Without
// it, spans show only the key class and the kind of each error ("dlock:
// lock not acquired"), since keys may hold names or ids that must not
// reach a tracing backend.
func WithRawKey() Option {
	return func(c *config) { c.rawKey = true }
}

// Wrap returns a Locker that traces l's Acquire and TryAcquire calls and
// the Locks they return: a "dlock.acquire" span per call, child of the
// span in the call's context, and a "dlock.hold" span per acquired Lock,
// from its acquisition to its release or loss. It passes l the call's
// options plus dlock.WithCallObserver, and the context carrying the
// acquire span (so a client's own spans nest under it).
//
// The Locker returned implements dlock.Lister and dlock.Breaker when l
// does (List and Break, so dlock.Break, are passed through, untraced), and
// has an Unwrap() dlock.Locker method returning l.
// Wrap of a nil Locker returns one whose calls fail with an error wrapping
// dlock.ErrNilClient.
func Wrap(l dlock.Locker, opts ...Option) dlock.Locker {
	c := config{keyClass: func(string) string { return DefaultKeyClass }}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if l != nil && isNilPointer(l) {
		l = nil
	}
	w := &locker{inner: l, tracer: tracerOf(c.tp), keyClass: c.keyClass, rawKey: c.rawKey}
	ls, isLister := l.(dlock.Lister)
	br, isBreaker := l.(dlock.Breaker)
	switch {
	case isLister && isBreaker:
		return &listerBreaker{locker: w, ls: ls, br: br}
	case isLister:
		return &lister{locker: w, ls: ls}
	case isBreaker:
		return &breaker{locker: w, br: br}
	}
	return w
}

// tracerOf returns tp's Tracer; a TracerProvider that panics or returns
// nil gets a Tracer that records nothing (a tracing bug must not break
// the program that wraps its Locker).
func tracerOf(tp trace.TracerProvider) (t trace.Tracer) {
	defer func() {
		if recover() != nil || t == nil {
			t = noop.NewTracerProvider().Tracer(ScopeName)
		}
	}()
	return tp.Tracer(ScopeName)
}

// locker is Wrap's Locker.
type locker struct {
	inner    dlock.Locker // nil: every call fails
	tracer   trace.Tracer
	keyClass func(string) string
	rawKey   bool
}

// lister is Wrap's Locker over a dlock.Lister.
type lister struct {
	*locker
	ls dlock.Lister
}

// breaker is Wrap's Locker over a dlock.Breaker.
type breaker struct {
	*locker
	br dlock.Breaker
}

// listerBreaker is Wrap's Locker over a Locker that is both (every
// backend's).
type listerBreaker struct {
	*locker
	ls dlock.Lister
	br dlock.Breaker
}

var (
	_ dlock.Locker  = (*locker)(nil)
	_ dlock.Lister  = (*lister)(nil)
	_ dlock.Breaker = (*breaker)(nil)
	_ dlock.Lister  = (*listerBreaker)(nil)
	_ dlock.Breaker = (*listerBreaker)(nil)
)

// List implements dlock.Lister.
func (l *lister) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.ls.List(ctx, prefix)
}

// Break implements dlock.Breaker.
func (l *breaker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.br.Break(ctx, key, owner)
}

// List implements dlock.Lister.
func (l *listerBreaker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.ls.List(ctx, prefix)
}

// Break implements dlock.Breaker.
func (l *listerBreaker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.br.Break(ctx, key, owner)
}

// Unwrap returns the Locker given to Wrap (nil for a nil one).
func (w *locker) Unwrap() dlock.Locker { return w.inner }

var errNilLocker = fmt.Errorf("%w: dlockotel.Wrap of a nil Locker", dlock.ErrNilClient)

// Acquire implements dlock.Locker.
func (w *locker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return w.acquire(ctx, key, opts, true)
}

// TryAcquire implements dlock.Locker.
func (w *locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return w.acquire(ctx, key, opts, false)
}

func (w *locker) acquire(ctx context.Context, key string, opts []dlock.Option, wait bool) (*dlock.Lock, error) {
	switch {
	case w.inner == nil:
		return nil, errNilLocker
	case ctx == nil:
		// No span can be parented to a nil context: the Locker reports it.
		if wait {
			return w.inner.Acquire(ctx, key, opts...)
		}
		return w.inner.TryAcquire(ctx, key, opts...)
	}
	c := &call{w: w, parent: trace.SpanContextFromContext(ctx), keyClass: w.class(key)}
	if w.rawKey {
		c.key = key
	}
	op := "acquire"
	if !wait {
		op = "try_acquire"
	}
	start := time.Now()
	sctx, span := w.start(ctx, start, c.keyAttrs(AttrOperation.String(op)))
	c.span = span
	opts = append(opts[:len(opts):len(opts)], dlock.WithCallObserver(c))
	var (
		lk  *dlock.Lock
		err error
	)
	if wait {
		lk, err = w.inner.Acquire(sctx, key, opts...)
	} else {
		lk, err = w.inner.TryAcquire(sctx, key, opts...)
	}
	c.endAcquire(ctx, start, lk, err, wait)
	return lk, err
}

// start starts the acquire span. A Tracer that panics, or returns a nil
// span or context, gets the call a span that records nothing (or the
// caller's context), and the call goes on.
func (w *locker) start(ctx context.Context, at time.Time, attrs []attribute.KeyValue) (sctx context.Context, span trace.Span) {
	defer func() {
		if recover() != nil || span == nil {
			sctx, span = ctx, trace.SpanFromContext(context.Background())
		}
		if sctx == nil {
			sctx = ctx
		}
	}()
	return w.tracer.Start(ctx, SpanAcquire, trace.WithTimestamp(at), trace.WithAttributes(attrs...))
}

// class returns key's class: UnknownKeyClass when the class function
// panics or returns "".
func (w *locker) class(key string) (c string) {
	defer func() {
		if recover() != nil {
			c = UnknownKeyClass
		}
	}()
	if c = w.keyClass(key); c == "" {
		c = UnknownKeyClass
	}
	return c
}

// call is the dlock.Observer of one Acquire or TryAcquire (through
// dlock.WithCallObserver): it receives the call's Events, on the caller's
// goroutine, then the Lock's, on whichever goroutine renews, loses or
// releases it.
type call struct {
	w        *locker
	parent   trace.SpanContext // the caller's span: the hold span's parent
	keyClass string
	key      string // "" unless WithRawKey
	span     trace.Span

	mu       sync.Mutex
	acq      dlock.Event // the EventAcquire, once seen
	haveAcq  bool
	hold     trace.Span // nil until acquired, and once ended
	held     time.Time  // when the hold span started
	renewals int
	// early is an EventLost or EventRelease seen before the EventAcquire.
	// dlock reports a Lock's Events after its EventAcquire (a Lock lost
	// while the call reported it is reported right after), so this is a
	// defence for Lockers that do not: it is applied to the hold span if
	// it is the acquired Lock's.
	early *dlock.Event
}

// keyAttrs returns the key's attributes followed by more.
func (c *call) keyAttrs(more ...attribute.KeyValue) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, 2+len(more))
	a = append(a, AttrKeyClass.String(c.keyClass))
	if c.key != "" {
		a = append(a, AttrKey.String(c.key))
	}
	return append(a, more...)
}

// Observe implements dlock.Observer.
func (c *call) Observe(e dlock.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch e.Kind {
	case dlock.EventAcquire:
		c.acq, c.haveAcq = e, true
		if e.Result != dlock.ResultAcquired {
			return
		}
		c.held = time.Now()
		_, c.hold = c.w.tracer.Start(trace.ContextWithSpanContext(context.Background(), c.parent), SpanHold,
			trace.WithTimestamp(c.held),
			trace.WithLinks(trace.Link{SpanContext: c.span.SpanContext()}),
			trace.WithAttributes(c.keyAttrs(
				AttrBackend.String(e.Backend),
				AttrMode.String(e.Mode.String()),
				AttrToken.Int64(int64(e.Token)),
				AttrOwner.String(e.Owner),
			)...))
		if early := c.early; early != nil {
			c.early = nil
			if early.Token == e.Token && early.Owner == e.Owner {
				c.endHoldLocked(*early)
			}
		}
	case dlock.EventRenew:
		if c.hold == nil || !c.ours(e) {
			return
		}
		if e.Result == dlock.ResultOK {
			c.renewals++
			return
		}
		attrs := []attribute.KeyValue{AttrResult.String(string(e.Result))}
		c.hold.AddEvent(EventRenewFailed, trace.WithAttributes(append(attrs, c.w.errAttrs(e.Err)...)...))
	case dlock.EventLost, dlock.EventRelease:
		switch {
		case !c.haveAcq:
			ev := e
			c.early = &ev
		case c.hold != nil && c.ours(e):
			c.endHoldLocked(e)
		}
	}
}

// ours reports whether e is about the acquired Lock. c.mu held.
func (c *call) ours(e dlock.Event) bool {
	return c.haveAcq && e.Token == c.acq.Token && e.Owner == c.acq.Owner
}

// endHoldLocked ends the hold span with e, an EventLost or EventRelease.
// c.mu held.
func (c *call) endHoldLocked(e dlock.Event) {
	now := time.Now()
	held := AttrHeldMS.Float64(ms(e.Held))
	attrs := []attribute.KeyValue{held, AttrRenewals.Int(c.renewals)}
	if e.Kind == dlock.EventLost {
		c.hold.AddEvent(EventLockLost, trace.WithTimestamp(now), trace.WithAttributes(append([]attribute.KeyValue{AttrLossReason.String(string(e.Reason)), held}, c.w.errAttrs(e.Err)...)...))
		attrs = append(attrs, AttrEnd.String("lost"), AttrLossReason.String(string(e.Reason)))
		c.hold.SetStatus(codes.Error, "dlock: lock lost: "+string(e.Reason))
	} else {
		ev := []attribute.KeyValue{held}
		if e.Err != nil {
			ev = append(ev, c.w.errAttrs(e.Err)...)
			c.hold.SetStatus(codes.Error, c.w.errText(e.Err))
		}
		c.hold.AddEvent(EventReleased, trace.WithTimestamp(now), trace.WithAttributes(ev...))
		attrs = append(attrs, AttrEnd.String("released"))
	}
	c.hold.SetAttributes(attrs...)
	c.hold.End(trace.WithTimestamp(now))
	c.hold = nil
}

// endAcquire ends the acquire span once the call returned. Its figures
// come from the call's EventAcquire; a Locker that reported none (one not
// built on dlock.Engine) gets them from the call's outcome.
func (c *call) endAcquire(ctx context.Context, start time.Time, lk *dlock.Lock, err error, wait bool) {
	defer func() { _ = recover() }() // a span must never break a call
	c.mu.Lock()
	e, have, held := c.acq, c.haveAcq, c.held
	c.mu.Unlock()
	if !have {
		e = dlock.Event{Wait: time.Since(start), Result: result(ctx, err, wait)}
		if err == nil && lk != nil {
			e.Token, e.Owner = lk.Token(), lk.Owner()
		}
	}
	attrs := []attribute.KeyValue{
		AttrResult.String(string(e.Result)),
		AttrAttempts.Int(e.Attempts),
		AttrWaitMS.Float64(ms(e.Wait)),
	}
	if e.Backend != "" {
		attrs = append(attrs, AttrBackend.String(e.Backend))
	}
	if have {
		attrs = append(attrs, AttrMode.String(e.Mode.String()))
	}
	if e.Result == dlock.ResultAcquired {
		attrs = append(attrs, AttrToken.Int64(int64(e.Token)), AttrOwner.String(e.Owner))
	}
	c.span.SetAttributes(attrs...)
	switch e.Result {
	case dlock.ResultAcquired, dlock.ResultContended:
		// A held key is an answer, not a failure: TryAcquire asked
		// whether the key was free (RunOnce's other replicas, say).
	default:
		c.span.SetAttributes(c.w.errAttrs(err)...)
		c.span.SetStatus(codes.Error, c.w.errText(err))
	}
	if have && e.Result == dlock.ResultAcquired && !held.IsZero() {
		// The wait ends where the hold begins.
		c.span.End(trace.WithTimestamp(held))
		return
	}
	c.span.End()
}

// result classifies a call's outcome as dlock's Engine does.
func result(ctx context.Context, err error, wait bool) dlock.Result {
	switch {
	case err == nil:
		return dlock.ResultAcquired
	case errors.Is(err, dlock.ErrNotAcquired) && !wait && ctx.Err() == nil:
		return dlock.ResultContended
	case errors.Is(err, dlock.ErrNotAcquired), errors.Is(err, dlock.ErrUnavailable):
		return dlock.ResultTimeout
	}
	return dlock.ResultError
}

// errorKinds are the error classes shown without WithRawKey, first match
// first: their sentinel's text and a short error.type.
var errorKinds = []struct {
	err  error
	kind string
}{
	{dlock.ErrNotAcquired, "not_acquired"},
	{dlock.ErrUnavailable, "unavailable"},
	{dlock.ErrHoldCapReached, "hold_cap_reached"},
	{dlock.ErrLockLost, "lock_lost"},
	{dlock.ErrNotHeld, "not_held"},
	{dlock.ErrTransient, "transient"},
	{dlock.ErrInvalidKey, "invalid_key"},
	{dlock.ErrInvalidTTL, "invalid_ttl"},
	{dlock.ErrInvalidOption, "invalid_option"},
	{dlock.ErrUnsupported, "unsupported"},
	{dlock.ErrNilClient, "nil_client"},
	{dlock.ErrStaleToken, "stale_token"},
	{context.DeadlineExceeded, "deadline_exceeded"},
	{context.Canceled, "canceled"},
}

// errKind returns err's class among errorKinds: the sentinel, and the
// class name ("_OTHER" when none matches, as OpenTelemetry's error.type
// convention has it).
func errKind(err error) (error, string) {
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			return k.err, k.kind
		}
	}
	return nil, "_OTHER"
}

// errText is err's text for a span: in full with WithRawKey, else its
// class's sentinel text, with the context's error when it ended the call
// ("dlock: lock not acquired: context deadline exceeded").
func (w *locker) errText(err error) string {
	if err == nil {
		return ""
	}
	if w.rawKey {
		return err.Error()
	}
	s, _ := errKind(err)
	if s == nil {
		return "error (text withheld: it may name the key; see dlockotel.WithRawKey)"
	}
	text := s.Error()
	for _, c := range []error{context.DeadlineExceeded, context.Canceled} {
		if s != c && errors.Is(err, c) {
			return text + ": " + c.Error()
		}
	}
	return text
}

// errAttrs are err's attributes: dlock.error and error.type (none for nil).
func (w *locker) errAttrs(err error) []attribute.KeyValue {
	if err == nil {
		return nil
	}
	_, kind := errKind(err)
	return []attribute.KeyValue{AttrError.String(w.errText(err)), AttrErrorType.String(kind)}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// isNilPointer reports whether l is a typed nil pointer, on which a method
// call would panic.
func isNilPointer(l dlock.Locker) bool {
	v := reflect.ValueOf(l)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
