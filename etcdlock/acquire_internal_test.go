package etcdlock

import (
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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

// etcd's own request timeout (a proposal not committed in time, a leader
// lost or changed) is transient: the attempt leaves nothing behind, and
// Acquire tries again. Other errors pass unchanged.
// Symptom: a blocking Acquire failed at once with "etcdserver: request timed out" while its context had minutes left.
func TestServerTimeoutTransient_EtcdTimeoutsAreTransient(t *testing.T) {
	t.Parallel()
	for _, err := range []error{rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader} {
		wrapped := fmt.Errorf("dlock: etcd acquire %q: %w", "k", err)
		got := serverTimeoutTransient(wrapped)
		if !errors.Is(got, dlock.ErrTransient) || !errors.Is(got, err) {
			t.Errorf("%v: %v, want ErrTransient wrapping it", err, got)
		}
	}
	for _, err := range []error{nil, rpctypes.ErrPermissionDenied, rpctypes.ErrAuthFailed, errors.New("other"), fmt.Errorf("%w: x", dlock.ErrTransient)} {
		got := serverTimeoutTransient(err)
		if got != err {
			t.Errorf("%v: changed to %v", err, got)
		}
	}
}
