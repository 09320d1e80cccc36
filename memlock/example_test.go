package memlock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func Example() {
	ctx := context.Background()
	l := memlock.New()

	err := dlock.Do(ctx, l, "jobs/nightly", func(ctx context.Context, lk *dlock.Lock) error {
		fmt.Println("running under token", lk.Token())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// running under token 1
	// err: <nil>
}

// Shared holders coexist; an exclusive request is refused while they hold.
func Example_shared() {
	ctx := context.Background()
	l := memlock.New()

	r1, _ := l.TryAcquire(ctx, "config", dlock.WithShared())
	r2, _ := l.TryAcquire(ctx, "config", dlock.WithShared())
	_, err := l.TryAcquire(ctx, "config")
	fmt.Println("writer while read-locked:", errors.Is(err, dlock.ErrNotAcquired))

	r1.Release(ctx)
	r2.Release(ctx)
	w, err := l.TryAcquire(ctx, "config")
	fmt.Println("writer after readers left:", err == nil, "token above theirs:", w.Token() > r2.Token())
	w.Release(ctx)
	// Output:
	// writer while read-locked: true
	// writer after readers left: true token above theirs: true
}

// A counted lock admits at most N holders at a time.
func Example_limit() {
	ctx := context.Background()
	l := memlock.New()

	var held []*dlock.Lock
	for i := 0; i < 3; i++ {
		lk, err := l.TryAcquire(ctx, "downloads", dlock.WithLimit(2))
		if err != nil {
			fmt.Println("attempt", i+1, "refused:", errors.Is(err, dlock.ErrNotAcquired))
			continue
		}
		fmt.Println("attempt", i+1, "holds a permit")
		held = append(held, lk)
	}
	infos, _ := l.List(ctx, "")
	fmt.Println(infos[0].Key, infos[0].Mode, infos[0].Limit, len(infos[0].Holders))
	for _, lk := range held {
		lk.Release(ctx)
	}
	// Output:
	// attempt 1 holds a permit
	// attempt 2 holds a permit
	// attempt 3 refused: true
	// downloads limited 2 2
}
