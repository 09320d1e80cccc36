package dlockprom_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/memlock"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func newObs(t *testing.T, opts ...dlockprom.Option) (*prometheus.Registry, *dlockprom.Observer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := dlockprom.New(reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return reg, obs
}

// sample is one scraped series: its labels and its value (a histogram's
// sample count).
type sample struct {
	labels map[string]string
	value  float64
}

func scrape(t *testing.T, reg *prometheus.Registry, name string) []sample {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []sample
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			s := sample{labels: map[string]string{}}
			for _, lp := range m.GetLabel() {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				s.value = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				s.value = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				s.value = float64(m.GetHistogram().GetSampleCount())
			}
			out = append(out, s)
		}
	}
	return out
}

// value sums the series of name whose labels include want.
func value(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	var sum float64
next:
	for _, s := range scrape(t, reg, name) {
		for k, v := range want {
			if s.labels[k] != v {
				continue next
			}
		}
		sum += s.value
	}
	return sum
}

func expect(t *testing.T, reg *prometheus.Registry, name string, want map[string]string, v float64) {
	t.Helper()
	if got := value(t, reg, name, want); got != v {
		t.Errorf("%s%v = %v, want %v", name, want, got, v)
	}
}

func waitFor(t *testing.T, reg *prometheus.Registry, name string, want map[string]string, v float64) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if value(t, reg, name, want) == v {
			return
		}
	}
	expect(t, reg, name, want, v)
}

var mem = map[string]string{"backend": "memory", "key_class": "all"}

func with(k, v string) map[string]string {
	m := map[string]string{"backend": "memory", "key_class": "all"}
	m[k] = v
	return m
}

func TestAcquireRelease(t *testing.T) {
	reg, obs := newObs(t)
	l := memlock.New(dlock.WithObserver(obs))
	ctx := context.Background()
	lk, err := l.TryAcquire(ctx, "job:1")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, reg, "dlock_locks_held", mem, 1)
	expect(t, reg, "dlock_waiters", mem, 0)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = lk.Release(ctx) // a second release must not count down again
	expect(t, reg, "dlock_acquire_total", with("result", "acquired"), 1)
	expect(t, reg, "dlock_acquire_duration_seconds", with("result", "acquired"), 1)
	expect(t, reg, "dlock_hold_duration_seconds", mem, 1)
	expect(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_waiters", mem, 0)
}

func TestContentionAndTimeout(t *testing.T) {
	reg, obs := newObs(t)
	l := memlock.New(dlock.WithObserver(obs))
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a held key: %v", err)
	}
	expect(t, reg, "dlock_acquire_total", with("result", "contended"), 1)
	if _, err := l.Acquire(ctx, "k", dlock.WithWait(50*time.Millisecond)); err == nil {
		t.Fatal("Acquire on a held key succeeded")
	}
	expect(t, reg, "dlock_acquire_total", with("result", "timeout"), 1)
	expect(t, reg, "dlock_acquire_duration_seconds", with("result", "timeout"), 1)
	if got := value(t, reg, "dlock_acquire_total", mem); got != 3 {
		t.Errorf("dlock_acquire_total over all results = %v, want 3", got)
	}
	expect(t, reg, "dlock_waiters", mem, 0)
	expect(t, reg, "dlock_locks_held", mem, 1)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expect(t, reg, "dlock_locks_held", mem, 0)
}

