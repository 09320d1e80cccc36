package zklock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// faultSessionTimeout is the session timeout of the fault sections' clients
// (a lease of 6s; a whole number of milliseconds, as TTLs are). Their
// paused-server test holds a lock it expects to survive the pause: 2s of
// calls against the hung servers, after stopping every server process
// (which on a loaded machine takes seconds), and after a last renewal up
// to a third of the lease before the pause.
const faultSessionTimeout = 9 * time.Second

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

// The conformance suite with its fault section, on a standalone server
// and on an ensemble of 3, each on servers of its own: the fault sections
// pause only their own.
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
