package dlock_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// BenchmarkObservedTryAcquireRelease measures an uncontended TryAcquire
// plus Release on memlock without any Observer, with a Locker Observer,
// and with a per-call Observer: the price of observing, and that a call
// without an Observer pays nothing for the hooks.
func BenchmarkObservedTryAcquireRelease(b *testing.B) {
	nop := dlock.ObserverFunc(func(dlock.Event) {})
	cases := []struct {
		name string
		l    dlock.Locker
		opts []dlock.Option
	}{
		{"none", memlock.New(), nil},
		{"locker", memlock.New(dlock.WithObserver(nop)), nil},
		{"call", memlock.New(), []dlock.Option{dlock.WithCallObserver(nop)}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				lk, err := c.l.TryAcquire(ctx, "bench", c.opts...)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
