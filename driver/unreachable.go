package driver

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// Unreachable reports whether err says that the lock service could not be
// reached or dropped the connection a request was on: a dial that failed
// (refused, no route, a name that does not resolve, a connect timeout), a
// connection reset or aborted, a broken pipe, or the connection closed
// under a request (io.EOF, io.ErrUnexpectedEOF). An error that wraps the
// context's end (a dial cut short by the caller's deadline) is not: what
// that means is the caller's to say. Nor is a client closed by its owner
// (net.ErrClosed).
//
// A backend marks such an error of a request as dlock.ErrUnavailable,
// keeping it in the chain so that errors.Is(err, syscall.ECONNREFUSED)
// still holds:
//
//	if driver.Unreachable(err) {
//		return dlock.Unavailable(err)
//	}
//
// A client library's own words for the same (a ZooKeeper connection
// closed, a gRPC status Unavailable) are the backend's to recognise.
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	for _, e := range connFailures {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// connFailures are the errors of a connection that failed or was dropped.
var connFailures = []error{
	syscall.ECONNREFUSED,
	syscall.ECONNRESET,
	syscall.ECONNABORTED,
	syscall.EPIPE,
	syscall.ENETUNREACH,
	syscall.EHOSTUNREACH,
	io.EOF,
	io.ErrUnexpectedEOF,
}
