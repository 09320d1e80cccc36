package dlock

import (
	"context"
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
func (o *rt4Obs) report(t *testing.T, name string) (maxLate, maxEarly time.Duration, nLate int) {
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

func rt4Acquire(t *testing.T, a *Engine, key string, opts ...Option) *Lock {
	t.Helper()
	lk, err := a.TryAcquire(context.Background(), key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

func (*rt4Backend) Spec() driver.Spec { return driver.Spec{Name: "test"} }
