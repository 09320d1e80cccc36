package dlocktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// ModesEdges checks the edges of the sharing modes on one Locker that is
// also a dlock.Lister: hierarchical keys in different modes never contend;
// List reports each key's mode, limit and holders; a limit of 1 is a
// semaphore, not an exclusive lock; MaxLimit works and a neighbouring
// limit is a mismatch; a mismatch against holders whose leases are gone
// is none (the next grant sets the limit afresh, with a higher token); a
// writer waiting on a key whose last reader leaves gets it before any new
// reader, with a token above every reader's. It needs h.New and h.Expire.
// Not part of TestLocker: a backend opts in by calling it.
func ModesEdges(t *testing.T, h Harness) {
	t.Helper()
	ctx := ctxT(t)
	base := Key(t)
	ll := h.New(t)
	l, ok := ll.(interface {
		dlock.Locker
		dlock.Lister
	})
	if !ok {
		t.Fatalf("%T is not a dlock.Lister", ll)
	}
	a, ab, abc := base+"/a", base+"/a/b", base+"/a/b/c"
	// Hierarchical keys never contend, whatever their modes.
	x, err := l.TryAcquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.TryAcquire(ctx, ab, dlock.WithShared())
	if err != nil {
		t.Fatalf("shared a/b under an exclusive a: %v", err)
	}
	p, err := l.TryAcquire(ctx, abc, dlock.WithLimit(dlock.MaxLimit))
	if err != nil {
		t.Fatalf("WithLimit(MaxLimit) a/b/c: %v", err)
	}
	infos, err := l.List(ctx, base+"/")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		key   string
		mode  dlock.Mode
		limit int
		tok   uint64
	}{{a, dlock.Exclusive, 0, x.Token()}, {ab, dlock.Shared, 0, s.Token()}, {abc, dlock.Limited, dlock.MaxLimit, p.Token()}}
	if len(infos) != len(want) {
		t.Fatalf("List = %+v", infos)
	}
	for i, w := range want {
		in := infos[i]
		if in.Key != w.key || in.Mode != w.mode || in.Limit != w.limit || len(in.Holders) != 1 || in.Holders[0].Token != w.tok || in.Holders[0].Mode != w.mode {
			t.Errorf("List[%d] = %+v, want %s %s limit %d token %d", i, in, w.key, w.mode, w.limit, w.tok)
		}
	}
	// Limit 1 is a semaphore, not an exclusive lock: modes do not mix.
	one := base + "/one"
	p1, err := l.TryAcquire(ctx, one, dlock.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, one); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("exclusive over WithLimit(1): %v", err)
	}
	if _, err := l.TryAcquire(ctx, one, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrLimitMismatch) {
		t.Errorf("second WithLimit(1): %v", err)
	}
	if _, err := l.TryAcquire(ctx, one, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Errorf("WithLimit(2) over WithLimit(1): %v", err)
	}
	if _, err := l.TryAcquire(ctx, abc, dlock.WithLimit(dlock.MaxLimit-1)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Errorf("WithLimit(MaxLimit-1) over MaxLimit: %v", err)
	}
	// A mismatch against holders whose leases are gone is no mismatch: the
	// next grant sets the limit afresh, with a higher token.
	h.Expire(t, one)
	p2, err := l.TryAcquire(ctx, one, dlock.WithLimit(2))
	if err != nil {
		t.Fatalf("WithLimit(2) after the WithLimit(1) holder expired: %v", err)
	}
	if p2.Token() <= p1.Token() {
		t.Errorf("token %d after %d", p2.Token(), p1.Token())
	}
	p3, err := l.TryAcquire(ctx, one, dlock.WithLimit(2))
	if err != nil {
		t.Fatalf("second permit of 2: %v", err)
	}
	if _, err := l.TryAcquire(ctx, one, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("third permit of 2: %v", err)
	}
	// A writer that waits on a key whose last reader then leaves gets it
	// before any new reader, and its token is above every reader's.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make(chan *dlock.Lock, 1)
	go func() {
		w, err := l.Acquire(wctx, ab, dlock.WithTTL(time.Second))
		if err != nil {
			t.Errorf("writer: %v", err)
		}
		got <- w
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := l.TryAcquire(ctx, ab, dlock.WithShared())
		if errors.Is(err, dlock.ErrNotAcquired) {
			break // the writer registered
		}
		if err != nil {
			t.Fatal(err)
		}
		r.Release(ctx)
		if time.Now().After(deadline) {
			t.Fatal("the waiting writer never kept readers out")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil {
		return
	}
	infos, _ = l.List(ctx, ab)
	for _, in := range infos {
		if in.Key == ab && (in.Mode != dlock.Exclusive || len(in.Holders) != 1) {
			t.Errorf("List of a/b under the writer = %+v", in)
		}
	}
	if w.Token() <= s.Token() {
		t.Errorf("writer token %d not above the reader's %d", w.Token(), s.Token())
	}
	for _, lk := range []*dlock.Lock{w, x, p, p2, p3} {
		lk.Release(ctx)
	}
}
