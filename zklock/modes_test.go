package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// pending is a blocking Acquire running in the background.
type pending struct {
	lk  chan *dlock.Lock
	err chan error
}

// acquireLater starts l.Acquire(key, opts) in the background and waits
// until its node is in the key's queue (the queue then has want nodes).
func acquireLater(t *testing.T, admin *zk.Conn, l *zklock.Locker, key string, want int, opts ...dlock.Option) pending {
	t.Helper()
	p := pending{lk: make(chan *dlock.Lock, 1), err: make(chan error, 1)}
	ctx := dlocktest.Context(t)
	go func() {
		lk, err := l.Acquire(ctx, key, opts...)
		if err != nil {
			p.err <- err
			return
		}
		p.lk <- lk
	}()
	// An Acquire that failed is reported as its error, not as a queue
	// that never grew.
	waitFor(t, fmt.Sprintf("%d nodes queued", want), func() bool {
		select {
		case err := <-p.err:
			t.Fatalf("the background Acquire failed before its node was queued: %v", err)
		default:
		}
		return len(children(t, admin, l.Path(key))) == want
	})
	return p
}

// got waits for the pending Acquire to succeed.
func (p pending) got(t *testing.T, what string) *dlock.Lock {
	t.Helper()
	select {
	case lk := <-p.lk:
		t.Cleanup(func() { lk.Release(context.Background()) })
		return lk
	case err := <-p.err:
		t.Fatalf("%s: %v", what, err)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("hang: %s", what)
	}
	return nil
}

// failed waits for the pending Acquire to fail.
func (p pending) failed(t *testing.T, what string) error {
	t.Helper()
	select {
	case lk := <-p.lk:
		lk.Release(context.Background())
		t.Fatalf("%s: acquired, want an error", what)
	case err := <-p.err:
		return err
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("hang: %s", what)
	}
	return nil
}

// waiting asserts the pending Acquire has not returned yet.
func (p pending) waiting(t *testing.T, what string) {
	t.Helper()
	select {
	case lk := <-p.lk:
		lk.Release(context.Background())
		t.Fatalf("%s: granted too early", what)
	case err := <-p.err:
		t.Fatalf("%s: %v", what, err)
	default:
	}
}

func releaseOK(t *testing.T, lk *dlock.Lock) {
	t.Helper()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// Readers share the key, each with its own node and token; a writer that
// queues behind them keeps new readers out (TryAcquire refused, Acquire
// queued behind it) and is granted when the last earlier reader goes, with
// a token above theirs; the reader behind it comes after it.
func TestSharedWriterPreference(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	key := dlocktest.Key(t)
	ra, rb, w, rc := zklock.New(connect(t, addrs)), zklock.New(connect(t, addrs)), zklock.New(connect(t, addrs)), zklock.New(connect(t, addrs))
	r1, err := ra.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rb.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if r2.Token() <= r1.Token() {
		t.Fatalf("reader tokens %d then %d", r1.Token(), r2.Token())
	}
	for _, k := range children(t, admin, ra.Path(key)) {
		if !strings.Contains(k, "-read-") {
			t.Fatalf("reader node %q is not named read-", k)
		}
	}
	_, err = w.TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) || len(na.Holders) != 2 || na.Holders[0].Mode != dlock.Shared {
		t.Fatalf("exclusive TryAcquire under two readers: %v (%+v), want both readers named", err, na)
	}
	if n := len(children(t, admin, ra.Path(key))); n != 2 {
		t.Fatalf("a refused TryAcquire left its node: %d nodes", n)
	}
	pw := acquireLater(t, admin, w, key, 3)
	_, err = rc.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
	if !errors.As(err, &na) {
		t.Fatalf("shared TryAcquire while a writer waits: %v, want refused", err)
	}
	pr := acquireLater(t, admin, rc, key, 4, dlock.WithShared())
	releaseOK(t, r2) // the writer still waits for r1
	time.Sleep(100 * time.Millisecond)
	pw.waiting(t, "writer behind one reader")
	releaseOK(t, r1)
	wl := pw.got(t, "writer after the readers released")
	if wl.Token() <= r2.Token() {
		t.Fatalf("writer token %d not above the readers' %d", wl.Token(), r2.Token())
	}
	time.Sleep(100 * time.Millisecond)
	pr.waiting(t, "reader queued behind the writer")
	releaseOK(t, wl)
	r3 := pr.got(t, "reader after the writer")
	if r3.Token() <= wl.Token() {
		t.Fatalf("reader token %d not above the writer's %d", r3.Token(), wl.Token())
	}
}

