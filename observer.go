package dlock

import (
	"context"
	"log/slog"
	"reflect"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/observe"
)

// LossReason says why a held lock was lost (LostError.Reason, Event.Reason).
// Its values are short and fixed, fit for a metric label.
type LossReason string

const (
	// LossDeadline: the local deadline passed without a successful renewal
	// (a hung server, a stalled link, renewals failing).
	LossDeadline LossReason = "deadline"
	// LossNotHeld: the server no longer held the lease for this owner when
	// asked (renewal or release refused: the key expired, was deleted or
	// was taken).
	LossNotHeld LossReason = "not_held"
	// LossHoldCap: the total hold time set with WithMaxHold was reached.
	LossHoldCap LossReason = "hold_cap"
	// LossBackend: the backend noticed the loss on its own (a watch saw the
	// lease deleted, a session expired).
	LossBackend LossReason = "backend"
)

func (r LossReason) text() string {
	switch r {
	case LossDeadline:
		return "local deadline passed without a successful renewal"
	case LossNotHeld:
		return "the server no longer held the lease (deleted, expired or taken)"
	case LossHoldCap:
		return "hold cap reached"
	case LossBackend:
		return "the backend reported the lease lost"
	}
	return string(r)
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventWait: Acquire or TryAcquire started (paired with one
	// EventAcquire when it returns).
	EventWait EventKind = iota + 1
	// EventAttempt: one attempt was sent to the backend (Attempts counts).
	EventAttempt
	// EventAcquire: Acquire or TryAcquire returned (Result, Wait,
	// Attempts; Token and Owner when acquired; Err otherwise).
	EventAcquire
	// EventRenew: a renewal of a held lock answered or failed (Result: ok,
	// error or refused; Err).
	EventRenew
	// EventLost: a held lock was lost (Reason, Held, Err); its Lost() is
	// already closed.
	EventLost
	// EventRelease: a held lock was released by its holder (Held; Err when
	// the server-side release failed).
	EventRelease
	// EventRejected: a guard refused a stale fence (Resource, Token,
	// Owner, Highest).
	EventRejected
)

var kindNames = [...]string{"", "wait", "attempt", "acquire", "renew", "lost", "release", "rejected"}

// String returns the kind's name ("acquire", "lost", ...).
func (k EventKind) String() string {
	if int(k) < len(kindNames) && k > 0 {
		return kindNames[k]
	}
	return "unknown"
}

// Result is the outcome an EventAcquire or EventRenew reports. Its values
// fit a metric label.
type Result string

const (
	ResultAcquired  Result = "acquired"  // the lock was granted
	ResultContended Result = "contended" // TryAcquire found the key held
	ResultTimeout   Result = "timeout"   // the wait ended (context, WithWait) or the service did not answer in time
	ResultError     Result = "error"     // bad arguments or a backend error
	ResultOK        Result = "ok"        // renewal succeeded
	ResultRefused   Result = "refused"   // renewal refused by the server: the lock is lost
)

// Event is one thing that happened to a lock. Fields that do not apply to
// its Kind are zero.
type Event struct {
	Kind    EventKind
	Backend string // the backend's name ("redis", "etcd", "file", ...)
	Key     string // the lock's key (a guard's resource for EventRejected)
	Mode    Mode
	Token   uint64
	Owner   string

	Result   Result
	Attempts int           // attempts made by this Acquire so far
	Wait     time.Duration // EventAcquire: time from the call to its return
	Held     time.Duration // EventLost, EventRelease: time since acquisition
	Reason   LossReason    // EventLost
	Highest  uint64        // EventRejected: the highest token the resource accepted
	Err      error
}

// Observer receives Events: attempts, acquisitions, renewals, losses,
// releases and guard rejections, for metrics, logs and traces. Observe is
// called synchronously, from any goroutine, sometimes from the watchdog
// that closes other locks' Lost(): it must be fast and must not block or
// call back into the lock. A Locker without an Observer pays nothing.
//
// An Observer cannot break a lock: a panic in Observe is recovered and
// its Event dropped (the lock, its watchdog and its release go on as if
// nothing was observed), and a nil Observer, also a typed nil such as
// ObserverFunc(nil), counts as none. One that is slow or blocks delays
// the Events after the one it holds and the goroutine it holds (the
// caller's, a renewal's: a renewal applied late may lose its lock), but
// never keeps a Lost() open past its deadline: the watchdog reports
// losses only after closing every Lost() due.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe implements Observer.
func (f ObserverFunc) Observe(e Event) { f(e) }

// LockerOption configures a Locker or a guard when a backend's New or
// guard constructor builds it: every backend's Option is this type, so one
// list holds the backend's own options and the core's (WithObserver). An
// option of another backend is refused (ErrInvalidOption), never silently
// ignored.
type LockerOption = driver.Option

// WithObserver makes a backend's Locker (or guard) report its Events to o.
// Every backend's New and every guard constructor accepts it among its own
// options:
//
//	redislock.New(client, dlock.WithObserver(dlock.NewSlogObserver(logger)))
func WithObserver(o Observer) LockerOption {
	return driver.CoreSetting(func(s *coreSettings) { s.observer = o })
}

// observerOf returns the Observer that WithObserver set among opts, or nil
// (also for a typed nil). A Locker gets it through NewEngine, a guard
// through internal/observe. The Observer returned recovers a panic of the
// one set, so that reporting an Event never unwinds the caller's state (a
// held mutex, a lock being handed out).
func observerOf(opts []driver.Option) Observer {
	var s coreSettings
	driver.Apply(&s, opts)
	o := s.observer
	if o == nil || isNilValue(o) {
		return nil
	}
	if _, ok := o.(recovering); ok {
		return o
	}
	return recovering{o}
}

func init() {
	observe.Of = func(opts []driver.Option) any { return observerOf(opts) }
}

// isNilValue reports whether o holds a typed nil (a nil pointer, func,
// map, ...), whose Observe would usually panic.
func isNilValue(o Observer) bool {
	v := reflect.ValueOf(o)
	switch v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}

// recovering is an Observer whose panics are recovered and dropped: an
// Event is reported from the middle of the lock's own work (a watchdog
// pass, Acquire handing out a lock, a guard holding its mutex), which a
// panic must not cut short.
type recovering struct{ o Observer }

func (r recovering) Observe(e Event) {
	defer func() { _ = recover() }()
	r.o.Observe(e)
}

// coreSettings are the core's settings among a constructor's options.
type coreSettings struct {
	observer Observer
}

// WithCallObserver makes one Acquire or TryAcquire report its Events to o,
// in addition to the Locker's Observer (WithObserver): the call's EventWait,
// EventAttempt and EventAcquire, and, when it returns a Lock, that Lock's
// EventRenew, EventLost and EventRelease, until it is released or lost.
// It is the per-call hook for observers that need the call's context,
// such as a tracer parenting spans to the caller's span (dlockotel), which
// an Observer shared by the whole Locker cannot do.
//
// The rules are the Locker Observer's: Observe is called synchronously,
// from the caller's goroutine or from the one that renews, loses or
// releases the Lock; it must be fast and must not block or call back into
// the lock; a panic in it is recovered and its Event dropped; a nil o,
// also a typed nil, counts as none. Each Event goes to the Locker's
// Observer first, then to the call's. Several WithCallObserver options
// on one call all receive the Events, in the order given.
//
// A Lock's Events come after its call's EventAcquire, to both Observers,
// even when the Lock was renewed or lost while the call was reporting it
// (they are then reported by the caller's goroutine, right after); a Lock
// lost while it was being handed out, which the call never returns,
// reports none.
//
// A call's Events also reach it when the call is refused before any
// attempt (a nil context, a bad key or option): EventWait then
// EventAcquire with ResultError. Wrappers such as AcquireAll, Do and
// RunOnce pass their options to every Acquire they make, so each of their
// acquisitions reports to o.
func WithCallObserver(o Observer) Option {
	if o == nil || isNilValue(o) {
		return func(*config) {}
	}
	if _, ok := o.(recovering); !ok {
		o = recovering{o}
	}
	return func(c *config) {
		if c.callObs == nil {
			c.callObs = o
			return
		}
		c.callObs = observers{c.callObs, o}
	}
}

// observers reports each Event to both, in order; each one recovers its
// own panics (they are recovering or observers of them).
type observers [2]Observer

func (p observers) Observe(e Event) {
	p[0].Observe(e)
	p[1].Observe(e)
}

// callObserverOf returns the call's Observer among opts when the config
// could not be built (a bad key or a nil context stops newConfig before it
// applies the options): applying them to a scratch config finds it.
func callObserverOf(opts []Option) Observer {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c.callObs
}

// source is what Locks and the watchdog need to report Events.
type source struct {
	name string
	obs  Observer
}

// emitCall reports e to the Locker's Observer and then to call (nil: none).
func (s *source) emitCall(call Observer, e Event) {
	e.Backend = s.name
	if s.obs != nil {
		s.obs.Observe(e)
	}
	if call != nil {
		call.Observe(e)
	}
}

// observed reports whether the Events of l go anywhere.
func (s *source) observed(l *Lock) bool {
	return s.obs != nil || l.cfg.callObs != nil
}

// renew, lost and released report a Lock's Events to the Locker's
// Observer and to the Observer of the call that acquired it.
func (s *source) renew(l *Lock, r Result, err error) {
	if s.observed(l) {
		s.emitLock(l, Event{Kind: EventRenew, Key: l.key, Mode: l.cfg.mode, Token: l.token, Owner: l.owner, Result: r, Err: err})
	}
}

func (s *source) lost(l *Lock, reason LossReason, err error) {
	if s.observed(l) {
		s.emitLock(l, Event{Kind: EventLost, Key: l.key, Mode: l.cfg.mode, Token: l.token, Owner: l.owner, Reason: reason, Held: time.Since(l.acquired), Err: err})
	}
}

func (s *source) released(l *Lock, err error) {
	if s.observed(l) {
		s.emitLock(l, Event{Kind: EventRelease, Key: l.key, Mode: l.cfg.mode, Token: l.token, Owner: l.owner, Held: time.Since(l.acquired), Err: err})
	}
}

// emitLock reports e, an Event of l, or keeps it for announce when the
// call that acquired l has not reported its EventAcquire yet: a loss on
// the watchdog's goroutine must not reach Observers before the
// acquisition (an Observer counting held locks, as dlockprom does, would
// count the lock held for ever). A Lock lost while it was handed out is
// never announced: its Events, about a Lock nobody got, are dropped with
// it.
func (s *source) emitLock(l *Lock, e Event) {
	l.mu.Lock()
	if !l.announced {
		l.early = append(l.early, e)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	s.emitCall(l.cfg.callObs, e)
}

// announce is called by the call that acquired l once it reported its
// EventAcquire: it reports the Events kept meanwhile, in order, on the
// caller's goroutine. Events arriving while it does are kept too and
// reported by the same loop (bounded: a Lock has few Events, and none
// after its loss or release), so the order holds.
func (s *source) announce(call Observer, l *Lock) {
	for {
		l.mu.Lock()
		q := l.early
		l.early = nil
		if len(q) == 0 {
			l.announced = true
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		for _, e := range q {
			s.emitCall(call, e)
		}
	}
}

// NewSlogObserver returns an Observer that logs Events as structured
// records: lock_acquire_attempt (debug), lock_acquired (info), lock_failed
// (warn; info when contended), lock_renew_failed (warn), lock_lost (warn),
// lock_released (info) and lock_fencing_rejected (warn). A nil logger means
// slog.Default(). Keys are logged as they are: use a logger handler that
// redacts them if they are sensitive.
func NewSlogObserver(logger *slog.Logger) Observer {
	if logger == nil {
		logger = slog.Default()
	}
	return slogObserver{logger}
}

type slogObserver struct{ l *slog.Logger }

func (o slogObserver) Observe(e Event) {
	ctx := context.Background()
	base := []slog.Attr{slog.String("backend", e.Backend), slog.String("key", e.Key)}
	if e.Mode != Exclusive {
		base = append(base, slog.String("mode", e.Mode.String()))
	}
	switch e.Kind {
	case EventAttempt:
		o.l.LogAttrs(ctx, slog.LevelDebug, "lock_acquire_attempt", append(base, slog.Int("attempt", e.Attempts))...)
	case EventAcquire:
		if e.Result == ResultAcquired {
			o.l.LogAttrs(ctx, slog.LevelInfo, "lock_acquired", append(base, slog.Uint64("token", e.Token), slog.Duration("wait", e.Wait), slog.Int("attempts", e.Attempts))...)
			return
		}
		level := slog.LevelWarn
		if e.Result == ResultContended {
			level = slog.LevelInfo
		}
		o.l.LogAttrs(ctx, level, "lock_failed", append(base, slog.String("result", string(e.Result)), slog.Duration("wait", e.Wait), slog.Int("attempts", e.Attempts), errAttr(e.Err))...)
	case EventRenew:
		if e.Result != ResultOK {
			o.l.LogAttrs(ctx, slog.LevelWarn, "lock_renew_failed", append(base, slog.Uint64("token", e.Token), slog.String("result", string(e.Result)), errAttr(e.Err))...)
		}
	case EventLost:
		o.l.LogAttrs(ctx, slog.LevelWarn, "lock_lost", append(base, slog.Uint64("token", e.Token), slog.String("reason", string(e.Reason)), slog.Duration("held", e.Held), errAttr(e.Err))...)
	case EventRelease:
		attrs := append(base, slog.Uint64("token", e.Token), slog.Duration("held", e.Held))
		if e.Err != nil {
			attrs = append(attrs, errAttr(e.Err))
		}
		o.l.LogAttrs(ctx, slog.LevelInfo, "lock_released", attrs...)
	case EventRejected:
		o.l.LogAttrs(ctx, slog.LevelWarn, "lock_fencing_rejected", slog.String("backend", e.Backend), slog.String("resource", e.Key), slog.Uint64("token", e.Token), slog.Uint64("highest", e.Highest))
	}
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.String("error", "")
	}
	return slog.String("error", err.Error())
}
