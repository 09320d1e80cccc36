package redlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
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

// A break of a lease on a minority of its nodes leaves the lock held (a
// majority still holds it); a break of one more node, which leaves a
// minority, closes Lost() before the holder's first renewal point, told
// by the nodes' break notices.
// Symptom: a broken Redlock holder learned of the break only at its next renewal.
func TestBind_LostOnceABreakLeavesAMinority(t *testing.T) {
	c := startNodes(t, 3)
	checked := make(chan int, 16)
	redlock.SetBreakCheckHook(t, func(held int) {
		select {
		case checked <- held:
		default:
		}
	})
	key := dlocktest.Key(t)
	const ttl = time.Minute // first renewal point 20s on: far past a notice
	lk, err := c.locker(t).Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	heldOnAll(t, c, key, lk)
	// One node's operator: a break through it removes the lease there
	// alone, and publishes there.
	breakOn := func(i int) {
		t.Helper()
		op := redlock.New([]redis.UniversalClient{c.client(t, c.srvs[i])})
		if b, err := dlock.Break(dlocktest.Context(t), op, key, ""); err != nil || len(b.Holders) != 1 {
			t.Fatalf("Break on node %d: %+v, %v", i, b, err)
		}
	}
	// The check once the subscriptions are in place, then the one the
	// break notice triggers (a check may stop once a majority is seen
	// holding, so its count says nothing of node 0).
	nextCheck := func() {
		t.Helper()
		select {
		case <-checked:
		case <-lk.Lost():
			t.Fatalf("lost with the lease still on 2 of 3 nodes: %v", lk.Err())
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: no check of the held lock")
		}
	}
	nextCheck()
	breakOn(0)
	nextCheck()
	if lk.Err() != nil {
		t.Fatalf("lost with the lease still on 2 of 3 nodes: %v", lk.Err())
	}
	breakOn(1)
	timer := time.NewTimer(ttl / 3)
	defer timer.Stop()
	select {
	case <-lk.Lost():
	case <-timer.C:
		t.Fatal("Lost() still open at the first renewal point with the lease on 1 of 3 nodes")
	}
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossBackend || !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Errorf("Err() = %v, want a *LostError with reason %q wrapping ErrNotHeld", lk.Err(), dlock.LossBackend)
	}
}

// With one node of three stalled, the check a break notice triggers
// waits for that node no longer than the node timeout: a break that
// leaves a minority closes Lost() by then, not when the stalled client
// gives up.
// Symptom: each check waited about 5s for the stalled node, and Lost() closed 10s after the break.
func TestBind_CheckReturnsByNodeTimeout_NodeStalled(t *testing.T) {
	c := startNodes(t, 3)
	checked := make(chan int, 16)
	redlock.SetBreakCheckHook(t, func(held int) {
		select {
		case checked <- held:
		default:
		}
	})
	const nodeTimeout = 300 * time.Millisecond
	holder, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(nodeTimeout))
	key := dlocktest.Key(t)
	lk, err := holder.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	heldOnAll(t, c, key, lk)
	select { // the lock listens on every node
	case <-checked:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the held lock never checked its nodes")
	}
	link.Stall()
	defer link.Heal()
	breakOn := func(i int) {
		t.Helper()
		op := redlock.New([]redis.UniversalClient{c.client(t, c.srvs[i])})
		if b, err := dlock.Break(dlocktest.Context(t), op, key, ""); err != nil || len(b.Holders) != 1 {
			t.Fatalf("Break on node %d: %+v, %v", i, b, err)
		}
	}
	breakOn(0)
	breakOn(1)
	broken := time.Now()
	// The notices of both breaks may each cost a check.
	deadline := broken.Add(2 * nodeTimeout)
	m := dlocktest.StartStallMeter(broken)
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Lost() never closed with the lease on 0 of 2 answering nodes")
	}
	end := time.Now()
	if o := dlocktest.Overrun(deadline, end, m.StopAt(end)); o > dlocktest.OverrunBound {
		t.Errorf("Lost() closed %v after the break (%v past the two checks' node timeouts)", end.Sub(broken), o)
	}
	if !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Errorf("Err() = %v, want ErrNotHeld", lk.Err())
	}
}

// With one node of three down, its subscription signals each attempt to
// reconnect (every 50ms): a held lock checks its nodes at most once per
// node timeout, not once per signal.
// Symptom: every listening lock read every node about 20 times a second while one node was down.
func TestBind_ChecksAtMostOncePerNodeTimeout_NodeDown(t *testing.T) {
	c := startNodes(t, 3)
	var checks atomic.Int32
	first := make(chan struct{}, 1)
	redlock.SetBreakCheckHook(t, func(int) {
		checks.Add(1)
		select {
		case first <- struct{}{}:
		default:
		}
	})
	const nodeTimeout = 200 * time.Millisecond
	key := dlocktest.Key(t)
	lk, err := c.locker(t, redlock.WithNodeTimeout(nodeTimeout)).Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	select { // the lock listens on every node
	case <-first:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the held lock never checked its nodes")
	}
	c.srvs[2].Stop()
	start, n0 := time.Now(), checks.Load()
	time.Sleep(2 * time.Second)
	n, window := checks.Load()-n0, time.Since(start)
	// A check begins at most once per node timeout after the previous one
	// ended: a slow machine makes fewer, never more.
	if limit := int32(window/nodeTimeout) + 1; n > limit {
		t.Errorf("%d checks in %v with one node down, want at most %d (one per node timeout)", n, window.Round(time.Millisecond), limit)
	}
	if lk.Err() != nil {
		t.Errorf("lost with the lease on 2 of 3 nodes: %v", lk.Err())
	}
}
