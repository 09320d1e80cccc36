package zklock_test

import (
	"context"
	"errors"
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

// A refused TryAcquire's queue node is gone when TryAcquire returns: once
// the holder releases, another client's TryAcquire gets the key.
// Symptom: refused, "held by" the refused attempt's owner, while that node's deletion still ran in the background.
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

// A waiter's look after its wait, the one that may grant it, sends a
// sync with its listing, so a follower cut off from the leader cannot
// answer it with a queue the leader has moved past.
// Symptom: the granting look read the children straight from whichever server the client was on.
func TestWaiter_SyncsWithTheLookThatGrants(t *testing.T) {
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
	got := acquireAndRelease(ctx, waiter, key)
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
	if first < 0 || first == last || !slices.Contains(reqs[first:], "sync") {
		t.Fatalf("the waiter's requests %v: want a sync with the look that granted it", reqs)
	}
}

// A waiter's node deleted just before the sync of its granting look is
// not granted, even when the listing sent with the sync was answered
// before the deletion and still shows the node.
// Symptom: the grant went to a deleted node, whose Lost() was closed from the start.
func TestWaiter_NodeDeletedBeforeTheSync_NotGranted(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	holder := zklock.New(connect(t, []string{z.Addr()}))
	waiter := zklock.New(connect(t, []string{z.Addr()}))
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	held, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var (
		watching   = make(chan struct{})
		watched    atomic.Bool // the waiter watches the holder: its next look is the granting one
		listing    atomic.Bool // that look's listing is on its way
		listed     = make(chan struct{})
		listedOnce sync.Once
		deleted    atomic.Int64 // the czxid of the node deleted
	)
	zklock.SetHooks(waiter, &zklock.Hooks{
		Request: func(what string) {
			switch {
			case what == "watch" && !watched.Load():
				watched.Store(true)
				close(watching)
			case what == "list" && watched.Load():
				listing.Store(true)
			case what == "sync" && watched.Load() && deleted.Load() == 0:
				// The listing sent with this sync is answered first...
				if recvErr(t, errorOn(listed), "the listing's reply") != nil {
					return
				}
				// ...then the waiter's node goes, before the sync is sent.
				dir := waiter.Path(key)
				kids := children(t, admin, dir)
				if len(kids) != 1 {
					t.Errorf("queue %v: want the waiter's node alone", kids)
					return
				}
				_, st, err := admin.Get(dir + "/" + kids[0])
				if err == nil {
					err = admin.Delete(dir+"/"+kids[0], -1)
				}
				if err != nil {
					t.Error(err)
					return
				}
				deleted.Store(st.Czxid)
			}
		},
		// The listing's goroutine runs this right after its Request (the
		// look's other request, the sync, waits in its hook meanwhile).
		Waiting: func(replied func() bool) {
			if !listing.CompareAndSwap(true, false) {
				return
			}
			for end := time.Now().Add(dlocktest.HangTimeout); !replied() && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			listedOnce.Do(func() { close(listed) })
		},
	})
	got := make(chan error, 1)
	var lk *dlock.Lock
	go func() {
		var err error
		lk, err = waiter.Acquire(ctx, key)
		got <- err
	}()
	if recvErr(t, errorOn(watching), "the waiter's watch on the holder") != nil {
		return
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvErr(t, got, "the waiter's Acquire"); err != nil {
		t.Fatalf("waiter: %v", err)
	}
	defer lk.Release(context.Background())
	zklock.SetHooks(waiter, nil)
	if deleted.Load() == 0 {
		t.Fatal("the waiter's node was never deleted: the granting look sent no sync")
	}
	if lk.Token() == uint64(deleted.Load()) {
		t.Fatalf("granted on the node deleted before the sync (token %d)", lk.Token())
	}
	select {
	case <-lk.Lost():
		t.Fatalf("the granted lock is lost at once: %v", lk.Err())
	default:
	}
}

// After the client reconnected (to another server, in an ensemble) the
// watch on the waiter's own node is set again only after the requests
// already queued, so a deletion of the node before the sync need not
// arrive before the sync's reply: the granting look then lists the queue
// again after the sync.
// Symptom: after a reconnect, a listing answered before the sync by a lagging server could grant a node deleted meanwhile.
func TestWaiter_AfterReconnect_ListsAgainAfterTheSync(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	holder := zklock.New(connect(t, []string{z.Addr()}))
	wconn := connect(t, []string{p.Addr()})
	waiter := zklock.New(wconn)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	held, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		reqs      []string
		recording bool
		watched   bool
		watching  = make(chan struct{})
		once      sync.Once
	)
	zklock.SetHooks(waiter, &zklock.Hooks{Request: func(what string) {
		mu.Lock()
		defer mu.Unlock()
		if recording {
			reqs = append(reqs, what)
		}
		switch {
		case what == "watch":
			watched = true
		case what == "exists" && watched:
			// The wait's first probe: its watch is set.
			once.Do(func() { close(watching) })
		}
	}})
	got := acquireAndRelease(ctx, waiter, key)
	if recvErr(t, errorOn(watching), "the waiter's watch on the holder") != nil {
		return
	}
	sid := wconn.SessionID()
	p.Cut()
	waitDisconnected(t, wconn)
	p.Heal()
	waitSession(t, wconn)
	if wconn.SessionID() != sid {
		t.Fatalf("the session changed (%x -> %x)", sid, wconn.SessionID())
	}
	mu.Lock()
	recording = true
	mu.Unlock()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvErr(t, got, "the waiter's Acquire"); err != nil {
		t.Fatalf("waiter: %v", err)
	}
	zklock.SetHooks(waiter, nil)
	mu.Lock()
	defer mu.Unlock()
	look := reqs
	if i := slices.IndexFunc(reqs, func(r string) bool { return strings.HasPrefix(r, "release") }); i >= 0 {
		look = reqs[:i]
	}
	if !slices.Contains(look, "sync") || len(look) < 3 || look[len(look)-1] != "list" ||
		slices.Index(look, "sync") > len(look)-2 || slices.Index(look, "list") == len(look)-1 {
		t.Fatalf("the granting look's requests after the reconnect: %v, want a listing with the sync and one after it", look)
	}
}

// errorOn is a channel that yields nil once ch is closed.
func errorOn(ch <-chan struct{}) <-chan error {
	out := make(chan error, 1)
	go func() { <-ch; out <- nil }()
	return out
}

// acquireAndRelease acquires key with l and releases it, in the
// background, and sends the first error (or nil) on the channel.
func acquireAndRelease(ctx context.Context, l *zklock.Locker, key string) <-chan error {
	got := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(ctx, key)
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	return got
}
