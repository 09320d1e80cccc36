package redlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// A break reports every node it removed the lease from; with a minority of
// nodes down it still counts, naming them in NodeErrors; with a majority
// down it fails with ErrUnavailable.
func TestBreakPerNode(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	key := dlocktest.Key(t)
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	heldOnAll(t, c, key, lk)
	b, err := dlock.Break(dlocktest.Context(t), l, key, "")
	if err != nil {
		t.Fatalf("Break: %v", err)
	}
	if len(b.Holders) != 1 || b.Holders[0].Owner != lk.Owner() || b.Holders[0].Token != lk.Token() {
		t.Errorf("Holders = %+v, want the one lock (token %d)", b.Holders, lk.Token())
	}
	if len(b.Nodes) != 5 || len(b.NodeErrors) != 0 {
		t.Errorf("Nodes = %+v, NodeErrors = %v; want the lease removed on all 5 nodes", b.Nodes, b.NodeErrors)
	}
	if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Release of a broken lock = %v, want ErrLockLost", err)
	}

	// Two of five down: the break counts, and names them.
	key = dlocktest.Key(t)
	lk, err = l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	heldOnAll(t, c, key, lk)
	c.srvs[1].Stop()
	c.srvs[4].Stop()
	b, err = dlock.Break(dlocktest.Context(t), l, key, lk.Owner())
	if err != nil {
		t.Fatalf("Break with 2 of 5 nodes down: %v", err)
	}
	if len(b.Holders) != 1 || len(b.Nodes) != 3 || len(b.NodeErrors) != 2 {
		t.Errorf("Break with 2 of 5 down = %+v; want one holder removed on 3 nodes, 2 node errors", b)
	}
	if err := lk.Refresh(dlocktest.Context(t)); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Refresh of a lock broken on a majority = %v, want ErrLockLost", err)
	}
	lk.Release(context.Background())

	// Three of five down: no majority answers.
	c.srvs[2].Stop()
	if _, err := dlock.Break(dlocktest.Context(t), l, dlocktest.Key(t), ""); !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Break with 3 of 5 nodes down = %v, want ErrUnavailable", err)
	}
}
