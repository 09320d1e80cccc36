package dlockprom

import (
	"errors"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultKeyClass is the key class of every key when WithKeyClass is not
// used.
const DefaultKeyClass = "all"

// UnknownKeyClass is the key class given to a key whose class function
// panicked or returned "".
const UnknownKeyClass = "unknown"

// DefaultBuckets are the histograms' buckets in seconds unless WithBuckets
// sets others: from 1 ms to 5 minutes.
var DefaultBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Option configures New.
type Option func(*config)

type config struct {
	keyClass func(string) string
	buckets  []float64
}

// WithKeyClass sets the function that maps a lock's key (a guard's
// resource for fencing rejections) to its key_class label. It must return
// one of a small, fixed set of values: never the key itself, whose every
// distinct value would create new time series. It is called from Observe,
// so it must be fast and must not block. A nil f keeps the default (every
// key in the class "all").
func WithKeyClass(f func(key string) string) Option {
	return func(c *config) {
		if f != nil {
			c.keyClass = f
		}
	}
}

// WithBuckets sets the buckets, in seconds, of the acquire and hold
// duration histograms. An empty list keeps DefaultBuckets.
func WithBuckets(b []float64) Option {
	return func(c *config) {
		if len(b) > 0 {
			c.buckets = append([]float64(nil), b...)
		}
	}
}

// Observer is a dlock.Observer that updates Prometheus metrics. Build it
// with New; it is safe for concurrent use.
type Observer struct {
	keyClass func(string) string

	acquireDuration *prometheus.HistogramVec
	acquireTotal    *prometheus.CounterVec
	holdDuration    *prometheus.HistogramVec
	locksHeld       *prometheus.GaugeVec
	waiters         *prometheus.GaugeVec
	renewTotal      *prometheus.CounterVec
	lostTotal       *prometheus.CounterVec
	rejectedTotal   *prometheus.CounterVec

	mu   sync.Mutex
	held map[heldKey]struct{} // locks counted in locks_held
}

// heldKey identifies one held lock among a process's Lockers.
type heldKey struct {
	backend, key, owner string
	token               uint64
	mode                dlock.Mode
}

var _ dlock.Observer = (*Observer)(nil)

// ErrNilRegisterer is returned by New when its Registerer is nil.
var ErrNilRegisterer = errors.New("dlockprom: nil prometheus.Registerer")

// New returns an Observer whose metrics are registered on reg. It returns
// an error, and leaves nothing registered, when reg is nil or refuses a
// metric (already registered, by an earlier New on the same reg for
// example).
func New(reg prometheus.Registerer, opts ...Option) (*Observer, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	c := config{keyClass: func(string) string { return DefaultKeyClass }, buckets: DefaultBuckets}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	const ns = "dlock"
	base := []string{"backend", "key_class"}
	with := func(l string) []string { return []string{"backend", "key_class", l} }
	o := &Observer{
		keyClass: c.keyClass,
		held:     make(map[heldKey]struct{}),
		acquireDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "acquire_duration_seconds",
			Help:    "Time from an Acquire or TryAcquire call to its return, by result.",
			Buckets: c.buckets,
		}, with("result")),
		acquireTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "acquire_total",
			Help: "Acquire and TryAcquire calls by result (acquired, contended, timeout, error).",
		}, with("result")),
		holdDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "hold_duration_seconds",
			Help:    "Time locks were held, observed when released or lost.",
			Buckets: c.buckets,
		}, base),
		locksHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "locks_held",
			Help: "Locks currently held through observed Lockers.",
		}, base),
		waiters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "waiters",
			Help: "Acquire and TryAcquire calls in progress.",
		}, base),
		renewTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "renew_total",
			Help: "Lease renewals by result (ok, error, refused).",
		}, with("result")),
		lostTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "lost_total",
			Help: "Held locks lost, by reason (deadline, not_held, hold_cap, backend).",
		}, with("reason")),
		rejectedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "fencing_rejected_total",
			Help: "Stale fencing tokens refused by guards: a holder that lost its lock tried to write.",
		}, base),
	}
	cs := []prometheus.Collector{o.acquireDuration, o.acquireTotal, o.holdDuration, o.locksHeld, o.waiters, o.renewTotal, o.lostTotal, o.rejectedTotal}
	for i, col := range cs {
		if err := reg.Register(col); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, errors.Join(errors.New("dlockprom: registering metrics"), err)
		}
	}
	return o, nil
}

// Unregister removes the Observer's metrics from reg (the Registerer given
// to New), so that a later New on reg succeeds.
func (o *Observer) Unregister(reg prometheus.Registerer) {
	if o == nil || reg == nil {
		return
	}
	for _, col := range []prometheus.Collector{o.acquireDuration, o.acquireTotal, o.holdDuration, o.locksHeld, o.waiters, o.renewTotal, o.lostTotal, o.rejectedTotal} {
		reg.Unregister(col)
	}
}

// class returns key's class, "unknown" when the class function panics or
// returns "".
func (o *Observer) class(key string) (c string) {
	defer func() {
		if recover() != nil {
			c = UnknownKeyClass
		}
	}()
	if c = o.keyClass(key); c == "" {
		c = UnknownKeyClass
	}
	return c
}

// Observe implements dlock.Observer. It never blocks on I/O and never
// panics.
func (o *Observer) Observe(e dlock.Event) {
	if o == nil {
		return
	}
	defer func() { _ = recover() }() // a metric must never break a lock
	switch e.Kind {
	case dlock.EventWait:
		o.waiters.WithLabelValues(e.Backend, o.class(e.Key)).Inc()
	case dlock.EventAcquire:
		kc := o.class(e.Key)
		o.waiters.WithLabelValues(e.Backend, kc).Dec()
		r := string(e.Result)
		if r == "" {
			r = string(dlock.ResultError)
		}
		o.acquireTotal.WithLabelValues(e.Backend, kc, r).Inc()
		o.acquireDuration.WithLabelValues(e.Backend, kc, r).Observe(e.Wait.Seconds())
		if e.Result == dlock.ResultAcquired {
			k := heldKey{e.Backend, e.Key, e.Owner, e.Token, e.Mode}
			o.mu.Lock()
			_, dup := o.held[k]
			o.held[k] = struct{}{}
			o.mu.Unlock()
			if !dup {
				o.locksHeld.WithLabelValues(e.Backend, kc).Inc()
			}
		}
	case dlock.EventRenew:
		o.renewTotal.WithLabelValues(e.Backend, o.class(e.Key), string(e.Result)).Inc()
	case dlock.EventLost:
		kc := o.class(e.Key)
		reason := string(e.Reason) // short, fixed values (dlock.LossReason)
		if reason == "" {
			reason = "unknown"
		}
		o.lostTotal.WithLabelValues(e.Backend, kc, reason).Inc()
		o.ended(e, kc)
	case dlock.EventRelease:
		o.ended(e, o.class(e.Key))
	case dlock.EventRejected:
		o.rejectedTotal.WithLabelValues(e.Backend, o.class(e.Key)).Inc()
	}
}

// ended counts down a released or lost lock and observes its hold time,
// once per lock: a lock lost then released is counted at its loss only.
func (o *Observer) ended(e dlock.Event, kc string) {
	k := heldKey{e.Backend, e.Key, e.Owner, e.Token, e.Mode}
	o.mu.Lock()
	_, ok := o.held[k]
	delete(o.held, k)
	o.mu.Unlock()
	if !ok {
		return
	}
	o.locksHeld.WithLabelValues(e.Backend, kc).Dec()
	o.holdDuration.WithLabelValues(e.Backend, kc).Observe(e.Held.Seconds())
}
