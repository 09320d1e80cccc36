package zklock_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/zklock"
)

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

// The conformance suite on a standalone server (the fault sections, on
// servers of their own, run at once: faults_test.go).
func TestConformanceStandalone(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	dlocktest.TestLocker(t, harness(t, []string{z.Addr()}, sessionTimeout))
}
