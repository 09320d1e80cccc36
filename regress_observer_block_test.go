package dlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// hungRenewDriver grants every attempt; its leases' renewals never answer
// (until their context ends), so its locks are lost at their deadlines.
type hungRenewDriver struct {
	mu  sync.Mutex
	tok uint64
}

func (d *hungRenewDriver) Spec() driver.Spec { return driver.Spec{Name: "hung-renew"} }

func (d *hungRenewDriver) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tok++
	return driver.Grant{Lease: hungRenewLease{}, Token: d.tok}, nil
}

type hungRenewLease struct{}

func (hungRenewLease) Refresh(ctx context.Context, ttl time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}
func (hungRenewLease) Release(ctx context.Context) error { return nil }

// The watchdog used to report EventLost from inside its losing loop, with
// the loop's state (looping, the timer disarmed) held: an Observer slow
// on one lock's EventLost kept every other lock's Lost() open past its
// deadline, and one that blocked kept them open for ever: a holder went on
// believing it held a lock the server had long expired. Losses are now
// reported after the loop.
func TestRegressBlockedObserverStallsOtherLosses(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	var once sync.Once
	e := dlock.NewEngine(&hungRenewDriver{}, dlock.WithObserver(dlock.ObserverFunc(func(ev dlock.Event) {
		if ev.Kind == dlock.EventLost {
			once.Do(func() { <-block }) // the first loss blocks the Observer
		}
	})))
	ctx := context.Background()
	a, err := e.TryAcquire(ctx, "a", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := e.TryAcquire(ctx, "b", dlock.WithTTL(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	<-a.Lost()
	select {
	case <-b.Lost():
		if late := time.Since(b.Deadline()); late > 50*time.Millisecond {
			t.Errorf("b's Lost() closed %v after its deadline", late)
		}
	case <-time.After(time.Until(b.Deadline()) + 300*time.Millisecond):
		t.Fatal("b's Lost() still open 300ms after its deadline: an Observer blocked on a's EventLost stalls the watchdog")
	}
}
