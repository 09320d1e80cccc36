package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// A Redlock release takes effect on every node but every reply is lost
// (Release returns an error). The key then changes hands once. The caller
// retries Release ("after a network error the next call retries"); the
// promise is that a release whose reply was lost is reported released,
// never lost.
func TestRegressReleaseRetryAfterHandover(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2})
	other := c.locker(t)
	key := dlocktest.Key(t)

	// Warm up the script cache on a key of its own: a release of this
	// key returns once a majority released, and its request to the last
	// node may land after the next attempt's, which that node then
	// refuses (the lease never reaches every node).
	w, err := l.Acquire(dlocktest.Context(t), key+".warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	// A phase-one grant may land on the last node after Acquire returned
	// (a majority sufficed): the release must find it there to remove it.
	heldOnAll(t, c, key, lk)
	// Every node releases, every reply is lost, and the links stay cut
	// from that moment, so go-redis's resends on new connections fail too.
	link.LoseReplyAndCut()
	err1 := lk.Release(dlocktest.Context(t))
	link.Heal()
	if err1 == nil || link.Dropped() != len(link) {
		t.Fatalf("first Release with every reply lost: %v (%d of %d replies dropped), want an error", err1, link.Dropped(), len(link))
	}
	for i, v := range c.holders(t, key) {
		if !strings.HasPrefix(v, "|") {
			t.Fatalf("node %d holds %q after the release took effect there: %q", i, key, v)
		}
	}
	o, err := other.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Release(context.Background())
	err2 := lk.Release(dlocktest.Context(t))
	if errors.Is(err2, dlock.ErrLockLost) || errors.Is(err2, dlock.ErrNotHeld) {
		t.Fatalf("retried Release of a lock released cleanly reports it lost: %v", err2)
	}
	if err2 != nil {
		t.Fatalf("retried Release: %v", err2)
	}
}
