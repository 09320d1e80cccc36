package guard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
)

// Memory.Do reports a nil context as an error wrapping
// dlock.ErrInvalidOption, never a panic, and records no fence. (Red-team
// reproducer RT3-F1.)
func TestRegressNilContext(t *testing.T) {
	var m guard.Memory
	var nilCtx context.Context
	ran := false
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("PANIC: %v", r)
			}
		}()
		return m.Do(nilCtx, "r", dlock.Fence{Token: 3, Owner: "me"}, func(context.Context) error { ran = true; return nil })
	}()
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Memory.Do(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", err)
	}
	if ran {
		t.Error("Memory.Do(nil ctx) ran its function")
	}
	if hi := m.Highest("r"); hi != (dlock.Fence{}) {
		t.Errorf("after Memory.Do(nil ctx): Highest = %+v, want no fence recorded", hi)
	}
}
