package etcdlock_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// The exclusive path's cost: an uncontended TryAcquire and Release, and a
// handoff to a queued waiter. (Shared and limited locks must not make it
// slower.)
func BenchmarkExclusive(b *testing.B) {
	c := etcdtest.Start(b, 1)
	l := etcdlock.New(newClient(b, c.Endpoints()))
	ctx := context.Background()
	b.Run("TryRelease", func(b *testing.B) {
		key := dlocktest.Key(b)
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Handoff", func(b *testing.B) {
		key := dlocktest.Key(b)
		other := etcdlock.New(newClient(b, c.Endpoints()))
		lk, err := l.Acquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			ch := make(chan *dlock.Lock, 1)
			go func() {
				next, err := other.Acquire(ctx, key)
				if err != nil {
					b.Error(err)
				}
				ch <- next
			}()
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
			if lk = <-ch; lk == nil {
				b.FailNow()
			}
			l, other = other, l
		}
		_ = lk.Release(ctx)
	})
}
