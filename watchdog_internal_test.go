package dlock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// countingBackend grants every attempt and counts renewals.
type countingBackend struct{ refreshes atomic.Int64 }

func (b *countingBackend) Try(ctx context.Context, req *Request) (Grant, error) {
	return Grant{Lease: countingLease{b}, Token: 1}, nil
}

type countingLease struct{ b *countingBackend }

func (l countingLease) Refresh(context.Context, time.Duration) error {
	l.b.refreshes.Add(1)
	return nil
}
func (l countingLease) Release(context.Context) error { return nil }

// After the timer was seen very late (a process paused for seconds), the
// watchdog arms and loses early by at most a tenth of a TTL, and does not
// spin: a lock due for renewal is renewed, not re-examined in a loop.
func TestLatenessDoesNotSpin(t *testing.T) {
	b := &countingBackend{}
	a := NewAcquirer(b, 0)
	a.wd.noteLateness(10 * time.Second)
	lk, err := a.TryAcquire(context.Background(), "k", WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	time.Sleep(time.Second)
	if err := lk.Err(); err != nil {
		t.Fatalf("lock lost: %v", err)
	}
	// Renewals every TTL/3 = 100ms, a little early: about 10 in a second.
	if n := b.refreshes.Load(); n < 5 || n > 40 {
		t.Fatalf("%d renewals in 1s with a 300ms TTL", n)
	}
}
