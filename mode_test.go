package dlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Contradictory or invalid mode options (WithShared with WithLimit in
// either order, a bad limit, also when another mode option follows it)
// are an error wrapping ErrInvalidOption, before any I/O; repeated
// options of one mode stay valid (the last limit wins).
// Symptom: WithLimit(-1), WithShared() took a shared lock: the last mode option won.
func TestModeOptions_ConflictsAreRefused(t *testing.T) {
	ctx := context.Background()
	l := memlock.New()
	for name, opts := range map[string][]dlock.Option{
		"limit(-1) then shared": {dlock.WithLimit(-1), dlock.WithShared()},
		"limit(0) then shared":  {dlock.WithLimit(0), dlock.WithShared()},
		"limit(3) then shared":  {dlock.WithLimit(3), dlock.WithShared()},
		"shared then limit(3)":  {dlock.WithShared(), dlock.WithLimit(3)},
		"limit(-1) then limit":  {dlock.WithLimit(-1), dlock.WithLimit(3)},
		"limit(max+1)":          {dlock.WithLimit(dlock.MaxLimit + 1)},
	} {
		lk, err := l.TryAcquire(ctx, "conflict", opts...)
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s: got lock %+v, err %v; want ErrInvalidOption", name, lk.Fence(), err)
		}
		if lk != nil {
			lk.Release(ctx)
		}
	}
	// What stays valid: repeated options of one mode (the last limit
	// wins) and nil options.
	lk, err := l.TryAcquire(ctx, "ok", nil, dlock.WithLimit(2), dlock.WithLimit(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "ok", dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("second permit of a WithLimit(2), WithLimit(1) key: %v, want ErrNotAcquired (the last limit wins)", err)
	}
	lk.Release(ctx)
	sh, err := l.TryAcquire(ctx, "ok", dlock.WithShared(), dlock.WithShared())
	if err != nil || !sh.Fence().Shared {
		t.Fatalf("WithShared twice: %v", err)
	}
	sh.Release(ctx)
}
