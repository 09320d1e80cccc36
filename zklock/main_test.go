package zklock_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

func TestMain(m *testing.M) { testserver.Main(m, zkCloseLeak) }

// zkCloseLeak ignores go-zookeeper's connection loop when it stays blocked
// after Close: a request queued as the connection closes gets an error on
// its two-slot reply channel from the close, another when its write
// fails (it stays listed as pending) and a third from the final flush of
// pending requests, which blocks for ever (request completion is not
// idempotent: go-zookeeper/zk#163). It is the client library's goroutine,
// not dlock's, and happens when background work outlives a test's Close.
var zkCloseLeak = goleak.IgnoreTopFunction("github.com/go-zookeeper/zk.(*Conn).flushRequests")

// sharedZooKeeper returns the standalone ZooKeeper server of every test
// that neither pauses, stops nor restarts its server (a JVM takes seconds
// to start). Its tests use keys, prefixes and resources of their own.
func sharedZooKeeper(t testing.TB) *testserver.ZooKeeper {
	t.Helper()
	return testserver.Shared(t, "zookeeper", func(tb testserver.TB) *testserver.ZooKeeper {
		return testserver.StartZooKeeper(tb)
	})
}

// logsOnFailure logs each server's mode and the tail of its log when the
// test failed (before the servers are stopped).
func logsOnFailure(t testing.TB, nodes ...*testserver.ZooKeeper) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, z := range nodes {
			mode, err := z.Mode()
			b, _ := os.ReadFile(z.LogPath())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("ZooKeeper %s (id %d): mode %q (%v); log tail:\n%s", z.Addr(), z.ID(), mode, err, b)
		}
	})
}

// sessionTimeout is the session timeout the tests' clients ask for (the
// servers' tick is 200ms, their maximum session timeout 60s, so it is
// granted as asked): a lock's lease is 4s. A session is a clock on both
// sides: the client drops its connection when the server is silent for
// two thirds of it, the server expires it when the client is silent for
// all of it, and a lock is lost when its lease passes without a renewal.
// So it is long enough for a server or client starved of CPU on a loaded
// machine, and short enough for the tests that stall a client's link and
// wait for its expiry.
const sessionTimeout = 6 * time.Second

// connect returns a connection to servers made by zklock.Connect, closed
// when the test ends.
func connect(t testing.TB, servers []string, opts ...zklock.Option) *zk.Conn {
	t.Helper()
	return connectFor(t, servers, sessionTimeout, opts...)
}

func connectFor(t testing.TB, servers []string, session time.Duration, opts ...zklock.Option) *zk.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	c, err := zklock.Connect(ctx, servers, session, append([]zklock.Option{zklock.WithLogger(quiet{})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// plainLocker is a Locker on a connection made by zk.Connect, the way a
// program that already has one would use zklock: it does not wait for the
// session (so it can be made while the servers hang).
func plainLocker(t testing.TB, servers []string, session time.Duration) *zklock.Locker {
	t.Helper()
	c, _, err := zk.Connect(servers, session, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return zklock.New(c, zklock.WithSessionTimeout(session))
}

// quiet drops go-zookeeper's log lines (every reconnect logs).
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// expire deletes key's queue nodes behind their owners' backs, as an
// operator's `deleteall` would.
//
// It is the test's doing, not the behaviour under test: when the admin's
// connection drops under it (the test process starved past its read
// timeout), it is done again once the admin reconnects (every step is
// idempotent).
func expire(t testing.TB, admin *zk.Conn, key string) {
	t.Helper()
	dir := zklock.New(admin).Path(key)
	once := func() error {
		// The admin's server may not have applied the holder's create yet
		// (a follower reads behind the leader): sync it first.
		if _, err := admin.Sync(dir); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		kids, _, err := admin.Children(dir)
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := admin.Delete(dir+"/"+k, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return err
			}
		}
		return nil
	}
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(20 * time.Millisecond) {
		err := once()
		if (errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrConnectionClosed)) && time.Now().Before(end) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
}
