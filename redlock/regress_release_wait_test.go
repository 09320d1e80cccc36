package redlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// Release returned as soon as a majority released, the slowest node's
// release still in flight: a forced Break (or a List) right after it saw
// the released lease on that node (the conformance check "a forced break
// of a released key removes nothing" failed on a loaded machine). Now a
// node a little slower than the majority (here: every link delayed by d,
// the third node's by 3d, so its release lands after the old Release had
// returned) answers within Release's grace, and holds no remnant of the
// lease when Release returns.
func TestRegressReleaseWaitsForSlowNode(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(5*time.Second))
	// How long the grace is (4x what the majority took) is not what this
	// is about: the slow node answers within it whatever the machine's
	// speed.
	redlock.SetEndlessGrace(t)
	const d = 30 * time.Millisecond
	for round := range 3 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, lk)
		link[0].Delay(d)
		link[1].Delay(d)
		link[2].Delay(3 * d)
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatalf("round %d: Release with one slower node: %v", round, err)
		}
		for i, v := range c.holders(t, key) {
			if strings.HasPrefix(v, lk.Owner()) {
				t.Errorf("round %d: node %d still holds the released lease when Release returned: %q", round, i, v)
			}
		}
		link.Heal()
	}
}

// A hung node cannot make Release fail or hold it past its context: a
// majority released is success, returned by ctx's deadline (shorter than
// the node timeout here) or by the node timeout.
func TestRegressReleaseHungNodeBounded(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(time.Second))
	// A deadline the majority meets on any machine (it takes a few ms).
	for _, d := range []time.Duration{2 * time.Second, 0} {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, lk)
		link[0].Stall()
		ctx, bound := context.Background(), time.Second // the node timeout
		if d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
			bound = d
		}
		start := time.Now()
		err = lk.Release(ctx)
		took := time.Since(start)
		if err != nil {
			t.Errorf("Release (ctx deadline %v) with one hung node of 3: %v", d, err)
		}
		if took > bound+dlocktest.OverrunBound {
			t.Errorf("Release (ctx deadline %v) with one hung node took %v, want by %v", d, took, bound)
		}
		link[0].Heal()
	}
}
