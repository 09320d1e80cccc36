package zklock_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
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

// faultSessionTimeout is the session timeout of the fault sections' clients
// (a lease of 6s; a whole number of milliseconds, as TTLs are). Their
// paused-server test holds a lock it expects to survive the pause: 2s of
// calls against the hung servers, after stopping every server process
// (which on a loaded machine takes seconds), and after a last renewal up
// to a third of the lease before the pause.
const faultSessionTimeout = 9 * time.Second

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

// harness is the conformance harness for the servers at addrs: Harness.New
// alternates between connections from zklock.Connect and from zk.Connect
// (with WithSessionTimeout), so both are held to the suite.
func harness(t *testing.T, addrs []string, session time.Duration) dlocktest.Harness {
	admin := connect(t, addrs)
	var n atomic.Int64
	return dlocktest.Harness{
		TTL: zklock.LeaseOf(session),
		New: func(t testing.TB) dlock.Locker {
			if n.Add(1)%2 == 0 {
				return zklock.New(connectFor(t, addrs, session))
			}
			return plainLocker(t, addrs, session)
		},
		Expire:          func(t testing.TB, key string) { expire(t, admin, key) },
		NoticesDeletion: true,
		FIFO:            true,
		// A lock's node goes with its session: a process's clean exit
		// closes its connection, and so the session.
		NewExiting: func(t testing.TB) (dlock.Locker, func()) {
			c := connectFor(t, addrs, session)
			return zklock.New(c), c.Close
		},
	}
}

// withFaults adds the fault section: Faults.New reaches the servers
// through one fault proxy each, Pause stops them (SIGSTOP, returning once
// they stopped). Harness.New must not wait for a session:
// the paused-server test makes a client while the servers hang.
func withFaults(h dlocktest.Harness, nodes []*testserver.ZooKeeper, session time.Duration) dlocktest.Harness {
	addrs := testserver.ZooKeeperAddrs(nodes)
	h.New = func(t testing.TB) dlock.Locker { return plainLocker(t, addrs, session) }
	h.Faults = &dlocktest.Faults{
		TTL: zklock.LeaseOf(session),
		New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
			return proxied(t, nodes, session)
		},
		// The same (its session made first), every proxy stopped by down.
		Down: func(t testing.TB) (dlock.Locker, func()) {
			l, ps := proxied(t, nodes, session)
			return l, func() {
				for _, p := range ps {
					p.Stop()
				}
			}
		},
		Pause: func(t testing.TB, keys ...string) func() {
			if len(nodes) == 1 {
				pause(t, nodes[0])
				return nodes[0].Resume
			}
			return pauseEnsemble(t, nodes)
		},
	}
	return h
}

// proxied returns a Locker with a session (zklock.Connect) that reaches
// the servers through a fault proxy each, and the proxies.
func proxied(t testing.TB, nodes []*testserver.ZooKeeper, session time.Duration) (*zklock.Locker, testserver.Proxies) {
	var ps testserver.Proxies
	var paddrs []string
	for _, z := range nodes {
		p := testserver.StartProxy(t, z.Addr())
		ps = append(ps, p)
		paddrs = append(paddrs, p.Addr())
	}
	return zklock.New(connectFor(t, paddrs, session)), ps
}

// pauseEnsemble hangs every member of the ensemble, and returns the
// function that resumes them: the followers first, and the leader only
// once they have elected one of themselves. Resumed together, or with the
// leader first, the members would find their links to each other timed
// out during the pause and the followers would sync with the old leader
// again, mid-epoch, while it still has proposals they never acknowledged:
// ZooKeeper 3.8.0 can then never commit anything again (every session
// create and write hangs). A leader that stepped down before the pause
// (its followers paused first) would instead close its clients'
// connections: the clients would see errors, not a hung service.
func pauseEnsemble(t testing.TB, nodes []*testserver.ZooKeeper) (resume func()) {
	var leader *testserver.ZooKeeper
	waitFor(t, "an ensemble leader", func() bool {
		leader = testserver.ZooKeeperLeader(nodes)
		return leader != nil
	})
	var followers []*testserver.ZooKeeper
	for _, z := range nodes {
		if z != leader {
			followers = append(followers, z)
		}
	}
	for _, z := range nodes {
		pause(t, z)
	}
	return func() {
		for _, z := range followers {
			z.Resume()
		}
		// Resumed even when the followers elect nobody in time: the test
		// fails then, and the tests after it must not meet a paused server.
		defer leader.Resume()
		waitFor(t, "a leader among the resumed followers", func() bool { return testserver.ZooKeeperLeader(followers) != nil })
	}
}

// The three suites run at once, each on servers of its own; the fault
// sections pause only their own.

func TestConformanceStandalone(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	dlocktest.TestLocker(t, harness(t, []string{z.Addr()}, sessionTimeout))
}

func TestConformanceStandaloneFaults(t *testing.T) {
	t.Parallel()
	z := testserver.StartZooKeeper(t)
	logsOnFailure(t, z)
	nodes := []*testserver.ZooKeeper{z}
	dlocktest.TestLocker(t, withFaults(harness(t, []string{z.Addr()}, faultSessionTimeout), nodes, faultSessionTimeout))
}

func TestConformanceEnsembleFaults(t *testing.T) {
	t.Parallel()
	nodes := testserver.StartZooKeeperEnsemble(t, 3)
	logsOnFailure(t, nodes...)
	addrs := testserver.ZooKeeperAddrs(nodes)
	dlocktest.TestLocker(t, withFaults(harness(t, addrs, faultSessionTimeout), nodes, faultSessionTimeout))
}
