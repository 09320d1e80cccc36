package zklock_test

import (
	"context"
	"errors"
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
//
// The read is the test's observation, not the behaviour under test: when
// c's connection drops under it (a loaded machine starved the client past
// its read timeout) it is read again once c reconnects.
func children(t testing.TB, c *zk.Conn, path string) []string {
	t.Helper()
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		kids, _, err := c.Children(path)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if (errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrConnectionClosed)) && time.Now().Before(end) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return kids
	}
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

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
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
