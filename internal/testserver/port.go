//go:build unix

package testserver

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// Test servers listen on ports below Linux's ephemeral range (32768 and
// up by default), which the kernel hands to outgoing connections: a port
// picked there and bound a moment later can meanwhile be taken by any
// client connection of any test. Ports are also reserved across test
// processes (several modules' tests run at once): each is claimed with an
// advisory lock on a file named after it in portDir, held until the
// process exits, and never handed out twice.
const (
	portLow  = 10000
	portHigh = 22000 // port+10000 (a Redis Cluster bus port) stays below 32768
)

// portDir holds the claim files, one per port, shared by every test
// process of the machine.
var portDir = filepath.Join(os.TempDir(), "dlock-test-ports")

var (
	portMu sync.Mutex
	claims []*os.File // held open: closing a file would drop its claim
)

// FreePort returns a loopback TCP port that no other test process of
// the machine will be given and that was free a moment ago, reserved for
// this process until it exits.
func FreePort(t TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	if err := os.MkdirAll(portDir, 0o777); err == nil {
		for range 2000 {
			p := portLow + rand.IntN(portHigh-portLow)
			if claimPort(p) {
				return p
			}
		}
	}
	// No claim could be made (no temporary directory, or every port
	// tried taken): a port from the kernel's ephemeral range.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// claimPort claims p for this process if no process holds it and it can
// be bound now. portMu held.
func claimPort(p int) bool {
	f, err := os.OpenFile(filepath.Join(portDir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return false
	}
	// A second claim of p by this process fails too: flock locks belong
	// to the open file, not to the process.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		// In use by something outside the claims: keep the claim, so
		// that this process does not try p again.
		claims = append(claims, f)
		return false
	}
	l.Close()
	_ = f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid()) // who holds it, for a reader
	claims = append(claims, f)
	return true
}
