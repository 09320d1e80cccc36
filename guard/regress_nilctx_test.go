package guard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
)

// Every Memory method reports a nil context as an error wrapping
// dlock.ErrInvalidOption, never a panic, and records no fence. The zero
// Memory and NewMemory's behave alike. (Red-team reproducer RT3-F1, for
// Do; Put, Get and Highest came with the Guard vocabulary.)
func TestRegressNilContext(t *testing.T) {
	for name, m := range map[string]*guard.Memory{"zero": new(guard.Memory), "NewMemory": guard.NewMemory()} {
		var nilCtx context.Context
		f := dlock.Fence{Token: 3, Owner: "me"}
		ran := false
		for _, c := range []struct {
			name string
			fn   func() error
		}{
			{"Do", func() error {
				return m.Do(nilCtx, "r", f, func(context.Context) error { ran = true; return nil })
			}},
			{"Put", func() error { return m.Put(nilCtx, "r", f, "n", "v") }},
			{"Get", func() error { _, _, err := m.Get(nilCtx, "r", f, "n"); return err }},
			{"Highest", func() error { _, err := m.Highest(nilCtx, "r"); return err }},
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
				t.Errorf("%s: Memory.%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", name, c.name, err)
			}
		}
		if ran {
			t.Errorf("%s: Memory.Do(nil ctx) ran its function", name)
		}
		if hi, err := m.Highest(context.Background(), "r"); err != nil || hi != (dlock.Fence{}) {
			t.Errorf("%s: after nil-ctx calls: Highest = %+v, %v; want no fence recorded", name, hi, err)
		}
	}
}
