package zklock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
)

// Symptom: a Release retried right after a lost reply failed with "zk:
// could not connect to a server": go-zookeeper drops the requests it has
// not sent each time it goes round its servers to reconnect (with one
// address, at every reconnection), even when the next dial succeeds.
// A request dropped unsent is sent once more; one dropped twice is the
// outage it reports (transient: nothing was sent); any other error is
// not sent again.
func TestCall_DroppedUnsent_SentOnceMore(t *testing.T) {
	b := &backend{timeout: time.Minute}
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		errs  []error
		sends int32
		want  error
	}{
		{"dropped once", []error{zk.ErrNoServer, nil}, 2, nil},
		{"dropped twice", []error{zk.ErrNoServer, zk.ErrNoServer, nil}, 2, dlock.ErrTransient},
		{"connection closed", []error{zk.ErrConnectionClosed, nil}, 1, dlock.ErrUnavailable},
	} {
		var n atomic.Int32
		v, err := call(ctx, b, "test", func() (int, error) {
			i := n.Add(1) - 1
			if e := c.errs[i]; e != nil {
				return 0, e
			}
			return 7, nil
		})
		switch {
		case n.Load() != c.sends:
			t.Errorf("%s: sent %d times, want %d", c.name, n.Load(), c.sends)
		case c.want == nil && (err != nil || v != 7):
			t.Errorf("%s: %d, %v; want 7", c.name, v, err)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
		}
	}
}
