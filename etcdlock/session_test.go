package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

func TestSameClientTwoLocksExclude(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	a, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second lock through the same Locker: %v", err)
	}
	got := make(chan *dlock.Lock, 1)
	go func() {
		b, err := l.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("second Acquire through the same Locker did not wait")
	default:
	}
	a.Release(ctx)
	b := <-got
	if b == nil || b.Token() <= a.Token() {
		t.Fatalf("second lock %v", b)
	}
	b.Release(ctx)
}

// A short lock taken on a shared lease that is no longer fresh for the
// lock's own TTL (but still is for the lease's, which etcd raises to its
// minimum) is alive when it is handed out.
// Symptom: a 300ms lock on a reused lease was handed out already lost.
func TestShortTTLOnReusedLeaseIsAliveAtBirth(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ttl := dlock.WithTTL(300 * time.Millisecond)
	for i := 0; i < 3; i++ {
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), ttl)
		if err != nil {
			t.Fatal(err)
		}
		lk.Release(context.Background())
		time.Sleep(400 * time.Millisecond) // > the lock's TTL, < a third of etcd's 2s minimum lease
		lk, err = l.TryAcquire(dlocktest.Context(t), dlocktest.Key(t), ttl)
		if err != nil {
			t.Fatalf("TryAcquire on a reused lease: %v", err)
		}
		if lk.Err() != nil || !time.Now().Before(lk.Deadline()) {
			t.Fatalf("lock handed out already lost (deadline %v ago): %v", time.Since(lk.Deadline()), lk.Err())
		}
		lk.Release(context.Background())
	}
}
