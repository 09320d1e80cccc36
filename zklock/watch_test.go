package zklock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// watchedUnder returns the paths under dir that the server has watches on
// ("wchp").
func watchedUnder(t testing.TB, z *testserver.ZooKeeper, dir string) []string {
	t.Helper()
	out, err := z.FourLetter("wchp")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, dir+"/") {
			paths = append(paths, line)
		}
	}
	return paths
}

// Under churn a waiter's predecessor often vanishes between the listing
// of the queue and the watch set on it: no watch stays on the server for
// the vanished node (a watch for its creation would stay for the
// session's life, re-sent at every reconnect).
func TestAcquire_NoWatchLeft_PredecessorVanishes(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	c := connect(t, addrs)
	l := zklock.New(c)
	key := dlocktest.Key(t)
	dir := l.Path(key)
	holder, err := zklock.New(connect(t, addrs)).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var attempts atomic.Int64
	for w := range 6 {
		wg.Go(func() {
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				attempts.Add(1)
				var lk *dlock.Lock
				var err error
				if w%2 == 0 {
					lk, err = l.TryAcquire(dlocktest.Context(t), key)
				} else {
					wait := time.Duration(10+rand.IntN(60)) * time.Millisecond
					lk, err = l.Acquire(dlocktest.Context(t), key, dlock.WithWait(wait))
				}
				if err == nil {
					lk.Release(context.Background())
					t.Errorf("acquired a held key")
					return
				}
			}
		})
	}
	time.Sleep(4 * time.Second) // the churn
	close(stop)
	wg.Wait()
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Every node of the churn is deleted (background deletions included),
	// and every request the client sent before a sync sent now has been
	// processed (a session's requests are answered in order).
	waitFor(t, "the queue emptied", func() bool { return len(children(t, c, dir)) == 0 })
	if _, err := c.Sync("/"); err != nil {
		t.Fatal(err)
	}
	if w := watchedUnder(t, z, dir); len(w) > 0 {
		ex := w
		if len(ex) > 3 {
			ex = ex[:3]
		}
		t.Fatalf("after %d attempts, every node gone, the server still keeps %d watches on vanished queue nodes of the live session (e.g. %v)", attempts.Load(), len(w), ex)
	}
}

// A release wakes exactly one waiter: each waiter watches only the node
// ahead of it, so one release fires one watch event (no herd). Waiters are
// served in arrival order.
func TestRelease_WakesOnlyTheNextWaiter(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	key := dlocktest.Key(t)
	hl := zklock.New(connect(t, []string{z.Addr()}))
	holder, err := hl.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	lockers := []*zklock.Locker{hl}
	dir := zklock.New(admin).Path(key)
	const waiters = 20
	var mu sync.Mutex
	var order []int
	locks := make(chan *dlock.Lock, waiters)
	errs := make(chan error, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		l := zklock.New(connect(t, []string{z.Addr()}))
		lockers = append(lockers, l)
		wg.Go(func() {
			lk, err := l.Acquire(dlocktest.Context(t), key)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			locks <- lk
		})
		// A waiter whose Acquire failed is reported as its error, not as
		// a queue that never grew.
		waitFor(t, fmt.Sprintf("waiter %d queued", i), func() bool {
			select {
			case err := <-errs:
				t.Fatalf("a waiter's Acquire failed while queueing: %v", err)
			default:
			}
			if err := holder.Err(); err != nil {
				t.Fatalf("the holder lost its lock while waiters queued: %v", err)
			}
			return len(children(t, admin, dir)) == i+2
		})
	}
	before := zklock.WatchEvents(lockers...)
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	var lk *dlock.Lock
	select {
	case lk = <-locks:
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: no waiter got the lock")
	}
	// The new holder's grant needed one event; give any herd a moment to
	// show (a herd would be 19 more events), then count.
	time.Sleep(300 * time.Millisecond)
	if n := zklock.WatchEvents(lockers...) - before; n != 1 {
		t.Fatalf("one release fired %d watch events, want 1", n)
	}
	for range waiters - 1 {
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case lk = <-locks:
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: the next waiter did not get the lock")
		}
	}
	lk.Release(dlocktest.Context(t))
	wg.Wait()
	for i, w := range order {
		if i != w {
			t.Fatalf("waiters served in order %v, want arrival order", order)
		}
	}
}

