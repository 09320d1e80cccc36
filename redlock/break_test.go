package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redlock"
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

// A majority a little slower than the node timeout does not fail a break:
// it is waited for up to ten node timeouts.
// Symptom: a break failed with "no answer within 1s" from a majority a little slower than the node timeout.
func TestBreak_WaitsForAMajoritySlowerThanTheNodeTimeout(t *testing.T) {
	const nodeTimeout = 300 * time.Millisecond
	key, lk, operator, link := heldForBreak(t, []int{0, 1, 2}, nodeTimeout)
	// A round trip takes 2d: more than the node timeout, well within the
	// ten node timeouts a majority is waited for.
	for _, p := range link {
		p.Delay(nodeTimeout * 2 / 3)
	}
	b, err := dlock.Break(dlocktest.Context(t), operator, key, "")
	if err != nil {
		t.Fatalf("Break with every node slower than the node timeout: %v", err)
	}
	if len(b.Holders) != 1 || b.Holders[0].Owner != lk.Owner() {
		t.Errorf("Break removed %+v, want the holder", b.Holders)
	}
}

// A hung node of three: the break succeeds on the other two, names the
// hung one in NodeErrors, and returns with the node timeout, not with
// ctx's far deadline.
func TestBreak_HungMinorityCostsTheNodeTimeout(t *testing.T) {
	key, lk, operator, link := heldForBreak(t, []int{2}, 200*time.Millisecond)
	link.Stall()
	defer link.Heal()
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	b, err := dlock.Break(ctx, operator, key, "")
	if err != nil {
		t.Fatalf("Break with one hung node of 3: %v", err)
	}
	if ctx.Err() != nil {
		t.Errorf("Break with one hung node of 3 waited for ctx's deadline")
	}
	if len(b.Holders) != 1 || b.Holders[0].Owner != lk.Owner() || len(b.Nodes) != 2 || len(b.NodeErrors) != 1 || !errors.Is(b.NodeErrors[0], dlock.ErrUnavailable) {
		t.Errorf("Break with one hung node = %+v; want the holder removed on 2 nodes, the hung one in NodeErrors", b)
	}
}

// heldForBreak starts three nodes with key held on all of them by lk,
// and an operator's locker reaching the nodes via through proxies, with
// nodeTimeout, whose connections are already dialled (so a fault put on
// the proxies slows or stalls a break, not a dial).
func heldForBreak(t *testing.T, via []int, nodeTimeout time.Duration) (string, *dlock.Lock, *redlock.Locker, testserver.Proxies) {
	t.Helper()
	c := startNodes(t, 3)
	key := dlocktest.Key(t)
	lk, err := c.locker(t).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	heldOnAll(t, c, key, lk)
	operator, link := c.lockerVia(t, via, redlock.WithNodeTimeout(nodeTimeout))
	if _, err := dlock.Break(dlocktest.Context(t), operator, dlocktest.Key(t), ""); err != nil {
		t.Fatalf("warm-up Break: %v", err)
	}
	return key, lk, operator, link
}
