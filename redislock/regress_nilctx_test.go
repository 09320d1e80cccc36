package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// callNil runs fn, turning a panic into an error that says so, and fails
// the test if fn does not return in time.
func callNil(t *testing.T, name string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("PANIC: %v", r)
			}
		}()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("%s(nil ctx) still blocked after %v", name, dlocktest.HangTimeout)
		return nil
	}
}

// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption, never a panic or a hang. (Red-team
// reproducer RT3-R4: List and the Guard methods panicked.)
func TestRegressNilContext(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	g := redislock.NewGuard(newClient(t, srv))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	var nilCtx context.Context
	f := lk.Fence()
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, key+"x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, key+"x"); return err }},
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"Guard.Eval", func() error { _, err := g.Eval(nilCtx, "res", f, "return 1", nil); return err }},
		{"Guard.Put", func() error { return g.Put(nilCtx, "res", f, "n", "v") }},
		{"Guard.Get", func() error { _, _, err := g.Get(nilCtx, "res", f, "n"); return err }},
		{"Guard.IncrBy", func() error { _, err := g.IncrBy(nilCtx, "res", f, "c", 1); return err }},
		{"Guard.Highest", func() error { _, err := g.Highest(nilCtx, "res"); return err }},
		{"nil-client Guard.Put", func() error { return redislock.NewGuard(nil).Put(nilCtx, "res", f, "n", "v") }},
		{"dlock.Do", func() error {
			return dlock.Do(nilCtx, l, key+"y", func(context.Context, *dlock.Lock) error { return nil })
		}},
	} {
		if err := callNil(t, c.name, c.fn); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", c.name, err)
		}
	}
}
