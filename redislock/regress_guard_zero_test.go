package redislock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// The zero Guard (declared as a value, or a literal that forgot NewGuard)
// fails every call with ErrNilClient, as a nil client does, like the zero
// Locker. It used to call a nil client: Put, Get, IncrBy and Eval panicked
// in the goroutine that waits for the reply, which no recover in the
// caller can catch, so the whole process died. (Red-team reproducer.)
func TestRegressZeroGuard(t *testing.T) {
	t.Parallel()
	var g redislock.Guard
	ctx, cancel := context.WithCancel(context.Background()) // a Done channel: the waiting goroutine runs
	defer cancel()
	f := dlock.Fence{Token: 1, Owner: "o"}
	for name, fn := range map[string]func() error{
		"Put":     func() error { return g.Put(ctx, "r", f, "n", "v") },
		"Get":     func() error { _, _, err := g.Get(ctx, "r", f, "n"); return err },
		"IncrBy":  func() error { _, err := g.IncrBy(ctx, "r", f, "n", 1); return err },
		"Eval":    func() error { _, err := g.Eval(ctx, "r", f, "return 1", nil); return err },
		"Highest": func() error { _, err := g.Highest(ctx, "r"); return err },
	} {
		if err := fn(); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("%s on the zero Guard = %v, want ErrNilClient", name, err)
		}
	}
}
