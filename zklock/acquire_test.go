package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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

// recvErr waits for an error from ch (what: the step it reports).
func recvErr(t testing.TB, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("hang: %s did not happen within %v", what, dlocktest.HangTimeout)
	}
	return nil
}

// makeKeyDir creates l's znode for key (and the default prefix above it),
// so that an attempt's first request is its create.
func makeKeyDir(t testing.TB, admin *zk.Conn, l *zklock.Locker, key string) string {
	t.Helper()
	if _, err := admin.Create(zklock.DefaultPrefix, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		t.Fatal(err)
	}
	dir := l.Path(key)
	if _, err := admin.Create(dir, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitNoNode waits until dir has no children: the node of an attempt
// that failed is deleted once the servers answer again. It fails naming
// the zombie and what another client's TryAcquire of key says.
func waitNoNode(t testing.TB, admin *zk.Conn, z *testserver.ZooKeeper, dir, key string, sid int64) {
	t.Helper()
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		kids := children(t, admin, dir)
		if len(kids) == 0 {
			return
		}
		if time.Now().After(end) {
			other := zklock.New(connect(t, []string{z.Addr()}))
			_, err := other.TryAcquire(dlocktest.Context(t), key)
			t.Fatalf("zombie: the failed attempt's node %v still holds %q %v after the servers came back (session %x alive); another client's TryAcquire: %v",
				kids, key, dlocktest.HangTimeout, sid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outageAfterLostCreateReply makes l's next create lose its reply through
// p, and cuts p (the servers look dead) as soon as the client learns the
// connection dropped, before it can reconnect and look for its node.
// Abort results are sent on the returned channel.
func outageAfterLostCreateReply(l *zklock.Locker, p *testserver.Proxy) <-chan error {
	var once sync.Once
	aborted := make(chan error, 4)
	zklock.SetHooks(l, &zklock.Hooks{
		BeforeCreate: func() { once.Do(p.LoseNextReply) },
		AfterCreate: func(err error) {
			if errors.Is(err, zk.ErrConnectionClosed) {
				p.Cut()
			}
		},
		Aborted: func(err error) {
			select {
			case aborted <- err:
			default:
			}
		},
	})
	return aborted
}

// A TryAcquire whose create reply is lost, the servers then unreachable
// past its recovery's retries: its node does not stay behind holding the
// key once they are back (the session survived).
func TestTryAcquire_NoNodeLeft_LostCreateReplyThenOutage(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	c := connectFor(t, []string{p.Addr()}, 40*time.Second)
	sid := c.SessionID()
	l := zklock.New(c)
	key := dlocktest.Key(t)
	dir := makeKeyDir(t, admin, l, key)
	aborted := outageAfterLostCreateReply(l, p)
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err == nil {
		lk.Release(context.Background())
		t.Fatal("TryAcquire succeeded through an outage")
	}
	t.Logf("TryAcquire returned: %v (ErrTransient: %v)", err, errors.Is(err, dlock.ErrTransient))
	if len(children(t, admin, dir)) != 1 {
		t.Fatalf("the lost-reply create left %v, want its node", children(t, admin, dir))
	}
	// The engine's undo of the attempt failed during the outage.
	if err := recvErr(t, aborted, "the engine's Abort"); err == nil {
		t.Fatal("Abort succeeded during the outage")
	}
	p.Heal()
	waitSession(t, c)
	if c.SessionID() != sid {
		t.Fatalf("the session changed (%x -> %x): the test needs it to survive the outage", sid, c.SessionID())
	}
	waitNoNode(t, admin, z, dir, key, sid)
}

// A blocking Acquire whose create reply is lost ends with its context
// during the outage that follows, and the engine's Abort fails too: the
// node does not stay behind holding the key once the servers are back.
func TestAcquire_NoNodeLeft_AbortFailsDuringOutage(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	c := connectFor(t, []string{p.Addr()}, 40*time.Second)
	sid := c.SessionID()
	l := zklock.New(c)
	key := dlocktest.Key(t)
	dir := makeKeyDir(t, admin, l, key)
	aborted := outageAfterLostCreateReply(l, p)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	lk, err := l.Acquire(ctx, key)
	if err == nil {
		lk.Release(context.Background())
		t.Fatal("Acquire succeeded through an outage")
	}
	t.Logf("Acquire returned: %v", err)
	if err := recvErr(t, aborted, "the engine's Abort"); err == nil {
		t.Fatal("Abort succeeded during the outage")
	}
	p.Heal()
	waitSession(t, c)
	if c.SessionID() != sid {
		t.Fatalf("the session changed (%x -> %x): the test needs it to survive the outage", sid, c.SessionID())
	}
	waitNoNode(t, admin, z, dir, key, sid)
}

// The server hangs while a TryAcquire's create is in flight, past the
// request timeout and the engine's Abort: when it resumes and processes
// the create, the node does not stay behind holding the key.
func TestTryAcquire_NoNodeLeft_ServerHungDuringCreate(t *testing.T) {
	t.Parallel()
	z := testserver.StartZooKeeper(t)
	admin := connectFor(t, []string{z.Addr()}, 40*time.Second)
	c := connectFor(t, []string{z.Addr()}, 40*time.Second)
	sid := c.SessionID()
	l := zklock.New(c, zklock.WithRequestTimeout(time.Second))
	key := dlocktest.Key(t)
	dir := makeKeyDir(t, admin, l, key)
	aborted := make(chan error, 4)
	zklock.SetHooks(l, &zklock.Hooks{Aborted: func(err error) {
		select {
		case aborted <- err:
		default:
		}
	}})
	pause(t, z)
	resumed := false
	defer func() {
		if !resumed {
			z.Resume()
		}
	}()
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err == nil {
		lk.Release(context.Background())
		t.Fatal("TryAcquire succeeded against a hung server")
	}
	t.Logf("TryAcquire against the hung server: %v", err)
	if err := recvErr(t, aborted, "the engine's Abort"); err == nil {
		t.Fatal("Abort succeeded against a hung server")
	}
	z.Resume()
	resumed = true
	waitSession(t, c)
	if c.SessionID() != sid {
		t.Fatalf("the session changed (%x -> %x)", sid, c.SessionID())
	}
	// The client's requests are answered in order: once a sync sent now
	// returns, the create queued during the hang has been processed.
	if _, err := c.Sync("/"); err != nil {
		t.Fatal(err)
	}
	waitNoNode(t, admin, z, dir, key, sid)
}

// A create sent only after its Acquire gave up (its goroutine scheduled
// late) and after the engine's Abort found nothing to delete does not
// leave its node behind to hold the key for the session's life: the
// create itself deletes it. Exclusive and shared alike.
func TestAcquire_LateCreateDeletesItsNode_AfterAbort(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	key := dlocktest.Key(t)
	holder, err := zklock.New(admin).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	l := zklock.New(connect(t, addrs))
	gate := make(chan struct{})
	var open sync.Once
	t.Cleanup(func() { open.Do(func() { close(gate) }) })
	created, aborted := make(chan error, 2), make(chan error, 2)
	zklock.SetHooks(l, &zklock.Hooks{
		BeforeCreate: func() { <-gate },
		AfterCreate:  func(err error) { created <- err },
		Aborted:      func(err error) { aborted <- err },
	})
	for _, opts := range [][]dlock.Option{nil, {dlock.WithShared()}} {
		if _, err := l.Acquire(dlocktest.Context(t), key, append(opts, dlock.WithWait(50*time.Millisecond))...); err == nil {
			t.Fatal("acquired a held key")
		}
		// The engine undid the attempt before its create was sent.
		if err := recvErr(t, aborted, "the engine's Abort"); err != nil {
			t.Fatalf("Abort of an attempt whose create was not sent: %v", err)
		}
	}
	open.Do(func() { close(gate) })
	for range 2 {
		if err := recvErr(t, created, "a late create"); err != nil {
			t.Fatalf("late create: %v", err)
		}
	}
	waitFor(t, "the late creates' nodes deleted", func() bool { return len(children(t, admin, l.Path(key))) == 1 })
	releaseOK(t, holder)
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("the key after its holder released: %v (a late node holds it?)", err)
	}
	releaseOK(t, lk)
}

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

// A shared Acquire waiting behind a writer over a link that stalls ends
// by its context with an error, never a grant; its node goes with its
// session, so the writer's release admits nobody stale, and after the link
// heals (the client has a new session) the same Locker takes shared locks
// again.
func TestSharedAcquire_EndsByContext_StalledLink(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	key := dlocktest.Key(t)
	c := connect(t, []string{p.Addr()})
	sid := c.SessionID()
	l := zklock.New(c)
	wl, err := zklock.New(admin).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, dlock.WithShared())
		if err == nil {
			lk.Release(context.Background())
			err = errors.New("granted")
		}
		done <- err
	}()
	waitFor(t, "the reader queued", func() bool { return len(children(t, admin, l.Path(key))) == 2 })
	p.Stall()
	select {
	case err := <-done:
		if err == nil || err.Error() == "granted" {
			t.Fatalf("shared Acquire over a stalled link: %v, want an error", err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: shared Acquire over a stalled link did not end with its context")
	}
	waitFor(t, "the stalled reader's node gone with its session", func() bool { return len(children(t, admin, l.Path(key))) == 1 })
	releaseOK(t, wl)
	p.Heal()
	waitNewSession(t, c, sid)
	r, err := l.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatalf("shared Acquire after the link healed: %v", err)
	}
	if r.Token() <= wl.Token() {
		t.Fatalf("reader token %d not above the writer's %d", r.Token(), wl.Token())
	}
	releaseOK(t, r)
}

// The reply to the create is lost: the client finds its node by its owner
// id and holds the lock with it; no second node, no orphan.
func TestAcquire_LostCreateReplyFindsItsNode(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	l := zklock.New(connect(t, []string{p.Addr()}))
	loseCreateReply(l, p)
	key := dlocktest.Key(t)
	dir := l.Path(key)
	// Make the key's znode exist, so that the next request is the create.
	other := zklock.New(admin)
	lk0, err := other.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	var got *dlock.Lock
	done := make(chan error, 1)
	go func() {
		var err error
		got, err = l.Acquire(dlocktest.Context(t), key)
		done <- err
	}()
	// The waiter's create took effect (its reply is lost).
	waitFor(t, "the waiter's node created", func() bool { return len(children(t, admin, dir)) >= 2 })
	if err := lk0.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Acquire after a lost create reply: %v", err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Acquire after a lost create reply (deadlocked behind its own node?)")
	}
	kids := children(t, admin, dir)
	if len(kids) != 1 || !strings.Contains(kids[0], got.Owner()) {
		t.Fatalf("children %v, want only the holder's node (owner %s)", kids, got.Owner())
	}
	if err := got.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// A shared Acquire whose create reply is lost finds its read- node again
// by its owner id and is granted with it once the writer ahead goes,
// leaving exactly one node.
func TestSharedAcquire_LostCreateReplyFindsItsNode(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	l := zklock.New(connect(t, []string{p.Addr()}))
	key := dlocktest.Key(t)
	dir := l.Path(key)
	wl, err := zklock.New(admin).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	loseCreateReply(l, p)
	pr := acquireLater(t, admin, l, key, 2, dlock.WithShared())
	releaseOK(t, wl)
	got := pr.got(t, "shared Acquire after a lost create reply")
	kids := children(t, admin, dir)
	if len(kids) != 1 || !strings.Contains(kids[0], got.Owner()+"-read-") {
		t.Fatalf("children %v, want only the reader's read- node (owner %s)", kids, got.Owner())
	}
	if !got.Fence().Shared {
		t.Fatalf("fence %+v, want shared", got.Fence())
	}
}

// A semaphore of 2 with one holder: a permit whose create reply is lost
// is granted once (one node), so the semaphore has exactly one permit
// left over for nobody: a third is refused, and the lost-reply permit's
// release frees its permit for good.
func TestSemaphore_LostCreateReplyCountsOnce(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
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
	loseCreateReply(l, p)
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
// permit ahead is released. Symptom: it waited until its context ended.
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

// A refused TryAcquire's queue node is gone when TryAcquire returns: once
// the holder releases, another client's TryAcquire gets the key. Symptom:
// it was refused, "held by" the refused attempt's owner, while that
// node's deletion still ran in the background.
func TestTryAcquire_RefusedNodeGoneOnReturn(t *testing.T) {
	t.Parallel()
	addrs := []string{sharedZooKeeper(t).Addr()}
	key := dlocktest.Key(t)
	holder, err := zklock.New(connect(t, addrs)).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	refused := zklock.New(connect(t, addrs))
	gate := make(chan struct{})
	zklock.SetHooks(refused, &zklock.Hooks{BeforeOrphanDelete: func() {
		// Holds the deletion until the other client has tried (a deletion
		// left to the background is still pending then), or for a second
		// (a TryAcquire that waits for its deletion returns after it).
		select {
		case <-gate:
		case <-time.After(time.Second):
		}
	}})
	if _, err := refused.TryAcquire(dlocktest.Context(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
	}
	releaseOK(t, holder)
	lk, err := zklock.New(connect(t, addrs)).TryAcquire(dlocktest.Context(t), key)
	close(gate)
	if err != nil {
		t.Fatalf("TryAcquire after the holder released, a refused attempt before it: %v", err)
	}
	releaseOK(t, lk)
}

// A waiter's look after its wait, the one that may grant it, is preceded
// by a sync, so a follower cut off from the leader cannot answer it with
// a queue the leader has moved past. Symptom: the look read the children
// straight from whichever server the client was on.
func TestWaiter_SyncsBeforeTheLookThatGrants(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	holder := zklock.New(connect(t, []string{z.Addr()}))
	waiter := zklock.New(connect(t, []string{z.Addr()}))
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	held, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		reqs    []string
		waiting = make(chan struct{})
		once    sync.Once
	)
	zklock.SetHooks(waiter, &zklock.Hooks{Request: func(what string) {
		mu.Lock()
		reqs = append(reqs, what)
		mu.Unlock()
		if what == "watch" {
			once.Do(func() { close(waiting) })
		}
	}})
	got := make(chan error, 1)
	go func() {
		lk, err := waiter.Acquire(ctx, key)
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	select {
	case <-waiting:
	case <-ctx.Done():
		t.Fatal("hang: the waiter never watched the holder")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	zklock.SetHooks(waiter, nil)
	mu.Lock()
	defer mu.Unlock()
	first, last := slices.Index(reqs, "list"), -1
	for i, r := range reqs {
		if r == "list" {
			last = i
		}
	}
	if first < 0 || first == last || !slices.Contains(reqs[first:last], "sync") {
		t.Fatalf("the waiter's requests %v: want a sync between its first look and the look that granted it", reqs)
	}
}
