package dlocktest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Modes: a backend either offers shared and counted locks with their
// semantics, or refuses them with an error wrapping dlock.ErrUnsupported
// that names the mode: never a silent exclusive lock.
func testModes(t *testing.T, h Harness) {
	t.Run("Shared", func(t *testing.T) {
		a, b := h.New(t), h.New(t)
		key := Key(t)
		r1, err := a.TryAcquire(ctxT(t), key, dlock.WithShared())
		if errors.Is(err, dlock.ErrUnsupported) {
			if !strings.Contains(err.Error(), "shared") {
				t.Fatalf("refusal does not name the mode: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("first shared TryAcquire: %v", err)
		}
		defer release(t, r1)
		r2, err := b.TryAcquire(ctxT(t), key, dlock.WithShared())
		if err != nil {
			t.Fatalf("second shared holder refused: %v", err)
		}
		defer release(t, r2)
		if !r1.Fence().Shared || r1.Token() == r2.Token() {
			t.Fatalf("shared fences %+v %+v: want Shared and distinct tokens", r1.Fence(), r2.Fence())
		}
		_, err = b.TryAcquire(ctxT(t), key)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) {
			t.Fatalf("exclusive TryAcquire while shared holders hold: %v, want ErrNotAcquired", err)
		}
		if n := len(na.Holders); n != 0 && n != 2 {
			t.Errorf("NotAcquiredError names %d holders, want the 2 readers", n)
		}
		release(t, r1)
		release(t, r2)
		w := mustAcquire(t, b, key)
		defer release(t, w)
		if w.Token() <= max(r1.Token(), r2.Token()) {
			t.Fatalf("writer token %d not above the readers' %d, %d", w.Token(), r1.Token(), r2.Token())
		}
		if _, err := a.TryAcquire(ctxT(t), key, dlock.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("shared TryAcquire while a writer holds: %v, want ErrNotAcquired", err)
		}
	})
	t.Run("Limited", func(t *testing.T) {
		key := Key(t)
		p1, err := h.New(t).TryAcquire(ctxT(t), key, dlock.WithLimit(2))
		if errors.Is(err, dlock.ErrUnsupported) {
			if !strings.Contains(err.Error(), "limited") {
				t.Fatalf("refusal does not name the mode: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("first permit: %v", err)
		}
		defer release(t, p1)
		p2, err := h.New(t).TryAcquire(ctxT(t), key, dlock.WithLimit(2))
		if err != nil {
			t.Fatalf("second of 2 permits refused: %v", err)
		}
		defer release(t, p2)
		if _, err := h.New(t).TryAcquire(ctxT(t), key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("third of 2 permits: %v, want ErrNotAcquired", err)
		}
		if _, err := h.New(t).TryAcquire(ctxT(t), key, dlock.WithLimit(3)); err == nil || errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("a permit with a different limit on a held semaphore: %v, want an error", err)
		}
		if _, err := h.New(t).TryAcquire(ctxT(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("exclusive TryAcquire on a held semaphore: %v, want ErrNotAcquired", err)
		}
	})
	t.Run("BadLimit", func(t *testing.T) {
		for _, n := range []int{0, -1, dlock.MaxLimit + 1} {
			if _, err := h.New(t).TryAcquire(ctxT(t), Key(t), dlock.WithLimit(n)); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("WithLimit(%d): %v, want ErrInvalidOption", n, err)
			}
		}
	})
}

// Listing: a Locker that implements dlock.Lister shows a held key with its
// holder and how long it has held it, filters by prefix and forgets a
// released key.
func testList(t *testing.T, h Harness) {
	l := h.New(t)
	ls, ok := l.(dlock.Lister)
	if !ok {
		t.Skip("the Locker does not implement dlock.Lister")
	}
	if _, err := ls.List(ctxT(t), ""); errors.Is(err, dlock.ErrUnsupported) {
		t.Skipf("the Locker cannot list: %v", err)
	}
	if _, err := ls.List(nil, ""); err == nil { //nolint:staticcheck // nil context on purpose
		t.Error("List with a nil context: no error")
	}
	key := Key(t)
	before := time.Now()
	lk := mustAcquire(t, l, key+"/a")
	const held = 20 * time.Millisecond
	time.Sleep(held)
	infos, err := ls.List(ctxT(t), key+"/")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(infos) != 1 || infos[0].Key != key+"/a" || len(infos[0].Holders) != 1 {
		t.Fatalf("List(%q) = %+v, want the one held key with one holder", key+"/", infos)
	}
	if hd := infos[0].Holders[0]; (hd.Owner != "" && hd.Owner != lk.Owner()) || (hd.Token != 0 && hd.Token != lk.Token()) {
		t.Errorf("holder %+v, want owner %s token %d", hd, lk.Owner(), lk.Token())
	}
	// HeldFor: at least the time slept since Acquire returned, at most
	// the time since it was called (plus a second for a service's clock
	// and the millisecond granularity of MetaAcquired).
	if hd, most := infos[0].Holders[0], time.Since(before)+time.Second; hd.HeldFor < held || hd.HeldFor > most {
		t.Errorf("holder's HeldFor = %v, want it in [%v, %v]", hd.HeldFor, held, most)
	}
	if infos, err := ls.List(ctxT(t), key+"/b"); err != nil || len(infos) != 0 {
		t.Errorf("List of another prefix = %+v, %v; want none", infos, err)
	}
	release(t, lk)
	if infos, err := ls.List(ctxT(t), key+"/"); err != nil || len(infos) != 0 {
		t.Errorf("List after release = %+v, %v; want none", infos, err)
	}
}