// A reader whose session expires (its link stalled) loses its lock
// (Lost() closes) and its node goes with the session: the writer waiting
// behind it is then granted, with a higher token; the other reader kept
// its own lease.
func TestReaderSessionExpiryAdmitsWriter(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	key := dlocktest.Key(t)
	stalled := zklock.New(connect(t, []string{p.Addr()}))
	other := zklock.New(connect(t, addrs))
	r1, err := stalled.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := other.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	pw := acquireLater(t, admin, zklock.New(connect(t, addrs)), key, 3)
	p.Stall()
	select {
	case <-r1.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the stalled reader's Lost() did not close")
	}
	waitFor(t, "the stalled reader's node gone with its session", func() bool { return len(children(t, admin, stalled.Path(key))) == 2 })
	pw.waiting(t, "writer behind the live reader")
	if err := r2.Err(); err != nil {
		t.Fatalf("the other reader lost its lock with the stalled one: %v", err)
	}
	releaseOK(t, r2)
	wl := pw.got(t, "writer after the readers")
	if wl.Token() <= max(r1.Token(), r2.Token()) {
		t.Fatalf("writer token %d not above the readers' %d, %d", wl.Token(), r1.Token(), r2.Token())
	}
	if !errors.Is(r1.Err(), dlock.ErrLockLost) {
		t.Fatalf("stalled reader Err() = %v, want ErrLockLost", r1.Err())
	}
}

// The only reader's session expires while a writer waits: the writer is
// granted without anyone releasing anything.
func TestOnlyReaderExpiryAdmitsWriter(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	key := dlocktest.Key(t)
	stalled := zklock.New(connect(t, []string{p.Addr()}))
	r, err := stalled.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	pw := acquireLater(t, admin, zklock.New(connect(t, addrs)), key, 2)
	p.Stall()
	wl := pw.got(t, "writer after the reader's session expired")
	if !isClosed(r.Lost()) {
		t.Fatal("the writer holds the key while the expired reader's Lost() is open")
	}
	if wl.Token() <= r.Token() {
		t.Fatalf("writer token %d not above the reader's %d", wl.Token(), r.Token())
	}
}

// A semaphore of 2: two permits hold, waiters queue in order and each
// release admits the first waiter, whichever holder released; a permit
// that waited behind a waiting permit hears of its grant (the mark).
func TestSemaphoreOrder(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	key := dlocktest.Key(t)
	lim := dlock.WithLimit(2)
	l := func() *zklock.Locker { return zklock.New(connect(t, addrs)) }
	p1, err := l().TryAcquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := l().Acquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l().TryAcquire(dlocktest.Context(t), key, lim); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("third permit of 2: %v", err)
	}
	w3 := acquireLater(t, admin, l(), key, 3, lim)
	w4 := acquireLater(t, admin, l(), key, 4, lim)
	w5 := acquireLater(t, admin, l(), key, 5, lim)
	releaseOK(t, p2) // not the first node: the first waiter is admitted all the same
	g3 := w3.got(t, "first waiter after the second permit's release")
	time.Sleep(100 * time.Millisecond)
	w4.waiting(t, "second waiter")
	releaseOK(t, p1)
	g4 := w4.got(t, "second waiter after the first permit's release (it watched the first waiter)")
	time.Sleep(100 * time.Millisecond)
	w5.waiting(t, "third waiter")
	if g3.Err() != nil || g4.Err() != nil {
		t.Fatalf("the granted mark cost a lock: %v, %v", g3.Err(), g4.Err())
	}
	releaseOK(t, g4)
	g5 := w5.got(t, "third waiter")
	if !(p1.Token() < p2.Token() && p2.Token() < g3.Token() && g3.Token() < g4.Token() && g4.Token() < g5.Token()) {
		t.Fatalf("tokens %d %d %d %d %d, want increasing", p1.Token(), p2.Token(), g3.Token(), g4.Token(), g5.Token())
	}
	// The renewals still see the marked nodes held.
	if err := g3.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("Refresh of a marked permit: %v", err)
	}
}

// A permit with another limit than the holders' fails with
// ErrLimitMismatch naming both limits (Try and Acquire); a permit queued
// behind a waiting permit of another limit waits for it and fails once it
// holds.
func TestSemaphoreLimitMismatch(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	key := dlocktest.Key(t)
	l := func() *zklock.Locker { return zklock.New(connect(t, addrs)) }
	p, err := l().Acquire(dlocktest.Context(t), key, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	for name, try := range map[string]func() error{
		"TryAcquire": func() error {
			_, err := l().TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(3))
			return err
		},
		"Acquire": func() error {
			_, err := l().Acquire(dlocktest.Context(t), key, dlock.WithLimit(3))
			return err
		},
	} {
		err := try()
		if !errors.Is(err, dlock.ErrLimitMismatch) || !strings.Contains(err.Error(), "2") || !strings.Contains(err.Error(), "3") {
			t.Fatalf("%s with limit 3 on a semaphore of 2: %v, want ErrLimitMismatch naming both", name, err)
		}
	}
	if n := len(children(t, admin, l().Path(key))); n != 1 {
		t.Fatalf("the refused permits left nodes: %d", n)
	}
	releaseOK(t, p)
	wl, err := l().Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	p3 := acquireLater(t, admin, l(), key, 2, dlock.WithLimit(3))
	p2 := acquireLater(t, admin, l(), key, 3, dlock.WithLimit(2))
	releaseOK(t, wl)
	p3.got(t, "permit of 3 after the writer")
	err = p2.failed(t, "permit of 2 behind a permit of 3")
	if !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("permit of 2 once a permit of 3 holds: %v, want ErrLimitMismatch", err)
	}
}

