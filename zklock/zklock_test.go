package zklock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// Session timeouts the tests ask for (the servers' tick is 200ms, their
// maximum session timeout 60s, so both are granted as asked): a lock's
// lease is 1s on a short session, 4s on a long one. The fault section runs
// on long sessions: its calls against a hung server take 2s in all, and
// locks it expects to survive them must.
const (
	sessionTimeout     = 1500 * time.Millisecond
	longSessionTimeout = 6 * time.Second
)

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
func expire(t testing.TB, admin *zk.Conn, key string) {
	t.Helper()
	dir := zklock.New(admin).Path(key)
	kids, _, err := admin.Children(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if err := admin.Delete(dir+"/"+k, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			t.Fatal(err)
		}
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
	}
}

// withFaults adds the fault section: Faults.New reaches the servers
// through one fault proxy each, Pause stops a majority of them (SIGSTOP).
// Harness.New must not wait for a session: the paused-server test makes
// a client while the servers hang.
func withFaults(h dlocktest.Harness, nodes []*testserver.ZooKeeper, session time.Duration) dlocktest.Harness {
	addrs := testserver.ZooKeeperAddrs(nodes)
	h.New = func(t testing.TB) dlock.Locker { return plainLocker(t, addrs, session) }
	h.Faults = &dlocktest.Faults{
		TTL: zklock.LeaseOf(session),
		New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
			var ps testserver.Proxies
			var paddrs []string
			for _, z := range nodes {
				p := testserver.StartProxy(t, z.Addr())
				ps = append(ps, p)
				paddrs = append(paddrs, p.Addr())
			}
			return zklock.New(connectFor(t, paddrs, session)), ps
		},
		Pause: func(t testing.TB, keys ...string) func() {
			paused := nodes[:len(nodes)/2+1]
			for _, z := range paused {
				z.Pause()
			}
			return func() {
				for _, z := range paused {
					z.Resume()
				}
			}
		},
	}
	return h
}

func TestConformanceStandalone(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	dlocktest.TestLocker(t, harness(t, []string{z.Addr()}, sessionTimeout))
}

func TestConformanceStandaloneFaults(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	nodes := []*testserver.ZooKeeper{z}
	dlocktest.TestLocker(t, withFaults(harness(t, []string{z.Addr()}, longSessionTimeout), nodes, longSessionTimeout))
}

func TestConformanceEnsembleFaults(t *testing.T) {
	nodes := testserver.StartZooKeeperEnsemble(t, 3)
	addrs := testserver.ZooKeeperAddrs(nodes)
	dlocktest.TestLocker(t, withFaults(harness(t, addrs, longSessionTimeout), nodes, longSessionTimeout))
}
