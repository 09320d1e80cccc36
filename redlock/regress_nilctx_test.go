package redlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption. (Red-team reproducer RT3-RL1: List
// passed the nil context to one goroutine per node, whose nil-pointer
// panic could not be recovered by the caller and crashed the process.)
func TestRegressNilContext(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	var nilCtx context.Context
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, key+"x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, key+"x"); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"dlock.Do", func() error {
			return dlock.Do(nilCtx, l, key+"y", func(context.Context, *dlock.Lock) error { return nil })
		}},
	} {
		if err := tc.fn(); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", tc.name, err)
		}
	}
}
