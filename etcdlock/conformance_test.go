package etcdlock_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// harnessOn is the conformance harness for the cluster serving eps. Its
// short lease is 4s. etcd's shortest lease is 2s by default (1.5 × the
// election timeout, rounded up to whole seconds), but on a loaded 2-core
// machine running the race detector a renewal's round trip can take more
// than the 1.3s that a 2s lease leaves it, and the renewed lock is then
// rightly reported lost: the suite's promises do not depend on the TTL,
// only on renewals fitting in it. The same holds for the leases of waiting
// entries, which ShortTTLContention takes at ShortTTL: a waiter whose
// lease expires loses its place and queues again at the back.
func harnessOn(eps []string, admin *clientv3.Client) dlocktest.Harness {
	return dlocktest.Harness{
		TTL:      4 * time.Second,
		ShortTTL: 4 * time.Second,
		New:      func(t testing.TB) dlock.Locker { return etcdlock.New(newClient(t, eps)) },
		Expire: func(t testing.TB, key string) {
			pfx := etcdlock.New(admin).QueuePrefix(key)
			if _, err := admin.Delete(context.Background(), pfx, clientv3.WithPrefix()); err != nil {
				t.Fatal(err)
			}
		},
		NoticesDeletion: true,
		FIFO:            true,
	}
}

// The member runs in a child process, as TestConformanceCluster's do.
func TestConformanceSingle(t *testing.T) {
	t.Parallel()
	eps := etcdtest.ProcessEndpoints(etcdtest.StartProcesses(t, 1))
	dlocktest.TestLocker(t, harnessOn(eps, newClient(t, eps)))
}

// The members run in child processes, as a real cluster's do: in the test
// process, the suite's clients (under the race detector) can starve the
// members' heartbeats and replies until leases of 2s expire.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	eps := etcdtest.ProcessEndpoints(etcdtest.StartProcesses(t, 3))
	dlocktest.TestLocker(t, harnessOn(eps, newClient(t, eps)))
}

// faultHarness runs the conformance suite, fault section included, on an
// etcd member in a child process: Faults.New talks to it through a TCP
// fault proxy, Pause stops the process (SIGSTOP), and Harness.New (the
// "other client") talks to it directly.
func faultHarness(t *testing.T) dlocktest.Harness {
	p := etcdtest.StartProcess(t)
	eps := []string{p.ClientURL()}
	u, err := url.Parse(p.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	h := harnessOn(eps, newClient(t, eps))
	h.Faults = &dlocktest.Faults{
		New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
			proxy := testserver.StartProxy(t, u.Host)
			return etcdlock.New(newClient(t, []string{"http://" + proxy.Addr()})), proxy
		},
		// The same, the proxy stopped by down.
		Down: func(t testing.TB) (dlock.Locker, func()) {
			proxy := testserver.StartProxy(t, u.Host)
			return etcdlock.New(newClient(t, []string{"http://" + proxy.Addr()})), proxy.Stop
		},
		Pause: func(t testing.TB, keys ...string) func() {
			p.Pause()
			return p.Resume
		},
	}
	return h
}

// The conformance suite with the fault section: a stalled link, a paused
// server, lost replies on acquire and release, an outage during a wait.
func TestConformanceFaults(t *testing.T) {
	t.Parallel()
	dlocktest.TestLocker(t, faultHarness(t))
}
