package driver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock/driver"
)

type a struct{ n int }
type b struct{ s string }

func TestApplyPicksItsOwnSettings(t *testing.T) {
	opts := []driver.Option{
		driver.Setting(func(x *a) { x.n = 7 }),
		nil,
		driver.Setting(func(x *b) { x.s = "b" }),
		driver.Setting[a](nil),
	}
	var x a
	var y b
	driver.Apply(&x, opts)
	driver.Apply(&y, opts)
	if x.n != 7 || y.s != "b" {
		t.Fatalf("got %+v %+v", x, y)
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[driver.Mode]string{driver.Exclusive: "exclusive", driver.Shared: "shared", driver.Limited: "limited", 9: "mode(9)"} {
		if got := m.String(); got != want {
			t.Errorf("%d: %q, want %q", m, got, want)
		}
	}
}

// A refused or reset connection is told apart from the context's end and
// from a client closed by its owner. Symptom guarded against: a dial to a
// port where nothing listens classified as anything but unreachable.
func TestUnreachable_RefusedResetEOF_NotContextOrClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, refused := net.Dial("tcp", addr) // nothing listens there any more
	if refused == nil {
		t.Fatalf("dial %s succeeded after its listener closed", addr)
	}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused dial", refused, true},
		{"refused dial, wrapped", fmt.Errorf("redis acquire: %w", refused), true},
		{"reset", reset, true},
		{"broken pipe", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, true},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("i/o timeout")}, true},
		{"EOF", io.EOF, true},
		{"unexpected EOF, wrapped", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true},
		{"nil", nil, false},
		{"deadline", context.DeadlineExceeded, false},
		{"dial cut by the deadline", &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}, false},
		{"cancelled", fmt.Errorf("acquire: %w", context.Canceled), false},
		{"closed by its owner", &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}, false},
		{"a server's error reply", errors.New("ERR unknown command"), false},
	} {
		if got := driver.Unreachable(c.err); got != c.want {
			t.Errorf("%s (%v): Unreachable = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

type c struct{}

// An option of another package's settings is foreign; nil options, core
// options and the package's own are not.
func TestForeign_ReportsAnotherPackagesOptionOnly(t *testing.T) {
	own := []driver.Option{nil, driver.Setting(func(*a) {}), driver.CoreSetting(func(*struct{ n int }) {})}
	if o, name := driver.Foreign[b](own); o != nil || name != "" {
		t.Fatalf("Foreign of own and core options = %v %q, want none", o, name)
	}
	foreign := driver.Setting(func(*http.Request) {})
	o, name := driver.Foreign[c](append(own, foreign))
	if o == nil || name != "http" {
		t.Fatalf("Foreign of a net/http option = %v %q, want it and \"http\"", o, name)
	}
	var core struct{ n int }
	driver.Apply(&core, []driver.Option{driver.CoreSetting(func(x *struct{ n int }) { x.n = 3 })})
	if core.n != 3 {
		t.Fatalf("a core option was not applied: %+v", core)
	}
}
