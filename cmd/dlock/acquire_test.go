package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// acquireErrorStatus gives the conflict status only when a holder was
// seen.
func TestAcquireErrorStatus(t *testing.T) {
	t.Parallel()
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"held", &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{Owner: "o1"}}}, 75},
		{"held, metadata only", &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{Metadata: map[string]string{"pid": "1"}}}}, 75},
		{"reserved for a waiter", &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{TTL: time.Second}}}, 75},
		{"waited, holder seen", &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{Owner: "o1"}}, Cause: context.DeadlineExceeded}, 75},
		{"waited, nothing seen", &dlock.NotAcquiredError{Key: "k", Cause: errors.Join(netErr, context.DeadlineExceeded)}, exitBackend},
		{"no answer at all", &dlock.NotAcquiredError{Key: "k", Cause: context.DeadlineExceeded}, exitBackend},
		{"refused, no holder named", &dlock.NotAcquiredError{Key: "k"}, 75},
		{"mode not offered", fmt.Errorf("%w: the zk backend does not offer shared locks", dlock.ErrUnsupported), exitUsage},
		{"limit mismatch", fmt.Errorf("%w: held with 2 permits, not 3", dlock.ErrLimitMismatch), exitUsage},
		{"outage", fmt.Errorf("dlock: redis acquire %q: %w", "k", netErr), exitBackend},
		{"context", context.DeadlineExceeded, exitBackend},
		{"bad ttl", fmt.Errorf("%w: too short", dlock.ErrInvalidTTL), exitUsage},
	}
	for _, c := range cases {
		if got := acquireErrorStatus(c.err, 75); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
