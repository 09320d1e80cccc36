package guard_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
)

// A holder that paused past its lease comes back with an old fence after
// the next holder read the balance: its write is refused, and the refusal
// is reported to the guard's Observer.
func ExampleMemory() {
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		fmt.Printf("observer: %s %s token %d < %d\n", e.Kind, e.Key, e.Token, e.Highest)
	})
	g := guard.NewMemory(dlock.WithObserver(obs))
	ctx := context.Background()

	// In a real program the fences come from Lock.Fence().
	oldHolder := dlock.Fence{Token: 41, Owner: "worker-a"}
	newHolder := dlock.Fence{Token: 42, Owner: "worker-b"}

	_ = g.Put(ctx, "account:7", oldHolder, "balance", "100")

	// worker-a pauses; its lease expires and worker-b takes the lock and
	// reads the balance (a fenced read: worker-a is fenced out from now).
	v, ok, _ := g.Get(ctx, "account:7", newHolder, "balance")
	fmt.Println("worker-b reads", v, ok)

	// worker-a resumes and writes.
	err := g.Put(ctx, "account:7", oldHolder, "balance", "0")
	fmt.Println(errors.Is(err, dlock.ErrStaleToken), err)

	// A reader holding a shared lock at or above the highest token is
	// admitted and fences no one out.
	reader := dlock.Fence{Token: 43, Owner: "reader", Shared: true}
	v, _, _ = g.Get(ctx, "account:7", reader, "balance")
	hi, _ := g.Highest(ctx, "account:7")
	fmt.Println("reader reads", v, "highest", hi.Token, hi.Owner)

	// Output:
	// worker-b reads 100 true
	// observer: rejected account:7 token 41 < 42
	// true dlock: stale fencing token for "account:7": token 41 < highest accepted 42
	// reader reads 100 highest 42 worker-b
}

// Do runs code under the fence check, for a resource in the guard's
// process.
func ExampleMemory_Do() {
	g := guard.NewMemory()
	ctx := context.Background()
	balance := 100
	err := g.Do(ctx, "account:7", dlock.Fence{Token: 5, Owner: "a"}, func(context.Context) error {
		balance -= 30
		return nil
	})
	fmt.Println(err, balance)
	err = g.Do(ctx, "account:7", dlock.Fence{Token: 4, Owner: "b"}, func(context.Context) error {
		balance = 0
		return nil
	})
	fmt.Println(errors.Is(err, dlock.ErrStaleToken), balance)
	// Output:
	// <nil> 70
	// true 70
}
