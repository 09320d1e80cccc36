package redlock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// A forced Break right after Release removed the released lease from one
// node: that node's phase-one grant was still in flight when Release
// began, answered the release with "lease gone", and then granted.
func TestRelease_SettlesAGrantStillInFlight(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t, redlock.WithNodeTimeout(5*time.Second))
	// The grace's length is not what this is about: Release waits for
	// every node's answers and the acquisition's, bounded by the node
	// timeout.
	redlock.SetEndlessGrace(t)
	gate, landed := make(chan struct{}), make(chan struct{})
	var open sync.Once
	// Node 2's grant is held back until Release, having released the
	// majority, waits for the stragglers.
	var land sync.Once
	redlock.SetGrantHook(t, l, 2, func() { <-gate }, func() { land.Do(func() { close(landed) }) })
	release := func() { open.Do(func() { close(gate) }) }
	redlock.SetSettleHook(t, func(context.Context) { release() })
	t.Cleanup(release)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-landed:
	default:
		t.Fatal("Release returned before node 2 answered the acquisition's grant")
	}
	for i, v := range c.holders(t, key) {
		if strings.HasPrefix(v, lk.Owner()) {
			t.Errorf("node %d holds the released lease when Release returned: %q", i, v)
		}
	}
}
