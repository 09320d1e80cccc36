package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/memlock"
)

// RunOnce promises that at most one replica runs the job; a shared or
// multi-permit lock lets every replica in, so such options must be refused.
func TestRedTeam14_RunOnceRefusesSharingModes(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opt  dlock.Option
	}{{"shared", dlock.WithShared()}, {"limit2", dlock.WithLimit(2)}} {
		t.Run(tc.name, func(t *testing.T) {
			key := "rt14/job/" + tc.name
			runs := 0
			inside := make(chan struct{})
			second := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := dlock.RunOnce(ctx, l, key, time.Minute, 0, func(context.Context) error {
					runs++
					close(inside)
					<-second
					return nil
				}, tc.opt)
				done <- err
			}()
			select {
			case <-inside:
			case err := <-done:
				if !errors.Is(err, dlock.ErrInvalidOption) {
					t.Fatalf("RunOnce with %s = %v, want ErrInvalidOption", tc.name, err)
				}
				return // refused: the fix
			}
			ran, err := dlock.RunOnce(ctx, l, key, time.Minute, 0, func(context.Context) error { return nil }, tc.opt)
			close(second)
			<-done
			if ran {
				t.Errorf("RunOnce with %s: two replicas ran the job at once (err %v)", tc.name, err)
			}
		})
	}
	// Limit 1 is one runner: still allowed.
	ran, err := dlock.RunOnce(ctx, l, "rt14/job/limit1", time.Minute, 0, func(context.Context) error { return nil }, dlock.WithLimit(1))
	if !ran || err != nil {
		t.Errorf("RunOnce with WithLimit(1) = %v, %v", ran, err)
	}
}

// RunOnce's release after fn must honour the caller's context against a
// hung service: it returned only after DefaultReleaseTimeout (5s), its own
// deadline stripped by context.WithoutCancel.
func TestRedTeam14_RunOnceReleaseHonoursContext(t *testing.T) {
	dir := t.TempDir()
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var heal func()
	start := time.Now()
	ran, err := dlock.RunOnce(ctx, l, "rt14/hung", time.Minute, 0, func(context.Context) error {
		heal = rt14HangFile(t, dir, "rt14/hung")
		return nil
	})
	took := time.Since(start)
	if heal != nil {
		heal()
	}
	// The release goes on in the background once healed: let it finish
	// before the directory is removed.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if infos, _ := l.List(context.Background(), "rt14/"); len(infos) == 0 {
			break
		}
	}
	if !ran {
		t.Fatalf("RunOnce did not run: %v", err)
	}
	if took >= dlock.DefaultReleaseTimeout-time.Second {
		t.Errorf("RunOnce returned %v after its start against a hung release, its context ended after 300ms", took)
	}
}

// WithMaxHold given to RunOnce applies "as for TryAcquire": a cap below
// atMostFor must not be raised to atMostFor (fn's context was cancelled
// only at atMostFor).
func TestRedTeam14_RunOnceKeepsCallerMaxHold(t *testing.T) {
	l := memlock.New()
	ran, err := dlock.RunOnce(context.Background(), l, "rt14/maxhold", time.Minute, 0, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(3 * time.Second):
			return errors.New("fn's context outlived the caller's WithMaxHold(300ms)")
		}
	}, dlock.WithTTL(time.Second), dlock.WithMaxHold(300*time.Millisecond))
	if !ran {
		t.Fatalf("RunOnce did not run: %v", err)
	}
	if err != nil && !errors.Is(err, dlock.ErrLockLost) {
		t.Error(err)
	}
	// A cap below atLeastFor cannot keep the key held that long: refused.
	if _, err := dlock.RunOnce(context.Background(), l, "rt14/maxhold2", time.Minute, 10*time.Second, func(context.Context) error { return nil }, dlock.WithTTL(10*time.Second), dlock.WithMaxHold(time.Second)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("WithMaxHold below atLeastFor = %v, want ErrInvalidOption", err)
	}
}