// A lock lost then released is counted down once.
func TestLoss(t *testing.T) {
	reg, obs := newObs(t)
	l := memlock.New(dlock.WithObserver(obs))
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("k")
	select {
	case <-lk.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("not lost after the lease was deleted")
	}
	// EventLost is reported once Lost() is closed: it may come a moment later.
	waitFor(t, reg, "dlock_lost_total", with("reason", string(dlock.LossNotHeld)), 1)
	expect(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_hold_duration_seconds", mem, 1)
	if value(t, reg, "dlock_renew_total", with("result", "refused")) < 1 {
		t.Error("no refused renewal counted")
	}
	_ = lk.Release(ctx)
	expect(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_hold_duration_seconds", mem, 1)
	for _, s := range scrape(t, reg, "dlock_locks_held") {
		if s.value < 0 {
			t.Errorf("dlock_locks_held%v = %v", s.labels, s.value)
		}
	}
}

func TestRenew(t *testing.T) {
	reg, obs := newObs(t)
	l := memlock.New(dlock.WithObserver(obs))
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if value(t, reg, "dlock_renew_total", with("result", "ok")) < 1 {
		t.Error("renewal not counted")
	}
}

func TestFencingRejected(t *testing.T) {
	reg, obs := newObs(t)
	l := memlock.New(dlock.WithObserver(obs))
	g := guard.NewMemory(dlock.WithObserver(obs))
	ctx := context.Background()

	first, err := l.Acquire(ctx, "account:7", dlock.WithTTL(200*time.Millisecond), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	<-first.Lost() // the first holder pauses past its TTL
	second, err := l.Acquire(ctx, "account:7")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, "account:7", second.Fence(), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	_ = second.Release(ctx)
	if err := g.Do(ctx, "account:7", first.Fence(), func(context.Context) error { return nil }); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("stale write: %v, want ErrStaleToken", err)
	}
	expect(t, reg, "dlock_fencing_rejected_total", mem, 1)
	_ = first.Release(ctx)
	waitFor(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_waiters", mem, 0)
	expect(t, reg, "dlock_hold_duration_seconds", mem, 2)
}

func TestKeyClass(t *testing.T) {
	reg, obs := newObs(t, dlockprom.WithKeyClass(func(key string) string {
		if key == "boom" {
			panic("class function bug")
		}
		prefix, _, _ := strings.Cut(key, ":")
		return prefix
	}))
	l := memlock.New(dlock.WithObserver(obs))
	ctx := context.Background()
	for _, k := range []string{"invoice:1", "invoice:2", "user:9", "boom"} {
		lk, err := l.TryAcquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		_ = lk.Release(ctx)
	}
	expect(t, reg, "dlock_acquire_total", map[string]string{"key_class": "invoice", "result": "acquired"}, 2)
	expect(t, reg, "dlock_acquire_total", map[string]string{"key_class": "user", "result": "acquired"}, 1)
	expect(t, reg, "dlock_acquire_total", map[string]string{"key_class": dlockprom.UnknownKeyClass, "result": "acquired"}, 1)
	expect(t, reg, "dlock_locks_held", map[string]string{"key_class": "invoice"}, 0)
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), ":") || lp.GetValue() == "boom" {
					t.Errorf("%s has a raw key as label %s=%q", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
}

// The default key class is "all": raw keys never reach a label.
func TestDefaultKeyClassHidesKeys(t *testing.T) {
	reg, obs := newObs(t)
	l := memlock.New(dlock.WithObserver(obs))
	ctx := context.Background()
	lk, err := l.TryAcquire(ctx, "secret-key")
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Release(ctx)
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "key_class" && lp.GetValue() != dlockprom.DefaultKeyClass {
					t.Errorf("%s key_class=%q", mf.GetName(), lp.GetValue())
				}
			}
		}
	}
}

func TestNewBadInput(t *testing.T) {
	if _, err := dlockprom.New(nil); !errors.Is(err, dlockprom.ErrNilRegisterer) {
		t.Fatalf("New(nil) = %v, want ErrNilRegisterer", err)
	}
	reg := prometheus.NewRegistry()
	obs, err := dlockprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	var are prometheus.AlreadyRegisteredError
	if _, err := dlockprom.New(reg); err == nil || !errors.As(err, &are) {
		t.Fatalf("second New on the same registry = %v, want an AlreadyRegisteredError", err)
	}
	// The failed New left the first Observer's metrics alone.
	l := memlock.New(dlock.WithObserver(obs))
	lk, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Release(context.Background())
	expect(t, reg, "dlock_acquire_total", with("result", "acquired"), 1)

	obs.Unregister(reg)
	if _, err := dlockprom.New(reg, nil, dlockprom.WithKeyClass(nil), dlockprom.WithBuckets(nil)); err != nil {
		t.Fatalf("New after Unregister: %v", err)
	}
}

// tracking is a real Registry that counts the collectors registered
// through it and not unregistered.
type tracking struct {
	*prometheus.Registry
	live int
}

func (r *tracking) Register(c prometheus.Collector) error {
	err := r.Registry.Register(c)
	if err == nil {
		r.live++
	}
	return err
}

