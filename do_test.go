package dlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Do releases the lock when fn panics, and the panic goes on.
// Symptom: Do and WithLock never released after a panic; the watchdog renewed the lock for ever.
func TestDoReleasesWhenFnPanics(t *testing.T) {
	l := dlock.NewEngine(newSlowClient(newStore()))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic to go on", r)
			}
		}()
		_ = dlock.Do(ctxT(t), l, "k", func(context.Context, *dlock.Lock) error { panic("boom") })
	}()
	if n := dlock.Renewing(l); n != 0 {
		t.Fatalf("%d locks still renewed after the panic", n)
	}
	lk, err := l.TryAcquire(ctxT(t), "k")
	if err != nil {
		t.Fatalf("key not released after the panic: %v", err)
	}
	lk.Release(context.Background())
}

// Do with a typed-nil Locker fails with ErrNilClient.
// Symptom: Do panicked on a typed-nil *memlock.Locker.
func TestDo_TypedNilLockerIsErrNilClient(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("PANIC: Do with a typed-nil *memlock.Locker: %v", r)
		}
	}()
	var m *memlock.Locker
	err := dlock.Do(context.Background(), m, "k", func(context.Context, *dlock.Lock) error { return nil })
	if !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Do(nil *memlock.Locker) = %v, want ErrNilClient", err)
	}
}
