package dlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// hangCloseDriver refuses the first attempt (a holder), then grants; its
// Watcher's subscriptions hang in Close until unblock is closed, like an
// unsubscribe sent to a hung server.
type hangCloseDriver struct {
	unblock chan struct{}
	mu      sync.Mutex
	n       int
	tok     uint64
}

func (d *hangCloseDriver) Spec() driver.Spec { return driver.Spec{Name: "hang-close"} }

func (d *hangCloseDriver) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n++; d.n == 1 {
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key}
	}
	d.tok++
	return driver.Grant{Lease: hungRenewLease{}, Token: d.tok}, nil
}

func (d *hangCloseDriver) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	return hangCloseSub{ch: make(chan struct{}), unblock: d.unblock}, nil
}

type hangCloseSub struct{ ch, unblock chan struct{} }

func (s hangCloseSub) C() <-chan struct{} { return s.ch }
func (s hangCloseSub) Close()             { <-s.unblock }

// Acquire closed its release subscription on the caller's goroutine when
// it returned with its context still live (it got the lock): a Close that
// hung (an unsubscribe to a hung server) held Acquire past its context's
// deadline, for ever. The close is now bounded by the context.
func TestRegressHangingSubscriptionClose(t *testing.T) {
	d := &hangCloseDriver{unblock: make(chan struct{})}
	defer close(d.unblock)
	e := dlock.NewEngine(d)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lk, err := e.Acquire(ctx, "k", dlock.WithTTL(time.Second))
		if lk != nil {
			lk.Release(context.Background())
		}
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(1300 * time.Millisecond):
		t.Fatal("Acquire did not return 1s after its deadline: Subscription.Close hangs it")
	}
}
