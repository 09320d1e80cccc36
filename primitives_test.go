package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func TestSetNilAndZero(t *testing.T) {
	var s *dlock.Set
	if s.Locks() != nil || s.Lock("k") != nil {
		t.Error("nil Set has locks")
	}
	<-s.Lost()
	if err := s.Err(); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("nil Set Err = %v", err)
	}
	if err := s.Release(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("nil Set Release = %v", err)
	}
	var z dlock.Set
	<-z.Lost()
	if err := z.Release(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("zero Set Release = %v", err)
	}
	ctx, cancel := s.Context(nil)
	defer cancel()
	<-ctx.Done()
	if _, err := dlock.AcquireAll(context.Background(), nil, []string{"k"}); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("AcquireAll(nil Locker) = %v", err)
	}
	var nl *memlock.Locker
	if _, err := dlock.TryAcquireAll(context.Background(), nl, []string{"k"}); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("TryAcquireAll(typed nil Locker) = %v", err)
	}
}

func TestSetReleaseTwiceAndContext(t *testing.T) {
	l := memlock.New()
	s, err := dlock.AcquireAll(context.Background(), l, []string{"b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := s.Context(context.Background())
	defer cancel()
	if s.Err() != nil || ctx.Err() != nil {
		t.Fatalf("held set: Err %v ctx %v", s.Err(), ctx.Err())
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatalf("second Release = %v", err)
	}
	<-ctx.Done()
	if !errors.Is(s.Err(), dlock.ErrReleased) || !errors.Is(context.Cause(ctx), dlock.ErrReleased) {
		t.Fatalf("after Release: Err %v cause %v", s.Err(), context.Cause(ctx))
	}
}

// A failed AcquireAll releases what it took also when the caller's
// context is what ended (the releases use their own).
func TestAcquireAllCancelledReleases(t *testing.T) {
	l := memlock.New()
	held, _ := l.Acquire(context.Background(), "b")
	defer held.Release(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := dlock.AcquireAll(ctx, l, []string{"a", "b"}); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireAll = %v", err)
	}
	lk, err := l.TryAcquire(context.Background(), "a")
	if err != nil {
		t.Fatalf("a after the failed AcquireAll: %v", err)
	}
	lk.Release(context.Background())
}

func TestRunOnceReleasesOnPanic(t *testing.T) {
	l := memlock.New()
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on")
			}
		}()
		dlock.RunOnce(context.Background(), l, "job", time.Minute, 0, func(context.Context) error { panic("boom") })
	}()
	lk, err := l.TryAcquire(context.Background(), "job")
	if err != nil {
		t.Fatalf("the key after a panicking job: %v", err)
	}
	lk.Release(context.Background())
}

func TestRunOnceKeepsAtLeastFor(t *testing.T) {
	l := memlock.New()
	const atLeast = 300 * time.Millisecond
	start := time.Now()
	ran, err := dlock.RunOnce(context.Background(), l, "job", time.Minute, atLeast, func(context.Context) error { return nil })
	if !ran || err != nil {
		t.Fatalf("RunOnce = %v, %v", ran, err)
	}
	if _, err := l.TryAcquire(context.Background(), "job"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("right after a quick run: %v, want the key held", err)
	}
	lk, err := l.Acquire(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	if el := time.Since(start); el < atLeast {
		t.Fatalf("the key was free %v after the run started, before atLeastFor %v", el, atLeast)
	}
}

func TestRunOnceJobError(t *testing.T) {
	l := memlock.New()
	boom := errors.New("boom")
	ran, err := dlock.RunOnce(context.Background(), l, "job", time.Minute, 0, func(context.Context) error { return boom })
	if !ran || !errors.Is(err, boom) || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("RunOnce = %v, %v; want ran and only the job's error", ran, err)
	}
	if ran, err := dlock.RunOnce(nil, l, "job", time.Minute, 0, func(context.Context) error { return nil }); ran || !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck // nil context on purpose
		t.Fatalf("nil context: %v %v", ran, err)
	}
	if ran, err := dlock.RunOnce(context.Background(), nil, "job", time.Minute, 0, func(context.Context) error { return nil }); ran || !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("nil Locker: %v %v", ran, err)
	}
	if ran, err := dlock.RunOnce(context.Background(), l, "", time.Minute, 0, func(context.Context) error { return nil }); ran || !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("empty key: %v %v", ran, err)
	}
}
