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

// Readers share a key; a writer waits for them, and readers that come
// after a waiting writer wait for it (writer preference).
func ExampleWithShared() {
	l := memlock.New()
	ctx := context.Background()
	r1, _ := l.Acquire(ctx, "catalog", dlock.WithShared())
	r2, _ := l.Acquire(ctx, "catalog", dlock.WithShared())
	fmt.Println("readers:", r1.Token(), r2.Token(), r1.Fence().Shared)

	_, err := l.TryAcquire(ctx, "catalog")
	fmt.Println("writer while readers hold:", errors.Is(err, dlock.ErrNotAcquired))
	r1.Release(ctx)
	r2.Release(ctx)
	w, _ := l.Acquire(ctx, "catalog")
	fmt.Println("writer token above the readers':", w.Token())
	w.Release(ctx)
	// Output:
	// readers: 1 2 true
	// writer while readers hold: true
	// writer token above the readers': 3
}

// A semaphore of 2 permits: each permit is its own lease, with its own
// token and Lost(); a third waits (or TryAcquire is refused).
func ExampleWithLimit() {
	l := memlock.New()
	ctx := context.Background()
	p1, _ := l.Acquire(ctx, "thumbnailer", dlock.WithLimit(2))
	p2, _ := l.Acquire(ctx, "thumbnailer", dlock.WithLimit(2))
	_, err := l.TryAcquire(ctx, "thumbnailer", dlock.WithLimit(2))
	fmt.Println("third permit:", errors.Is(err, dlock.ErrNotAcquired))
	_, err = l.TryAcquire(ctx, "thumbnailer", dlock.WithLimit(3))
	fmt.Println("another limit:", errors.Is(err, dlock.ErrLimitMismatch))
	p1.Release(ctx)
	p2.Release(ctx)
	// Output:
	// third permit: true
	// another limit: true
}

// AcquireAll takes several keys in sorted order, all or none, so two
// transfers between the same accounts never deadlock.
func ExampleAcquireAll() {
	l := memlock.New()
	ctx := context.Background()
	s, err := dlock.AcquireAll(ctx, l, []string{"account/42", "account/7"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, lk := range s.Locks() {
		fmt.Println("holding", lk.Key())
	}
	fmt.Println("release:", s.Release(ctx))
	// Output:
	// holding account/42
	// holding account/7
	// release: <nil>
}

// RunOnce: each replica's scheduler calls it when the job is due; one of
// them runs it, the others skip.
func ExampleRunOnce() {
	l := memlock.New()
	ctx := context.Background()
	for replica := range 3 {
		ran, err := dlock.RunOnce(ctx, l, "nightly-report", 10*time.Minute, time.Minute, func(ctx context.Context) error {
			fmt.Println("replica", replica, "runs the report")
			return nil
		})
		fmt.Println("replica", replica, "ran:", ran, "err:", err)
	}
	// Output:
	// replica 0 runs the report
	// replica 0 ran: true err: <nil>
	// replica 1 ran: false err: <nil>
	// replica 2 ran: false err: <nil>
}
