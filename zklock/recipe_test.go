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

// loseCreateReply makes the reply to l's next queue node create get lost
// through p (the create takes effect, the client never hears): the fault
// is armed just before the create is sent, so that none of the client's
// other requests (its pings) claims it instead.
func loseCreateReply(l *zklock.Locker, p *testserver.Proxy) {
	var once sync.Once
	zklock.SetHooks(l, &zklock.Hooks{BeforeCreate: func() { once.Do(p.LoseNextReply) }})
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

// waitSession waits until c has a session again (after a heal).
func waitSession(t testing.TB, c *zk.Conn) {
	t.Helper()
	waitFor(t, "a session", func() bool { return c.State() == zk.StateHasSession })
}

// waitNewSession waits until c has a session other than old (the client
// reconnected into an expired one and was given a new one).
func waitNewSession(t testing.TB, c *zk.Conn, old int64) {
	t.Helper()
	waitFor(t, "a new session", func() bool { return c.State() == zk.StateHasSession && c.SessionID() != old })
}

// waitDisconnected waits until c noticed that its connection is gone.
func waitDisconnected(t testing.TB, c *zk.Conn) {
	t.Helper()
	waitFor(t, "the client noticed the cut", func() bool { return c.State() != zk.StateHasSession })
}

// uniquePrefix returns a znode prefix no other test uses.
func uniquePrefix(t testing.TB) string {
	return "/" + strings.ReplaceAll(dlocktest.Key(t), "/", ".")
}

// The token is the node's czxid, and the key's znode holds one node per
// holder or waiter, named with the owner id.
func TestRecipeLayout(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	prefix := uniquePrefix(t) + "/billing"
	l := zklock.New(connect(t, []string{z.Addr()}), zklock.WithPrefix(prefix))
	key := "orders/42"
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithMetadata("host", "web-1"))
	if err != nil {
		t.Fatal(err)
	}
	dir := l.Path(key)
	if dir != prefix+"/orders%2F42" {
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

// Keys acquired and released leave no znode behind: each release deletes
// its queue node, and the key's znode, a container, is removed by the
// server once empty (the test servers look every 500ms; ZooKeeper's
// default is every minute, at most 10,000 a minute).
func TestNoAccumulation(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 500
	}
	t.Parallel()
	z := sharedZooKeeper(t)
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
