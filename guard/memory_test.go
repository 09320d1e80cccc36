package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
)

func TestMemoryRules(t *testing.T) {
	var g guard.Memory
	ctx := context.Background()
	ok := func(context.Context) error { return nil }
	must := func(f dlock.Fence, want error) {
		t.Helper()
		err := g.Do(ctx, "r", f, ok)
		if !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Fatalf("Do(%+v) = %v, want %v", f, err, want)
		}
	}
	must(dlock.Fence{Token: 0, Owner: "z"}, dlock.ErrStaleToken)
	must(dlock.Fence{Token: 3, Owner: "a"}, nil)
	must(dlock.Fence{Token: 3, Owner: "a"}, nil)
	must(dlock.Fence{Token: 3, Owner: "b"}, dlock.ErrStaleToken)
	must(dlock.Fence{Token: 2, Owner: "a"}, dlock.ErrStaleToken)
	must(dlock.Fence{Token: 7, Owner: "b"}, nil)
	must(dlock.Fence{Token: 3, Owner: "a"}, dlock.ErrStaleToken)
	if hi, err := g.Highest(ctx, "r"); err != nil || hi.Token != 7 || hi.Owner != "b" {
		t.Fatalf("Highest = %+v, %v", hi, err)
	}
	// Other resources are independent.
	must(dlock.Fence{Token: 1, Owner: "a"}, dlock.ErrStaleToken) // same resource "r"
	if err := g.Do(ctx, "other", dlock.Fence{Token: 1, Owner: "a"}, ok); err != nil {
		t.Fatal(err)
	}
}

func TestMemorySerializesAndHonoursContext(t *testing.T) {
	var g guard.Memory
	inside := make(chan struct{})
	releaseFn := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.Do(context.Background(), "r", dlock.Fence{Token: 1, Owner: "a"}, func(context.Context) error {
			close(inside)
			<-releaseFn
			return nil
		})
	}()
	<-inside
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := g.Do(ctx, "r", dlock.Fence{Token: 2, Owner: "b"}, func(context.Context) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do while busy = %v, want DeadlineExceeded", err)
	}
	close(releaseFn)
	wg.Wait()
	boom := errors.New("boom")
	if err := g.Do(context.Background(), "r", dlock.Fence{Token: 2, Owner: "b"}, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn error = %v", err)
	}
	if hi, err := g.Highest(context.Background(), "r"); err != nil || hi.Token != 2 {
		t.Fatalf("fence not recorded when fn failed: Highest = %+v, %v", hi, err)
	}
}

// Every Memory method reports a nil context as an error wrapping
// dlock.ErrInvalidOption, never a panic, and records no fence. The zero
// Memory and NewMemory's behave alike.
// Symptom: Memory.Do panicked on a nil context.
func TestMemory_NilContextIsAnErrorNotAPanic(t *testing.T) {
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
