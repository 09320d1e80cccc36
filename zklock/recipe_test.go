package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// children returns the children of path (none if it does not exist).
func children(t testing.TB, c *zk.Conn, path string) []string {
	t.Helper()
	kids, _, err := c.Children(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return kids
}

// waitFor polls cond (a read of the server's state, not a timing claim)
// until it holds, failing as a hang after dlocktest.HangTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(dlocktest.HangTimeout)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("hang: %s did not happen within %v", what, dlocktest.HangTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The token is the node's czxid, and the key's znode holds one node per
// holder or waiter, named with the owner id.
func TestRecipeLayout(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	l := zklock.New(connect(t, []string{z.Addr()}), zklock.WithPrefix("/apps/billing"))
	key := "orders/42"
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithMetadata("host", "web-1"))
	if err != nil {
		t.Fatal(err)
	}
	dir := l.Path(key)
	if dir != "/apps/billing/orders%2F42" {
		t.Fatalf("Path = %q", dir)
	}
	kids := children(t, admin, dir)
	if len(kids) != 1 || !strings.HasPrefix(kids[0], "_c_"+lk.Owner()+"-lock-") {
		t.Fatalf("children of %s = %v, want one node named for owner %s", dir, kids, lk.Owner())
	}
	data, st, err := admin.Get(dir + "/" + kids[0])
	if err != nil {
		t.Fatal(err)
	}
	if uint64(st.Czxid) != lk.Token() || st.EphemeralOwner == 0 {
		t.Fatalf("token %d, node czxid %d, ephemeral owner %x", lk.Token(), st.Czxid, st.EphemeralOwner)
	}
	if !strings.Contains(string(data), "web-1") {
		t.Fatalf("node data %q lacks the metadata", data)
	}
	// "orders" and "orders/42" are different locks.
	lk2, err := l.TryAcquire(dlocktest.Context(t), "orders")
	if err != nil {
		t.Fatalf("a hierarchical key contends with its parent: %v", err)
	}
	lk2.Release(context.Background())
	if got := lk.TTL(); got != zklock.LeaseOf(sessionTimeout) {
		t.Fatalf("TTL() = %v, want two thirds of the session timeout %v", got, sessionTimeout)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// The key's znode is a container: the server removes it once empty.
	waitFor(t, dir+" removed after the last release", func() bool {
		ok, _, err := admin.Exists(dir)
		return err == nil && !ok
	})
}

// A release wakes exactly one waiter: each waiter watches only the node
// ahead of it, so one release fires one watch event (no herd). Waiters are
// served in arrival order.
func TestNoHerd(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	key := dlocktest.Key(t)
	holder, err := zklock.New(connect(t, []string{z.Addr()})).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	dir := zklock.New(admin).Path(key)
	const waiters = 20
	var mu sync.Mutex
	var order []int
	locks := make(chan *dlock.Lock, waiters)
	errs := make(chan error, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		l := zklock.New(connect(t, []string{z.Addr()}))
		waitFor(t, fmt.Sprintf("waiter %d queued", i), func() bool { return len(children(t, admin, dir)) == i+1 })
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
		waitFor(t, fmt.Sprintf("waiter %d queued", i), func() bool { return len(children(t, admin, dir)) == i+2 })
	}
	before := zklock.WatchEvents()
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
	if n := zklock.WatchEvents() - before; n != 1 {
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

// Keys acquired and released leave no znode behind: each release deletes
// its queue node, and the key's znode, a container, is removed by the
// server once empty (the test servers look every 500ms; ZooKeeper's
// default is every minute, at most 10,000 a minute).
func TestNoAccumulation(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 500
	}
	z := testserver.StartZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	prefix := "/accum-" + fmt.Sprint(time.Now().UnixNano())
	for w := range workers {
		l := zklock.New(connect(t, addrs), zklock.WithPrefix(prefix))
		wg.Go(func() {
			for i := w; i < n; i += workers {
				lk, err := l.TryAcquire(dlocktest.Context(t), fmt.Sprintf("job/%d", i))
				if err == nil {
					err = lk.Release(dlocktest.Context(t))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("the %d keys' znodes removed", n), func() bool {
		for _, k := range children(t, admin, prefix) {
			if q := children(t, admin, prefix+"/"+k); len(q) != 0 {
				t.Fatalf("key %s still has queue nodes %v after every release", k, q)
			}
			return false
		}
		return true
	})
	// A client that dies holding a lock leaves its key's znode to the
	// server's container reaper.
	dead := connect(t, addrs)
	if _, err := zklock.New(dead, zklock.WithPrefix(prefix)).Acquire(dlocktest.Context(t), "crashed"); err != nil {
		t.Fatal(err)
	}
	dead.Close() // the session ends: its ephemeral node goes
	waitFor(t, "the container of a crashed holder's key removed", func() bool { return len(children(t, admin, prefix)) == 0 })
}

// The reply to the create is lost: the client finds its node by its owner
// id and holds the lock with it; no second node, no orphan.
func TestLostCreateReplyRecovered(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	l := zklock.New(connect(t, []string{p.Addr()}))
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
	// The waiter's create: lose its reply once it is the second node.
	p.LoseNextReply()
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

// The leader of a 3-node ensemble is killed while a lock is held: the lock
// is either still held (and exclusive), or its Lost() closed; never lost
// silently.
func TestLeaderKilled(t *testing.T) {
	nodes := testserver.StartZooKeeperEnsemble(t, 3)
	addrs := testserver.ZooKeeperAddrs(nodes)
	l := zklock.New(connectFor(t, addrs, longSessionTimeout))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	leader := testserver.ZooKeeperLeader(nodes)
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Stop()
	// Wait for the survivors to elect a leader and serve again.
	var rest []*testserver.ZooKeeper
	for _, z := range nodes {
		if z != leader {
			rest = append(rest, z)
		}
	}
	waitFor(t, "a new leader", func() bool { return testserver.ZooKeeperLeader(rest) != nil })
	other := zklock.New(connectFor(t, testserver.ZooKeeperAddrs(rest), longSessionTimeout))
	lostBefore := false
	var tryErr error
	for i := 0; i < 3; i++ { // across a few renewals of the holder
		lostBefore = lostBefore || isClosed(lk.Lost())
		var lk2 *dlock.Lock
		lk2, tryErr = other.TryAcquire(dlocktest.Context(t), key)
		if tryErr == nil {
			if !lostBefore {
				t.Fatalf("another client acquired (token %d) while the holder (token %d) was not told it lost the lock", lk2.Token(), lk.Token())
			}
			lk2.Release(context.Background())
			break
		}
		if !errors.Is(tryErr, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire after the election: %v", tryErr)
		}
		time.Sleep(lk.TTL() / 2)
	}
	switch {
	case lk.Err() == nil:
		t.Logf("the lock survived the leader's death (token %d); renewals go on", lk.Token())
		if err := lk.Refresh(dlocktest.Context(t)); err != nil {
			t.Fatalf("Refresh after the election: %v", err)
		}
	default:
		t.Logf("the lock was reported lost: %v", lk.Err())
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// The holder's link stalls past its session timeout: the server expires
// the session; Lost() closed before anyone else held the key, and once the
// link heals the client learns the session expired.
func TestSessionExpiredByStall(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	l := zklock.New(connect(t, []string{p.Addr()}))
	key := dlocktest.Key(t)
	holder, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	lk := dlocktest.AcquireWhenFree(t, zklock.New(connect(t, []string{z.Addr()})), key, holder)
	defer lk.Release(context.Background())
	if !errors.Is(holder.Err(), dlock.ErrLockLost) {
		t.Fatalf("holder Err() = %v, want ErrLockLost", holder.Err())
	}
	if lk.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", lk.Token(), holder.Token())
	}
	p.Heal()
	// The old holder's client reconnects into an expired session and gets
	// a new one; its Locker works again.
	lk3, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatalf("Acquire after the session expired: %v", err)
	}
	lk3.Release(context.Background())
}

// A short disconnect (the connection reset, the session kept): the client
// reconnects within the lease and the lock is still held and exclusive, or
// (on a machine too slow to reconnect in time) Lost() closed before anyone
// else could hold it; never both held and taken.
func TestShortDisconnect(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	l := zklock.New(connectFor(t, []string{p.Addr()}, longSessionTimeout))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	p.Cut()
	time.Sleep(200 * time.Millisecond)
	p.Heal()
	other := zklock.New(connect(t, []string{z.Addr()}))
	err = lk.Refresh(dlocktest.Context(t))
	lostBefore := isClosed(lk.Lost())
	_, tryErr := other.TryAcquire(dlocktest.Context(t), key)
	switch {
	case err == nil:
		if !errors.Is(tryErr, dlock.ErrNotAcquired) {
			t.Fatalf("the lock was renewed after the reconnect, yet another client's TryAcquire = %v", tryErr)
		}
		t.Logf("held across the disconnect (token %d)", lk.Token())
	case errors.Is(err, dlock.ErrLockLost):
		if tryErr == nil && !lostBefore {
			t.Fatal("another client acquired before the holder's Lost() closed")
		}
		t.Logf("lost across the disconnect: %v", err)
	default:
		t.Fatalf("Refresh after the reconnect: %v", err)
	}
}
