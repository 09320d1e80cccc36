package filelock_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

func Example() {
	dir, _ := os.MkdirTemp("", "locks")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	l, err := filelock.New(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = dlock.Do(ctx, l, "nightly-report", func(ctx context.Context, lk *dlock.Lock) error {
		fmt.Println("token", lk.Token())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// token 1
	// err: <nil>
}

// A Guard in the same directory refuses a holder whose lock has passed to
// someone else.
func ExampleGuard() {
	dir, _ := os.MkdirTemp("", "locks")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	g, err := filelock.NewGuard(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	old := dlock.Fence{Token: 1, Owner: "a"}
	cur := dlock.Fence{Token: 2, Owner: "b"}
	fmt.Println(g.Put(ctx, "account", cur, "balance", "120"))
	err = g.Put(ctx, "account", old, "balance", "70")
	fmt.Println("stale write refused:", errors.Is(err, dlock.ErrStaleToken))
	v, ok, _ := g.Get(ctx, "account", cur, "balance")
	fmt.Println(v, ok)
	// Output:
	// <nil>
	// stale write refused: true
	// 120 true
}
