package dlocktest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
)

// TestNilLocker holds a backend's nil *Locker (given as a dlock.Locker
// holding a typed nil, e.g. (*redislock.Locker)(nil)) to the contract: every
// call returns an error wrapping dlock.ErrNilClient, never a panic, whatever
// the arguments. Acquire and TryAcquire are called, and List and Break when
// the Locker implements dlock.Lister and dlock.Breaker.
func TestNilLocker(t *testing.T, l dlock.Locker) {
	t.Helper()
	ctx := Context(t)
	calls := []struct {
		name string
		call func() error
	}{
		{"Acquire", func() error { _, err := l.Acquire(ctx, "k"); return err }},
		{"TryAcquire", func() error { _, err := l.TryAcquire(ctx, "k"); return err }},
		{"TryAcquire with a nil context", func() error { _, err := l.TryAcquire(nil, "k"); return err }}, //nolint:staticcheck // bad input on purpose
	}
	if ls, ok := l.(dlock.Lister); ok {
		calls = append(calls, struct {
			name string
			call func() error
		}{"List", func() error { _, err := ls.List(ctx, ""); return err }})
	}
	if b, ok := l.(dlock.Breaker); ok {
		calls = append(calls, struct {
			name string
			call func() error
		}{"Break", func() error { _, err := b.Break(ctx, "k", ""); return err }})
	}
	for _, c := range calls {
		err := callNil(c.call)
		if !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("%T(nil).%s = %v, want an error wrapping dlock.ErrNilClient", l, c.name, err)
		}
	}
}

// callNil runs call, turning a panic into an error that wraps no sentinel.
func callNil(call func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return call()
}

