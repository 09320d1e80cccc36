package dlock

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
