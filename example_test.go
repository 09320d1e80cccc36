package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/memlock"
)

func ExampleDo() {
	l := memlock.New() // in production: redislock.New(client), filelock.New(dir), ...
	ctx := context.Background()
	err := dlock.Do(ctx, l, "nightly-batch", func(ctx context.Context, lk *dlock.Lock) error {
		fmt.Println("running the batch with token", lk.Token())
		return nil
	}, dlock.WithTTL(10*time.Second))
	fmt.Println("err:", err)
	// Output:
	// running the batch with token 1
	// err: <nil>
}

func ExampleLocker_TryAcquire() {
	l := memlock.New()
	ctx := context.Background()
	held, _ := l.Acquire(ctx, "report")
	defer held.Release(ctx)

	_, err := l.TryAcquire(ctx, "report")
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	// Output: true
}

// A holder that paused past its lease comes back with an old token; the
// guard refuses its write.
func ExampleFence() {
	l := memlock.New()
	var g guard.Memory
	ctx := context.Background()
	balance := 100

	first, _ := l.Acquire(ctx, "account:7", dlock.WithTTL(200*time.Millisecond), dlock.WithAutoRefresh(false))
	<-first.Lost() // first holder "pauses" past its TTL

	second, _ := l.Acquire(ctx, "account:7")
	_ = g.Do(ctx, "account:7", second.Fence(), func(context.Context) error { balance -= 30; return nil })
	second.Release(ctx)

	err := g.Do(ctx, "account:7", first.Fence(), func(context.Context) error { balance = 0; return nil })
	fmt.Println(errors.Is(err, dlock.ErrStaleToken), balance)
	// Output: true 70
}

// An Observer sees every acquisition, wait, renewal, loss and release:
// the place for metrics, logs and traces. Observe is called synchronously,
// sometimes from the watchdog: keep it fast and never block in it.
func ExampleWithObserver() {
	var mu sync.Mutex
	obs := dlock.ObserverFunc(func(ev dlock.Event) {
		if ev.Kind == dlock.EventAttempt || ev.Kind == dlock.EventRenew {
			return // timing-dependent; not printed here
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(ev.Backend, ev.Kind, ev.Key, ev.Result, ev.Token)
	})
	l := memlock.New(dlock.WithObserver(obs))
	ctx := context.Background()
	lk, _ := l.TryAcquire(ctx, "report")
	lk.Release(ctx)
	// Output:
	// memory wait report  0
	// memory acquire report acquired 1
	// memory release report  1
}
