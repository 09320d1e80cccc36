package dlocktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// unreachableTTL is the lease of the locks the Unreachable case holds
// while their server refuses or resets connections: long enough that
// the watchdog does not lose them at their deadline before the test's
// Release, however slow the machine.
const unreachableTTL = time.Minute

// unreachableWait bounds each call of the Unreachable case: a call that
// meets a refused or reset connection fails on its own long before; one
// whose client keeps redialling until the context ends fails by it.
const unreachableWait = 2 * time.Second

// TestUnreachable runs the suite's Unreachable case alone (h.Faults.New
// is required, h.Faults.Down used when set): for another deployment of a
// backend whose whole suite, fault section included, runs elsewhere (the
// same server through a connection pooler, say).
func TestUnreachable(t *testing.T, h Harness) {
	if h.Faults == nil || h.Faults.New == nil {
		t.Fatal("TestUnreachable needs Harness.Faults.New")
	}
	testUnreachable(t, h)
}

// testUnreachable: a server that refuses or resets connections is an
// outage. TryAcquire, Acquire (with a bounded context) and the Release of
// a held lock fail with an error wrapping ErrUnavailable, never a held
// key and never a bare network error, whether the client meets a
// refused connection (nothing listens at the address any more, or never
// did) or a reset one (Link.Cut).
func testUnreachable(t *testing.T, h Harness) {
	f := h.Faults
	t.Run("Reset", func(t *testing.T) {
		l, link := faulty(t, f)
		lk := mustAcquire(t, l, Key(t), dlock.WithTTL(unreachableTTL))
		link.Cut()
		wantUnreachable(t, "resets connections", l, lk)
	})
	if f.Down == nil {
		return
	}
	t.Run("RefusedAfterUse", func(t *testing.T) {
		l, down := f.Down(t)
		lk := mustAcquire(t, l, Key(t), dlock.WithTTL(unreachableTTL))
		down()
		wantUnreachable(t, "refuses connections", l, lk)
	})
	t.Run("RefusedFromStart", func(t *testing.T) {
		l, down := f.Down(t)
		down()
		wantUnreachable(t, "refuses connections", l, nil)
	})
}

// wantUnreachable checks that TryAcquire and Acquire through l and, when
// lk is not nil, lk's Release fail with ErrUnavailable: l's server(s)
// refuse or reset its connections (server says which).
func wantUnreachable(t *testing.T, server string, l dlock.Locker, lk *dlock.Lock) {
	t.Helper()
	calls := []struct {
		what string
		fn   func(ctx context.Context) error
	}{
		{"TryAcquire", func(ctx context.Context) error {
			_, err := l.TryAcquire(ctx, Key(t), dlock.WithTTL(unreachableTTL))
			return err
		}},
		{"Acquire", func(ctx context.Context) error {
			_, err := l.Acquire(ctx, Key(t), dlock.WithTTL(unreachableTTL))
			return err
		}},
	}
	if lk != nil {
		calls = append(calls, struct {
			what string
			fn   func(ctx context.Context) error
		}{"Release of a held lock", lk.Release})
	}
	for _, c := range calls {
		what := c.what + " against a server that " + server
		err := bounded(t, what, unreachableWait, c.fn)
		switch {
		case err == nil:
			t.Errorf("%s succeeded", what)
		case errors.Is(err, dlock.ErrNotAcquired):
			t.Errorf("%s: an outage reported as a held key: %v", what, err)
		case !errors.Is(err, dlock.ErrUnavailable):
			t.Errorf("%s: %v, want it to wrap ErrUnavailable", what, err)
		}
	}
}
