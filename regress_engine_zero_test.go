package dlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
)

// The zero Engine (a backend's Locker declared as a value, or a struct
// literal that forgot NewEngine) used to panic with a nil pointer
// dereference in Acquire; every call now fails with ErrNilClient, like a
// nil *Engine.
func TestRegressZeroEngine(t *testing.T) {
	var e dlock.Engine
	ctx := context.Background()
	if _, err := e.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("TryAcquire on the zero Engine: %v, want ErrNilClient", err)
	}
	if _, err := e.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Acquire on the zero Engine: %v, want ErrNilClient", err)
	}
	if err := e.Check(ctx); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Check on the zero Engine: %v, want ErrNilClient", err)
	}
	if err := dlock.NewEngine(nil).Err(); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("NewEngine(nil).Err() = %v, want ErrNilClient", err)
	}
	if err := dlock.FailedEngine(nil).Err(); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("FailedEngine(nil).Err() = %v, want ErrNilClient", err)
	}
}
