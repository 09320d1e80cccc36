//go:build unix

package testserver

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// A stopped proxy's address refuses connections, and its port stays
// claimed: no proxy or server of the machine's tests is given it again.
// (A Redis Cluster client dialling a stopped proxy reached a later proxy
// that the kernel had given the same port.)
func TestProxy_StoppedAddressRefusesAndStaysClaimed(t *testing.T) {
	stopped := StartProxy(t, "127.0.0.1:1")
	addr := stopped.Addr()
	stopped.Stop()
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(ps)
	if port < portLow || port >= portHigh {
		t.Fatalf("proxy port %d is outside the claimed range [%d, %d)", port, portLow, portHigh)
	}
	f, err := os.Open(filepath.Join(portDir, ps))
	if err != nil {
		t.Fatalf("no claim file for port %d: %v", port, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		t.Fatalf("port %d of a stopped proxy is no longer claimed", port)
	}
	for range 50 {
		if p := StartProxy(t, "127.0.0.1:1"); p.Addr() == addr {
			t.Fatalf("a new proxy was given the stopped proxy's address %s", addr)
		}
	}
	c, err := net.DialTimeout("tcp", addr, hangBound)
	if err == nil {
		c.Close()
		t.Fatalf("dial of the stopped proxy %s connected", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial of the stopped proxy %s: %v, want connection refused", addr, err)
	}
}
