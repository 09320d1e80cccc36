package etcdlock_test

import (
	"net/url"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

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
