package etcdlock

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-go/dlock"
)

// A request that got no answer within its own request timeout is an
// outage, like a refused connection.
// Symptom: a keep-alive timing out on a loaded machine failed an Acquire with an error wrapping neither ErrUnavailable nor the context's.
func TestUnreachable_RequestTimeoutIsUnavailable(t *testing.T) {
	for _, c := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded} {
		err := unreachable(status.Error(c, "etcd did not answer"))
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("unreachable(status %v) = %v, want it to wrap ErrUnavailable", c, err)
		}
	}
	if err := unreachable(status.Error(codes.InvalidArgument, "bad")); errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("unreachable(InvalidArgument) = %v, want it unchanged", err)
	}
}
