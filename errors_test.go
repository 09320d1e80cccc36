package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

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

func TestErrorsUnwrap(t *testing.T) {
	na := &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{Owner: "0123456789abcdef", Metadata: map[string]string{"host": "h", "pid": "1"}, TTL: time.Second}}, Cause: context.Canceled}
	if !errors.Is(na, dlock.ErrNotAcquired) || !errors.Is(na, context.Canceled) {
		t.Fatal("NotAcquiredError does not unwrap")
	}
	if s := na.Error(); !strings.Contains(s, "host=h pid=1") || !strings.Contains(s, "0123456789ab") || !strings.HasPrefix(s, "dlock: ") {
		t.Fatalf("message %q", s)
	}
	le := &dlock.LostError{Key: "k", Token: 3, Reason: "x", Cause: dlock.ErrNotHeld}
	if !errors.Is(le, dlock.ErrLockLost) || !errors.Is(le, dlock.ErrNotHeld) {
		t.Fatal("LostError does not unwrap")
	}
	st := &dlock.StaleTokenError{Resource: "r", Token: 1, Highest: 2}
	if !errors.Is(st, dlock.ErrStaleToken) {
		t.Fatal("StaleTokenError does not unwrap")
	}
}

// The hold cap's LostError names the reason once, and wraps
// ErrHoldCapReached and ErrLockLost.
// Symptom: its text read "hold cap reached: dlock: hold cap reached".
func TestLostErrorHoldCapText(t *testing.T) {
	e := &dlock.LostError{Key: "k", Token: 7, Reason: dlock.LossHoldCap, Cause: dlock.ErrHoldCapReached}
	if got, want := e.Error(), `dlock: lock "k" (token 7) lost: hold cap reached`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, dlock.ErrHoldCapReached) || !errors.Is(e, dlock.ErrLockLost) {
		t.Errorf("%v does not wrap ErrHoldCapReached and ErrLockLost", e)
	}
}
