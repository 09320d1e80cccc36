package dlock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// rt4Backend grants every key with the Start set for it (zero: the
// attempt's start), so a test chooses each lock's deadline; renewals
// succeed.
type rt4Backend struct {
	mu    sync.Mutex
	start map[string]time.Time
}

func newRT4Backend() *rt4Backend { return &rt4Backend{start: map[string]time.Time{}} }

func (b *rt4Backend) setStart(key string, t time.Time) { b.mu.Lock(); b.start[key] = t; b.mu.Unlock() }

func (b *rt4Backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	s := b.start[req.Key]
	b.mu.Unlock()
	return driver.Grant{Lease: nopLease{}, Token: 1, Start: s}, nil
}

type nopLease struct{}

func (nopLease) Refresh(context.Context, time.Duration) error { return nil }
func (nopLease) Release(context.Context) error                { return nil }

// rt4Watch records, per lock, the exact time its Lost() was closed (it
// wraps l.cancel under l.mu; the wrapper runs where Lost() closes).
type rt4Obs struct {
	locks    []*Lock
	deadline []time.Time
	seen     []time.Time
}

func rt4Watch(locks []*Lock) *rt4Obs {
	o := &rt4Obs{locks: append([]*Lock(nil), locks...)}
	o.deadline = make([]time.Time, len(locks))
	o.seen = make([]time.Time, len(locks))
	for i, l := range o.locks {
		l.mu.Lock()
		o.deadline[i] = l.deadline
		orig := l.cancel
		l.cancel = func(c error) {
			if o.seen[i].IsZero() {
				o.seen[i] = time.Now()
			}
			orig(c)
		}
		l.mu.Unlock()
	}
	return o
}

func (o *rt4Obs) wait(max time.Duration) {
	end := time.After(max)
	for _, l := range o.locks {
		select {
		case <-l.Lost():
		case <-end:
			return
		}
	}
}

// report: max lateness (close - deadline at watch time) and max earliness.
func (o *rt4Obs) report(t rt4T, name string) (maxLate, maxEarly time.Duration, nLate int) {
	o.wait(20 * time.Second)
	for i, l := range o.locks {
		select {
		case <-l.Lost():
		default:
			t.Errorf("%s: lock %d never lost (deadline %v ago)", name, i, time.Since(o.deadline[i]))
			continue
		}
		d := o.seen[i].Sub(o.deadline[i])
		if d > maxLate {
			maxLate = d
		}
		if -d > maxEarly {
			maxEarly = -d
		}
		if d > 5*time.Millisecond {
			nLate++
		}
	}
	t.Logf("%s: %d locks, maxLate %v, maxEarly %v, late>5ms: %d", name, len(o.locks), maxLate, maxEarly, nLate)
	return
}

func rt4Acquire(t rt4T, a *Engine, key string, opts ...Option) *Lock {
	t.Helper()
	lk, err := a.TryAcquire(context.Background(), key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

func (*rt4Backend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// rt4T is the part of testing.TB the stream scenarios use, so that
// rt4Attempts can run one again.
type rt4T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// rt4Attempt records one run of a scenario; Fatal ends it.
type rt4Attempt struct {
	t    *testing.T
	errs []string
}

type rt4Fatal struct{}

func (a *rt4Attempt) Helper()                      { a.t.Helper() }
func (a *rt4Attempt) Logf(f string, args ...any)   { a.t.Helper(); a.t.Logf(f, args...) }
func (a *rt4Attempt) Errorf(f string, args ...any) { a.errs = append(a.errs, fmt.Sprintf(f, args...)) }
func (a *rt4Attempt) Fatal(args ...any) {
	a.errs = append(a.errs, fmt.Sprint(args...))
	panic(rt4Fatal{})
}
func (a *rt4Attempt) Fatalf(f string, args ...any) { a.Fatal(fmt.Sprintf(f, args...)) }

// rt4Attempts runs a stream scenario up to three times and fails only if
// every run failed. The scenarios schedule thousands of deadlines a few
// seconds ahead and measure how late the watchdog closed Lost(): on a
// machine loaded far beyond its cores (CI with other jobs), setting up the
// batch can overrun its schedule, or the watchdog's goroutine can wait for
// a CPU longer than the lateness allowed. The regressions they guard were
// systematic (late in every run), so a scenario that passes once is not
// one of them; a machine that is merely slow must not fail the test.
func rt4Attempts(t *testing.T, scenario func(rt4T)) {
	const attempts = 3
	for i := 1; i <= attempts; i++ {
		a := &rt4Attempt{t: t}
		func() {
			defer func() {
				if r := recover(); r != nil {
					if _, ok := r.(rt4Fatal); !ok {
						panic(r)
					}
				}
			}()
			scenario(a)
		}()
		if len(a.errs) == 0 {
			return
		}
		if i == attempts {
			for _, e := range a.errs {
				t.Errorf("run %d of %d: %s", i, attempts, e)
			}
			return
		}
		t.Logf("run %d of %d failed, running again: %s", i, attempts, strings.Join(a.errs, "; "))
	}
}
