package dlocktest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Concurrent Release calls on a healthy lock all succeed and leave it
// released, never lost.
func testConcurrentRelease(t *testing.T, h Harness) {
	key := Key(t)
	lk := mustAcquire(t, h.New(t), key)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() { errs <- lk.Release(context.Background()) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Release: %v", err)
		}
	}
	if !errors.Is(lk.Err(), dlock.ErrReleased) {
		t.Fatalf("Err() = %v, want ErrReleased", lk.Err())
	}
	lk2 := mustAcquire(t, h.New(t), key)
	release(t, lk2)
}

// Do releases the lock when fn panics, and the panic goes on.
func testDoPanics(t *testing.T, h Harness) {
	key := Key(t)
	func() {
		defer func() {
			if r := recover(); r != "dlocktest panic" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_ = dlock.Do(ctxT(t), h.New(t), key, func(context.Context, *dlock.Lock) error { panic("dlocktest panic") })
	}()
	lk, err := h.New(t).TryAcquire(ctxT(t), key)
	if err != nil {
		t.Fatalf("key not released after fn panicked: %v", err)
	}
	release(t, lk)
}

// Nil contexts and nil handles give errors, never panics (a panic in a
// backend goroutine would kill the process).
func testNilArgs(t *testing.T, h Harness) {
	l := h.New(t)
	//lint:ignore SA1012 nil on purpose
	if _, err := l.Acquire(nil, Key(t)); err == nil { //nolint:staticcheck
		t.Error("Acquire(nil ctx) succeeded")
	}
	//lint:ignore SA1012 nil on purpose
	if _, err := l.TryAcquire(nil, Key(t)); err == nil { //nolint:staticcheck
		t.Error("TryAcquire(nil ctx) succeeded")
	}
	key := Key(t)
	lk := mustAcquire(t, l, key)
	//lint:ignore SA1012 nil on purpose
	if err := lk.Refresh(nil); err == nil { //nolint:staticcheck
		t.Error("Refresh(nil) succeeded")
	}
	time.Sleep(50 * time.Millisecond) // a panic in a backend goroutine would surface now
	//lint:ignore SA1012 nil on purpose
	if err := lk.Release(nil); err != nil { //nolint:staticcheck
		t.Errorf("Release(nil) = %v, want it to release with its own context", err)
	}
	var nl *dlock.Lock
	if err := nl.Release(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release on a nil *Lock = %v, want ErrNotHeld", err)
	}
	if err := nl.Refresh(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh on a nil *Lock = %v, want ErrNotHeld", err)
	}
	lk2 := mustAcquire(t, h.New(t), key)
	release(t, lk2)
}

// Keys with the characters backends give meaning to (hash tags, globs,
// path separators, escapes) work, exclude only themselves, and round-trip.
func testOddKeys(t *testing.T, h Harness) {
	a, b := h.New(t), h.New(t)
	base := Key(t)
	odd := []string{"}", "}x", "{", "{}", "{a}", "a}b{c", "*", "?", "[a-z]", "\\", "%", "%2F", "/", "//", "a/", "/a", "..", ".",
		"\n", " ", "\t", "ü", "日本", "a|b", "|", "|1|x|2", "\x01", "\x7f"}
	for _, k := range odd {
		key := base + k
		if k == "}" || k == "}x" || k == "/" || k == "|" {
			key = k + base // at the start too
		}
		lk, err := a.Acquire(ctxT(t), key)
		if err != nil {
			t.Errorf("Acquire(%q): %v", key, err)
			continue
		}
		if lk.Key() != key {
			t.Errorf("Key() = %q, want %q", lk.Key(), key)
		}
		if _, err := b.TryAcquire(ctxT(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("second TryAcquire(%q) = %v, want ErrNotAcquired", key, err)
		}
		if err := lk.Release(context.Background()); err != nil {
			t.Errorf("Release(%q): %v", key, err)
		}
		lk2, err := b.TryAcquire(ctxT(t), key)
		if err != nil {
			t.Errorf("TryAcquire(%q) after release: %v", key, err)
			continue
		}
		release(t, lk2)
	}
}

// Hierarchical keys never contend: holding a/b/c blocks neither a/b nor a,
// and the reported holder is always the holder of the key asked for.
func testHierarchicalKeys(t *testing.T, h Harness) {
	a, b := h.New(t), h.New(t)
	base := Key(t)
	keys := []string{base + "/a/b", base + "/a", base, base + "/a/bc", base + "/a/b/c"}
	held := map[string]*dlock.Lock{}
	for _, k := range keys {
		lk, err := a.TryAcquire(ctxT(t), k, dlock.WithMetadata("key", k))
		if err != nil {
			t.Fatalf("TryAcquire(%q) while holding %d related keys: %v", k, len(held), err)
		}
		held[k] = lk
	}
	for _, k := range keys {
		_, err := b.TryAcquire(ctxT(t), k)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) {
			t.Fatalf("TryAcquire(%q) of a held key: %v", k, err)
		}
		if h := holder(na); h.Owner != "" && h.Owner != held[k].Owner() {
			t.Errorf("%q reported held by %s, want its own holder %s", k, h.Owner, held[k].Owner())
		}
		if got := holder(na).Metadata["key"]; got != "" && got != k {
			t.Errorf("%q reported held by the holder of %q", k, got)
		}
	}
	for _, k := range keys {
		release(t, held[k])
	}
}

// The largest TTL is honoured as such (no overflow to a short or negative
// lease), and anything larger is refused.
func testLongTTL(t *testing.T, h Harness) {
	l := h.New(t)
	key := Key(t)
	if _, err := l.TryAcquire(ctxT(t), key, dlock.WithTTL(dlock.MaxTTL+time.Millisecond)); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("TTL above MaxTTL: %v, want ErrInvalidTTL", err)
	}
	lk := mustAcquire(t, l, key, dlock.WithTTL(dlock.MaxTTL))
	defer release(t, lk)
	time.Sleep(50 * time.Millisecond)
	_, err := h.New(t).TryAcquire(ctxT(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire of a key held with MaxTTL: %v", err)
	}
	if ttl := holder(na).TTL; ttl != 0 && ttl < dlock.MaxTTL/2 {
		t.Fatalf("a %v lease has %v left on the server: the TTL overflowed", dlock.MaxTTL, ttl)
	}
	if lk.Err() != nil {
		t.Fatalf("lock with MaxTTL lost: %v", lk.Err())
	}
}

// Short leases under contention: every lock is handed out with at least
// a third of its TTL ahead of the Acquire call (its validity counts from
// the attempt's start, not from the answer), and none is lost, nor its
// Release refused, before its local deadline (a holder starved that long
// finds it lost, or its Release finds the lease expired: that is the
// deadline's promise, not a failure; a lease taken or refused by the
// server in time would be one).
func testShortTTLContention(t *testing.T, h Harness) {
	ttl := cmp.Or(h.ShortTTL, 300*time.Millisecond)
	key := Key(t)
	const workers, rounds = 4, 8
	var lost, total atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds*2)
	for w := range workers {
		l := h.New(t)
		wg.Go(func() {
			for range rounds {
				called := time.Now()
				lk, err := l.Acquire(ctxT(t), key, dlock.WithTTL(ttl))
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				total.Add(1)
				// A lock counts from its attempt's start (or a shared
				// lease's last renewal): it is handed out with most of
				// its TTL ahead of the call, however long the call took.
				if left := lk.Deadline().Sub(called); left < ttl/3 {
					lost.Add(1)
					errs <- fmt.Errorf("worker %d: lock handed out with %v of its %v TTL left from the call", w, left, ttl)
				}
				time.Sleep(5 * time.Millisecond)
				// A lock may be lost at its local deadline (a process
				// starved that long; the watchdog may count it lost a
				// little early), never otherwise.
				if err := lk.Err(); err != nil && !lostAtDeadline(err) {
					lost.Add(1)
					errs <- fmt.Errorf("worker %d: lock lost: %w", w, err)
					lk.Release(context.Background())
					continue
				}
				// A release answered after the local deadline may find
				// the lease expired on its way (a starved process): the
				// deadline's promise again. A loss found earlier, by a
				// refused renewal, was reported just above.
				if err := lk.Release(context.Background()); err != nil && !lostAtDeadline(err) &&
					!(errors.Is(err, dlock.ErrNotHeld) && !time.Now().Before(lk.Deadline())) {
					lost.Add(1)
					errs <- fmt.Errorf("worker %d: release: %w", w, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := lost.Load(); n > 0 {
		t.Fatalf("%d of %d locks with a %v TTL were lost other than at their deadline", n, total.Load(), ttl)
	}
}

// lostAtDeadline reports whether err is a loss at the lock's local
// deadline (no renewal succeeded in time).
func lostAtDeadline(err error) bool {
	var le *dlock.LostError
	return errors.As(err, &le) && le.Reason == dlock.LossDeadline
}

// A session backend notices a deletion of its lease on the server by
// itself, well before its next renewal (TTL/3) would.
func testDeletionNoticed(t *testing.T, h Harness) {
	needExpire(t, h)
	key := Key(t)
	lk := mustAcquire(t, h.New(t), key, dlock.WithTTL(time.Minute))
	h.Expire(t, key)
	select {
	case <-lk.Lost():
	case <-time.After(15 * time.Second): // the first renewal is at 20s
		t.Fatal("a deleted lease was not noticed before the next renewal")
	}
	if !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Fatalf("Err() = %v, want ErrNotHeld", lk.Err())
	}
}
