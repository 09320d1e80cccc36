package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/memlock"
)

// A typed-nil Observer (ObserverFunc(nil), a nil *T) used to panic with a
// nil dereference on the first Event; it now counts as no Observer.
func TestRegressTypedNilObserver(t *testing.T) {
	ctx := context.Background()
	l := memlock.New(dlock.WithObserver(dlock.ObserverFunc(nil)))
	lk, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("TryAcquire with ObserverFunc(nil): %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if o := dlock.ObserverOf(nil); o != nil {
		t.Errorf("ObserverOf(nil) = %v, want nil", o)
	}
	if o := dlock.ObserverOf([]driver.Option{dlock.WithObserver(dlock.ObserverFunc(nil))}); o != nil {
		t.Errorf("ObserverOf(typed nil) = %v, want nil", o)
	}
}

// An Observer that panicked on EventAcquire used to unwind TryAcquire
// after the lock was granted: the caller (recovering the panic, as an HTTP
// server does) never got the *Lock, and the watchdog renewed the lease for
// ever, so the key stayed held with nobody able to release it. The panic
// is now recovered and the Event dropped.
func TestRegressPanickingObserverLeaksLock(t *testing.T) {
	ctx := context.Background()
	var seen []dlock.EventKind
	l := memlock.New(dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
		seen = append(seen, e.Kind)
		panic("observer bug")
	})))
	var (
		lk  *dlock.Lock
		err error
	)
	if p := safely(func() { lk, err = l.TryAcquire(ctx, "k", dlock.WithTTL(200*time.Millisecond)) }); p != nil {
		t.Fatalf("TryAcquire panicked with the Observer's panic: %v", p)
	}
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if p := safely(func() { err = lk.Release(ctx) }); p != nil || err != nil {
		t.Fatalf("Release: panic %v, err %v", p, err)
	}
	if infos, _ := l.List(ctx, ""); len(infos) != 0 {
		t.Fatalf("key still held after Release: %+v", infos)
	}
	if len(seen) < 4 { // wait, attempt, acquire, release
		t.Errorf("Observer saw %v: a panic must drop only its own Event", seen)
	}
}

// A guard's Observer that panicked on EventRejected used to unwind
// guard.Memory with the resource's mutex held: every later Put, Get,
// Do and Highest on the resource hung for ever.
func TestRegressGuardObserverPanicWedges(t *testing.T) {
	ctx := context.Background()
	m := guard.NewMemory(dlock.WithObserver(dlock.ObserverFunc(func(dlock.Event) { panic("observer bug") })))
	if err := m.Put(ctx, "r", dlock.Fence{Token: 5, Owner: "a"}, "n", "v"); err != nil {
		t.Fatal(err)
	}
	var err error
	if p := safely(func() { err = m.Put(ctx, "r", dlock.Fence{Token: 4, Owner: "b"}, "n", "w") }); p != nil {
		t.Fatalf("Put panicked with the Observer's panic: %v", p)
	}
	if !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("stale Put: %v, want ErrStaleToken", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := m.Highest(cctx, "r"); err != nil {
			t.Error(err)
		}
		if _, _, err := m.Get(cctx, "r", dlock.Fence{Token: 6, Owner: "c"}, "n"); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the resource is wedged after an Observer panic")
	}
}

func safely(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}