// List reports each key's mode, every holder with its mode, the limit of
// a semaphore and the waiters.
func TestListModes(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	key := dlocktest.Key(t)
	l := func() *zklock.Locker { return zklock.New(connect(t, addrs)) }
	var readers []*dlock.Lock
	for range 2 {
		r, err := l().Acquire(dlocktest.Context(t), key+"/rw", dlock.WithShared(), dlock.WithMetadata("role", "reader"))
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	acquireLater(t, admin, l(), key+"/rw", 3)
	s, err := l().Acquire(dlocktest.Context(t), key+"/sem", dlock.WithLimit(5))
	if err != nil {
		t.Fatal(err)
	}
	infos, err := l().List(dlocktest.Context(t), key+"/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 {
		t.Fatalf("List = %+v, want 2 keys", infos)
	}
	rw, sem := infos[0], infos[1]
	if rw.Mode != dlock.Shared || len(rw.Holders) != 2 || rw.Waiters != 1 || rw.Limit != 0 {
		t.Fatalf("read-write key: %+v, want 2 shared holders and 1 waiter", rw)
	}
	for i, h := range rw.Holders {
		if h.Mode != dlock.Shared || h.Owner != readers[i].Owner() || h.Token != readers[i].Token() || h.Metadata["role"] != "reader" {
			t.Errorf("holder %d: %+v, want reader %s token %d", i, h, readers[i].Owner(), readers[i].Token())
		}
	}
	if sem.Mode != dlock.Limited || sem.Limit != 5 || len(sem.Holders) != 1 || sem.Holders[0].Mode != dlock.Limited || sem.Holders[0].Token != s.Token() {
		t.Fatalf("semaphore key: %+v, want 1 limited holder of 5", sem)
	}
}

// The largest limit round-trips through the node name: held, listed and
// refused to a permit of another limit.
func TestSemaphoreMaxLimit(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	l := zklock.New(connect(t, []string{z.Addr()}))
	key := dlocktest.Key(t)
	p, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(dlock.MaxLimit))
	if err != nil {
		t.Fatal(err)
	}
	infos, err := l.List(dlocktest.Context(t), key)
	if err != nil || len(infos) != 1 || infos[0].Limit != dlock.MaxLimit || infos[0].Mode != dlock.Limited {
		t.Fatalf("List = %+v, %v; want one semaphore of %d", infos, err, dlock.MaxLimit)
	}
	if _, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("permit of 1 on a semaphore of %d: %v", dlock.MaxLimit, err)
	}
	q, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithLimit(dlock.MaxLimit))
	if err != nil {
		t.Fatal(err)
	}
	releaseOK(t, q)
	releaseOK(t, p)
}

// A permit's limit is checked against the holders only: a permit behind
// a permit of another size that only waits waits behind it (no mismatch
// yet), fails with ErrLimitMismatch once that permit is granted (not a
// hang), and once the holder's node is deleted behind its back the key is
// free and the new size wins.
// Symptom: ErrLimitMismatch against a permit that only waits, a hang behind one that holds, or a mismatch against a holder that is gone.
func TestSemaphoreLimitMismatch_OnlyAgainstHolders(t *testing.T) {
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
// Symptom: a key held in one mode keeping a hierarchical neighbour ("a", "a/b") of another mode out.
func TestModes_HierarchicalKeysNeverContend(t *testing.T) {
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

// Many clients racing TryAcquire and Acquire on a semaphore of 3 (with
// readers and writers thrown in on the same key) never see more than 3
// permits inside at once, never a writer together with anyone, and
// every writer's token is above every token granted before it. They race
// until the key was granted racingGrants times, however long that takes.
func TestModes_NeverOverlap_RacingClients(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
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
	const racingGrants = 60
	ctx, cancel := context.WithCancel(dlocktest.Context(t))
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
				if grants.Add(1) >= racingGrants {
					cancel()
				}
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
	if n := grants.Load(); n < racingGrants {
		t.Fatalf("hang: %d grants of %d within %v", n, racingGrants, dlocktest.HangTimeout)
	}
}
