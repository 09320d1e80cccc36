//go:build !unix

package testserver

import "net"

// FreePort returns a loopback TCP port that was free a moment ago (no
// claim across processes here: see port.go).
func FreePort(t TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
