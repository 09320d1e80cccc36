package dlock_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock"
)

// A refused connection marked unavailable still matches its errno, and
// its message names the outage once. Symptom guarded against: a backend's
// refused dial that matched no dlock sentinel, or lost ECONNREFUSED.
func TestUnavailable_KeepsTheNetworkError(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	err := dlock.Unavailable(fmt.Errorf("dlock: redis acquire %q: %w", "x", refused))
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%v: want ErrUnavailable and ECONNREFUSED", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op != refused {
		t.Fatalf("%v: the *net.OpError is not in the chain", err)
	}
	want := `dlock: lock service unavailable: redis acquire "x": dial tcp: connect: connection refused`
	if err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	if dlock.Unavailable(nil) != nil {
		t.Fatal("Unavailable(nil) is not nil")
	}
	if again := dlock.Unavailable(err); again != err {
		t.Fatalf("marked twice: %v", again)
	}
}
