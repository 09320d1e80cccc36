package filelock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption, never a panic. (Red-team reproducer
// RT3-F1: List, Guard.Do and Guard.Highest panicked; Put and Get came
// with the guard vocabulary.)
func TestRegressNilContext(t *testing.T) {
	l, err := filelock.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lk, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	g := mustGuard(t, t.TempDir())
	var nilCtx context.Context
	f := lk.Fence()
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, "x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, "x"); return err }},
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"Guard.Do", func() error { return g.Do(nilCtx, "r", f, fn) }},
		{"Guard.Highest", func() error { _, err := g.Highest(nilCtx, "r"); return err }},
		{"Guard.Put", func() error { return g.Put(nilCtx, "r", f, "n", "v") }},
		{"Guard.Get", func() error { _, _, err := g.Get(nilCtx, "r", f, "n"); return err }},
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("PANIC: %v", r)
				}
			}()
			return c.fn()
		}()
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", c.name, err)
		}
	}
	if ran {
		t.Error("Guard.Do(nil ctx) ran its function")
	}
	if hi, err := g.Highest(context.Background(), "r"); err != nil || hi != (dlock.Fence{}) {
		t.Errorf("after Guard.Do(nil ctx): Highest = %+v, %v; want no fence recorded", hi, err)
	}
}