func (r *tracking) Unregister(c prometheus.Collector) bool {
	ok := r.Registry.Unregister(c)
	if ok {
		r.live--
	}
	return ok
}

// A conflict on a later metric leaves none of the earlier ones registered.
func TestNewPartialConflict(t *testing.T) {
	reg := &tracking{Registry: prometheus.NewRegistry()}
	if err := reg.Registry.Register(prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dlock", Name: "waiters", Help: "x"})); err != nil {
		t.Fatal(err)
	}
	if _, err := dlockprom.New(reg); err == nil {
		t.Fatal("New over a conflicting metric succeeded")
	}
	if reg.live != 0 {
		t.Fatalf("%d collectors left registered after a failed New", reg.live)
	}
}

func TestObserveNeverPanics(t *testing.T) {
	var nilObs *dlockprom.Observer
	nilObs.Observe(dlock.Event{Kind: dlock.EventAcquire})
	_, obs := newObs(t)
	for k := dlock.EventKind(0); k < 20; k++ {
		obs.Observe(dlock.Event{Kind: k})
	}
	obs.Observe(dlock.Event{Kind: dlock.EventRelease, Backend: "x", Key: "never-acquired"})
}

// Symptom: locks_held stayed at 1 for ever after a loss during Acquire.
// A Lock lost (on the watchdog's goroutine) while its call is still
// reporting EventAcquire must reach the Observer as acquired, then lost:
// dlock reports a Lock's Events after its EventAcquire, so locks_held
// drops back to 0 (and the Observer's map keeps no entry). The stall is a
// call observer placed before dlockprom's.
func TestObserver_LossDuringAcquireLeavesNothingHeld(t *testing.T) {
	reg, obs := newObs(t)
	ml := memlock.New()
	lostSeen := make(chan struct{})
	var once sync.Once
	var stalled atomic.Bool
	stall := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventLost {
			once.Do(func() { close(lostSeen) })
		}
		if e.Kind != dlock.EventAcquire || e.Result != dlock.ResultAcquired || !stalled.CompareAndSwap(false, true) {
			return
		}
		ml.Expire(e.Key)
		select { // bounded: with the fix the loss waits for this Event
		case <-lostSeen:
		case <-time.After(2 * time.Second):
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lk, err := ml.Acquire(ctx, "k", dlock.WithTTL(dlock.MinTTL), dlock.WithCallObserver(stall), dlock.WithCallObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the expired lock was not lost")
	}
	waitFor(t, reg, "dlock_lost_total", with("reason", string(dlock.LossNotHeld)), 1)
	if err := lk.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release: %v", err)
	}
	expect(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_waiters", mem, 0)
}

// Guards against: gauges left above 0 or driven negative when releases race losses.
// Many concurrent calls sharing the Observer as Locker and call observer
// of different Lockers, releases racing losses: the gauges come back to 0
// and never go negative; raw keys never become label values.
func TestObserver_GaugesReturnToZeroWhenReleasesRaceLosses(t *testing.T) {
	reg, obs := newObs(t)
	ml := memlock.New(dlock.WithObserver(obs))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			key := "secret-key-" + strings.Repeat("x", i*60)
			for range 5 {
				lk, err := ml.Acquire(ctx, key, dlock.WithTTL(dlock.MinTTL))
				if err != nil {
					t.Error(err)
					return
				}
				var in sync.WaitGroup
				in.Go(func() { ml.Expire(key) })
				in.Go(func() { _ = lk.Release(ctx) })
				in.Wait()
				<-lk.Lost()
			}
		})
	}
	wg.Wait()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if value(t, reg, "dlock_locks_held", mem) == 0 {
			break
		}
	}
	expect(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_waiters", mem, 0)
	for _, name := range []string{"dlock_locks_held", "dlock_waiters", "dlock_acquire_total", "dlock_lost_total", "dlock_renew_total", "dlock_hold_duration_seconds"} {
		for _, s := range scrape(t, reg, name) {
			if s.value < 0 {
				t.Errorf("%s%v = %v", name, s.labels, s.value)
			}
			for k, v := range s.labels {
				if strings.Contains(v, "secret") {
					t.Errorf("%s: label %s carries the key: %q", name, k, v)
				}
			}
		}
	}
}
