package dlocktest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
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

// foreignSettings stands for another backend's settings.
type foreignSettings struct{ prefix string }

// ForeignOption returns an option made for settings of package dlocktest,
// which no backend's New applies: it stands for another backend's option
// (zklock.WithPrefix given to etcdlock.New).
func ForeignOption() driver.Option {
	return driver.Setting(func(s *foreignSettings) { s.prefix = "/elsewhere" })
}

// TestRefusesForeignOption holds a Locker built with ForeignOption among its
// options to the contract: its calls fail with an error wrapping
// dlock.ErrInvalidOption that names the option's package, instead of
// locking with the option silently dropped.
func TestRefusesForeignOption(t *testing.T, l dlock.Locker) {
	t.Helper()
	lk, err := l.TryAcquire(Context(t), Key(t))
	if err == nil {
		lk.Release(Context(t))
		t.Fatalf("TryAcquire of a Locker built with another package's option succeeded; want an error wrapping dlock.ErrInvalidOption")
	}
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "dlocktest option") {
		t.Fatalf("TryAcquire of a Locker built with another package's option = %v, want an error wrapping dlock.ErrInvalidOption naming the dlocktest option", err)
	}
}
