package zklock_test

// Red-team attacks on issue 14's primitives (shared locks, semaphores) in
// zklock. Each test is an attack that held up; they stay as regression
// tests of the promise they attacked.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// Many clients racing TryAcquire and Acquire on a semaphore of 3 (with
// readers and writers thrown in on the same key) never see more than 3
// permits inside at once, never a writer together with anyone, and
// every writer's token is above every token granted before it.
func TestRedTeam14_RacingModesNeverOverlap(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	addrs := []string{z.Addr()}
	key := dlocktest.Key(t)
	const limit = 3
	var (
		mu      sync.Mutex
		permits int
		readers int
		writers int
		maxTok  uint64 // highest token granted so far
		bad     []string
	)
	enter := func(lk *dlock.Lock, mode dlock.Mode) {
		mu.Lock()
		defer mu.Unlock()
		switch mode {
		case dlock.Exclusive:
			if permits+readers+writers != 0 {
				bad = append(bad, "writer inside with others")
			}
			if lk.Token() <= maxTok {
				bad = append(bad, "writer token not above an earlier grant")
			}
			writers++
		case dlock.Shared:
			if permits+writers != 0 {
				bad = append(bad, "reader inside with a writer or permit")
			}
			readers++
		case dlock.Limited:
			if readers+writers != 0 {
				bad = append(bad, "permit inside with a reader or writer")
			}
			permits++
			if permits > limit {
				bad = append(bad, "more permits than the limit")
			}
		}
		maxTok = max(maxTok, lk.Token())
	}
	leave := func(mode dlock.Mode) {
		mu.Lock()
		defer mu.Unlock()
		switch mode {
		case dlock.Exclusive:
			writers--
		case dlock.Shared:
			readers--
		case dlock.Limited:
			permits--
		}
	}
	ctx, cancel := context.WithTimeout(dlocktest.Context(t), 1500*time.Millisecond)
	defer cancel()
	var grants atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		l := zklock.New(connect(t, addrs))
		mode := dlock.Limited
		var opts []dlock.Option
		switch g {
		case 0:
			mode = dlock.Exclusive
		case 1:
			mode = dlock.Shared
			opts = append(opts, dlock.WithShared())
		default:
			opts = append(opts, dlock.WithLimit(limit))
		}
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				var lk *dlock.Lock
				var err error
				if i%2 == 0 {
					lk, err = l.TryAcquire(ctx, key, opts...)
				} else {
					lk, err = l.Acquire(ctx, key, opts...)
				}
				if err != nil {
					if errors.Is(err, dlock.ErrLimitMismatch) {
						mu.Lock()
						bad = append(bad, "limit mismatch between permits of one size: "+err.Error())
						mu.Unlock()
					}
					continue
				}
				grants.Add(1)
				enter(lk, mode)
				time.Sleep(5 * time.Millisecond)
				leave(mode)
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = lk.Release(rctx)
				rcancel()
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), bad[0])
	}
	if grants.Load() < 10 {
		t.Fatalf("only %d grants", grants.Load())
	}
}

// A semaphore of 2 with one holder: a permit whose create reply is lost
// is granted once (one node), so the semaphore has exactly one permit
// left over for nobody: a third is refused, and the lost-reply permit's
// release frees its permit for good.
func TestRedTeam14_LostReplyPermitCountsOnce(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	key := dlocktest.Key(t)
	lim := dlock.WithLimit(2)
	a, err := zklock.New(admin).TryAcquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	l := zklock.New(connect(t, []string{p.Addr()}))
	p.LoseNextReply()
	b, err := l.Acquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	dir := l.Path(key)
	n := 0
	for _, k := range children(t, admin, dir) {
		if strings.Contains(k, b.Owner()) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d nodes of the lost-reply permit, want 1: %v", n, children(t, admin, dir))
	}
	c := zklock.New(connect(t, []string{z.Addr()}))
	if _, err := c.TryAcquire(dlocktest.Context(t), key, lim); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("third permit of 2: %v", err)
	}
	releaseOK(t, b)
	lk, err := c.TryAcquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatalf("permit after the lost-reply permit's release: %v", err)
	}
	releaseOK(t, lk)
	releaseOK(t, a)
}

// Limit mismatch edge cases: against a permit that only waits (no
// mismatch yet: it waits behind it), against the same permit once it is
// granted (mismatch, not a hang), and against a holder whose node was
// deleted behind its back (no mismatch: the key is free, the new size
// wins).
func TestRedTeam14_MismatchAgainstWaitersAndGoneHolders(t *testing.T) {
	z := testserver.StartZooKeeper(t)
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
	z := testserver.StartZooKeeper(t)
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

// A semaphore of 2 whose first waiter is frozen (its link stalled, its
// session still alive) must not keep the waiter behind it out once both
// holders are gone: the frozen waiter takes one permit (it was admitted,
// it just cannot hear it), the other is free. The waiter behind watched
// only the frozen one, for a granted mark its client never wrote, so it
// waited until the frozen session expired: one dead waiting permit kept
// every permit behind it out for a whole session timeout, with permits
// free.
func TestRedTeam14_FrozenWaitingPermitBlocksQueueBehind(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	key := dlocktest.Key(t)
	lim := dlock.WithLimit(2)
	l := func() *zklock.Locker { return zklock.New(connect(t, addrs)) }
	p1, err := l().TryAcquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := l().TryAcquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	frozen := zklock.New(connectFor(t, []string{p.Addr()}, longSessionTimeout))
	_ = acquireLater(t, admin, frozen, key, 3, lim)
	dir := frozen.Path(key)
	frozenNode := ""
	for _, k := range children(t, admin, dir) {
		if !strings.Contains(k, p1.Owner()) && !strings.Contains(k, p2.Owner()) {
			frozenNode = k
		}
	}
	w4 := acquireLater(t, admin, l(), key, 4, lim)
	p.Stall()
	time.Sleep(50 * time.Millisecond)
	releaseOK(t, p1)
	releaseOK(t, p2)
	g4 := w4.got(t, "the permit behind a frozen waiting permit")
	// Granted while the frozen waiter's session is alive: its node is
	// still queued (ahead of g4's).
	still := false
	for _, k := range children(t, admin, dir) {
		if k == frozenNode {
			still = true
		}
	}
	if !still {
		t.Fatalf("the permit behind was granted only once the frozen waiter's node went (children %v)", children(t, admin, dir))
	}
	releaseOK(t, g4)
}

// A permit's and a reader's Release whose reply is lost leave no node
// behind: the semaphore's permit and the reader's share come back (a
// writer gets the key), with no orphan holding them for the session.
func TestRedTeam14_LostReleaseReplyPermitAndReader(t *testing.T) {
	z := testserver.StartZooKeeper(t)
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
	z := testserver.StartZooKeeper(t)
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