// A release in a semaphore with many waiters wakes few of them, not the
// herd.
func TestRelease_WakesFewWaiters_Semaphore(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	key := dlocktest.Key(t)
	lim := dlock.WithLimit(2)
	var held []*dlock.Lock
	var lockers []*zklock.Locker
	for range 2 {
		l := zklock.New(connect(t, addrs))
		lockers = append(lockers, l)
		lk, err := l.Acquire(dlocktest.Context(t), key, lim)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}
	const waiters = 12
	var ps []pending
	for i := range waiters {
		l := zklock.New(connect(t, addrs))
		lockers = append(lockers, l)
		ps = append(ps, acquireLater(t, admin, l, key, 3+i, lim))
	}
	time.Sleep(200 * time.Millisecond) // the last waiter's watch set
	before := zklock.WatchEvents(lockers...)
	releaseOK(t, held[0])
	ps[0].got(t, "first waiter")
	time.Sleep(300 * time.Millisecond)
	// The first waiter's children watch, its own node's mark (its Bind),
	// the second waiter's watch on the first's node, the releaser's own
	// watch: a herd would be 12 or more.
	if n := zklock.WatchEvents(lockers...) - before; n > 5 {
		t.Fatalf("one release fired %d watch events among %d waiters", n, waiters)
	}
	for i := 1; i < waiters; i++ {
		ps[i].waiting(t, fmt.Sprintf("waiter %d", i))
	}
}

// A semaphore of 2 whose first waiter is frozen (its link stalled, its
// session alive) does not keep the waiter behind it out once both holders
// are gone: the frozen waiter takes one permit (it was admitted, it just
// cannot hear it), the waiter behind gets the other while the frozen
// session lives (a session longer than any wait of the test: the grant
// does not come from its expiry).
func TestSemaphore_FrozenWaiterDoesNotBlockQueue(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
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
	frozen := zklock.New(connectFor(t, []string{p.Addr()}, 2*dlocktest.HangTimeout))
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

// A semaphore's first waiting permit whose watch on the key's children
// never fires (its event lost across a reconnect) is admitted once the
// permit ahead is released.
// Symptom: the waiter waited until its context ended.
func TestSemaphoreWaiter_AdmittedWhenChildrenWatchLost(t *testing.T) {
	t.Parallel()
	addrs := []string{sharedZooKeeper(t).Addr()}
	key := dlocktest.Key(t)
	lim := dlock.WithLimit(1)
	p, err := zklock.New(connect(t, addrs)).TryAcquire(dlocktest.Context(t), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	waiter := zklock.New(connect(t, addrs))
	watching := make(chan struct{})
	var once sync.Once
	zklock.SetHooks(waiter, &zklock.Hooks{ChildWatch: func(<-chan zk.Event) <-chan zk.Event {
		once.Do(func() { close(watching) })
		return make(chan zk.Event) // never fires
	}})
	type got struct {
		lk  *dlock.Lock
		err error
	}
	done := make(chan got, 1)
	go func() {
		lk, err := waiter.Acquire(dlocktest.Context(t), key, lim)
		done <- got{lk, err}
	}()
	select {
	case <-watching:
	case g := <-done:
		t.Fatalf("Acquire returned (%v) before it waited on the key's children", g.err)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the waiter never waited on the key's children")
	}
	releaseOK(t, p)
	select {
	case g := <-done:
		if g.err != nil {
			t.Fatalf("the waiter, its children watch lost, after the release: %v", g.err)
		}
		if g.lk.Token() <= p.Token() {
			t.Errorf("waiter's token %d, not above the released permit's %d", g.lk.Token(), p.Token())
		}
		releaseOK(t, g.lk)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the waiter was not admitted after the release: it relied on the lost watch")
	}
}
