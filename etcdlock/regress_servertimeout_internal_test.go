package etcdlock

import (
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/dlock-go/dlock"
)

// CI (this session, a loaded machine): a blocking Acquire in
// TestMixedModesStress failed at once with "etcdserver: request timed out"
// while its context had minutes left. etcd's own request timeout (a
// proposal not committed in time, a leader lost or changed) is transient:
// the attempt leaves nothing behind, and Acquire tries again.
func TestRegressServerTimeoutIsTransient(t *testing.T) {
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
