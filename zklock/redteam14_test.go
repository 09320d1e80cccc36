package zklock_test

// Red-team attacks on issue 14's primitives (shared locks, semaphores) in
// zklock. Each test is an attack that held up; they stay as regression
// tests of the promise they attacked.

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// Limit mismatch edge cases: against a permit that only waits (no
// mismatch yet: it waits behind it), against the same permit once it is
// granted (mismatch, not a hang), and against a holder whose node was
// deleted behind its back (no mismatch: the key is free, the new size
// wins).
func TestRedTeam14_MismatchAgainstWaitersAndGoneHolders(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	key := dlocktest.Key(t)
	l := func() *zklock.Locker { return zklock.New(connect(t, addrs)) }
	r, err := l().TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	w2 := acquireLater(t, admin, l(), key, 2, dlock.WithLimit(2))
	w3 := acquireLater(t, admin, l(), key, 3, dlock.WithLimit(3))
	if _, err := l().TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(3)); !errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("TryAcquire(limit 3) behind a reader and a waiting permit of 2: %v, want refused (no mismatch: the reader holds)", err)
	}
	time.Sleep(100 * time.Millisecond)
	w3.waiting(t, "permit of 3 behind a waiting permit of 2")
	releaseOK(t, r)
	g2 := w2.got(t, "permit of 2 after the reader")
	if err := w3.failed(t, "permit of 3 once the permit of 2 holds"); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("permit of 3 once a permit of 2 holds: %v, want ErrLimitMismatch", err)
	}
	// The holder's node is deleted behind its back: the key is free.
	expire(t, admin, key)
	select {
	case <-g2.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("Lost() not closed after the node's deletion")
	}
	lk, err := l().TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(3))
	if err != nil {
		t.Fatalf("permit of 3 on a key whose permit of 2 is gone: %v", err)
	}
	releaseOK(t, lk)
}

// Hierarchical keys never contend, whatever the modes: "a" held
// exclusively does not keep readers or permits of "a/b" out, and the
// other way round; List shows each with its own mode.
func TestRedTeam14_HierarchicalKeysAcrossModes(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	l := zklock.New(connect(t, addrs))
	m := zklock.New(connect(t, addrs))
	base := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	x, err := l.TryAcquire(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	y, err := m.TryAcquire(ctx, base+"/b", dlock.WithShared())
	if err != nil {
		t.Fatalf("shared a/b while a is held: %v", err)
	}
	s, err := m.TryAcquire(ctx, base+"/b/c", dlock.WithLimit(1))
	if err != nil {
		t.Fatalf("permit of a/b/c while a and a/b are held: %v", err)
	}
	infos, err := l.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]dlock.Mode{base: dlock.Exclusive, base + "/b": dlock.Shared, base + "/b/c": dlock.Limited}
	if len(infos) != len(want) {
		t.Fatalf("List: %+v", infos)
	}
	for _, in := range infos {
		if in.Mode != want[in.Key] || len(in.Holders) != 1 {
			t.Fatalf("List entry %+v, want mode %v and one holder", in, want[in.Key])
		}
		if in.Mode == dlock.Limited && in.Limit != 1 {
			t.Fatalf("List entry %+v, want limit 1", in)
		}
	}
	releaseOK(t, s)
	releaseOK(t, y)
	releaseOK(t, x)
}

// A permit's and a reader's Release whose reply is lost leave no node
// behind: the semaphore's permit and the reader's share come back (a
// writer gets the key), with no orphan holding them for the session.
func TestRedTeam14_LostReleaseReplyPermitAndReader(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	key := dlocktest.Key(t)
	l := zklock.New(connect(t, []string{p.Addr()}))
	dir := l.Path(key)
	for _, opt := range []dlock.Option{dlock.WithLimit(1), dlock.WithShared()} {
		lk, err := l.Acquire(dlocktest.Context(t), key, opt)
		if err != nil {
			t.Fatal(err)
		}
		p.LoseNextReply()
		_ = lk.Release(dlocktest.Context(t)) // an error is allowed: the outcome was unknown
		waitFor(t, "the released node gone", func() bool { return len(children(t, admin, dir)) == 0 })
		w, err := zklock.New(admin).TryAcquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("writer after a lost release reply: %v", err)
		}
		if w.Token() <= lk.Token() {
			t.Fatalf("writer token %d not above the released holder's %d", w.Token(), lk.Token())
		}
		releaseOK(t, w)
	}
}

// Bad mode input never panics, hangs or leaves a node: limits outside
// [1, MaxLimit], WithShared with WithLimit, a nil context, on both
// TryAcquire and Acquire.
func TestRedTeam14_BadModeInput(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	l := zklock.New(admin)
	key := dlocktest.Key(t)
	bad := [][]dlock.Option{
		{dlock.WithLimit(0)},
		{dlock.WithLimit(-1)},
		{dlock.WithLimit(dlock.MaxLimit + 1)},
		{dlock.WithLimit(1 << 62)},
		{dlock.WithShared(), dlock.WithLimit(2)},
		{dlock.WithLimit(2), dlock.WithShared()},
	}
	for _, opts := range bad {
		if _, err := l.TryAcquire(dlocktest.Context(t), key, opts...); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("TryAcquire %d options: %v, want ErrInvalidOption", len(opts), err)
		}
		if _, err := l.Acquire(dlocktest.Context(t), key, opts...); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("Acquire %d options: %v, want ErrInvalidOption", len(opts), err)
		}
	}
	//lint:ignore SA1012 a nil context is the attack
	if _, err := l.TryAcquire(nil, key, dlock.WithLimit(2)); err == nil { //nolint:staticcheck
		t.Fatal("TryAcquire with a nil context succeeded")
	}
	//lint:ignore SA1012 a nil context is the attack
	if _, err := l.Acquire(nil, key, dlock.WithShared()); err == nil { //nolint:staticcheck
		t.Fatal("Acquire with a nil context succeeded")
	}
	if kids, _, err := admin.Children(l.Path(key)); err == nil && len(kids) > 0 {
		t.Fatalf("bad input left nodes: %v", kids)
	}
}
