package redlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redlock"
)

// Red team 18: the grace (*lease).Release gives the slower nodes after a
// majority released.

// rt18Remnants returns the nodes among idx still holding owner's lease on
// key.
func rt18Remnants(t *testing.T, c *cluster, key, owner string, idx ...int) []int {
	t.Helper()
	h := c.holders(t, key)
	var out []int
	for _, i := range idx {
		if strings.HasPrefix(h[i], owner) {
			out = append(out, i)
		}
	}
	return out
}

// rt18Majority measures how long a Release takes when every node answers
// through links delayed by d (nothing stalled: Release returns once all
// three answered, so this is what a majority takes on such links): the
// fastest of three (the first may load the script).
func rt18Majority(t *testing.T, l *redlock.Locker, link testserver.Proxies, d time.Duration) time.Duration {
	t.Helper()
	best := time.Hour
	for range 3 {
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range link {
			p.Delay(d)
		}
		start := time.Now()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(start))
		link.Heal()
	}
	return best
}

// FAILING (finding 1). The grace is capped by "half of ctx's time left",
// but the ctx the driver sees is not the caller's: the core (lock.go
// releaseServer) runs the driver's Release on its own context, whose
// deadline is at least DefaultReleaseTimeout (5s) away. So with a caller
// deadline of twice what the majority takes, a stalled third node, and a
// majority on links slow enough that 4x the majority outlasts the caller's
// deadline, the grace runs past the caller's deadline and the core returns
// ErrUnavailable ("no answer before the context ended") for a Release a
// majority completed well before it. Expected: nil (the doc's promise: a
// hung node costs the grace, never the success; Release returns by ctx's
// deadline).
func TestRedTeam18_CallerDeadlineShorterThanGrace(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(5*time.Second))
	const d = 20 * time.Millisecond
	m := rt18Majority(t, l, link, d)
	budget := 2*m + 50*time.Millisecond
	t.Logf("majority on %v links takes %v; caller deadline %v", d, m, budget)
	for round := range 3 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		link[0].Delay(d)
		link[1].Delay(d)
		link[2].Stall()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		start := time.Now()
		err = lk.Release(ctx)
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Errorf("round %d: Release with a %v deadline (majority takes ~%v), node 2 stalled: %v after %v, want nil: the grace outlasted the caller's deadline", round, budget, m, err, took)
		}
		if took > budget+dlocktest.OverrunBound {
			t.Errorf("round %d: Release took %v, deadline %v", round, took, budget)
		}
		link.Heal()
	}
}

// FAILING (finding 2). A caller that cancels its ctx during the grace (a
// majority already released) gets ErrUnavailable from the core: the
// driver's "case <-ctx.Done()" in the grace never fires, its ctx being the
// core's WithoutCancel one, so the core's own select sees the caller's
// cancellation first. Expected: nil (a successful Release is never turned
// into an error by the grace).
func TestRedTeam18_CancelDuringGrace(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(5*time.Second))
	const d = 20 * time.Millisecond
	for round := range 3 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		link[0].Delay(d)
		link[1].Delay(d)
		link[2].Stall()
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { res <- lk.Release(ctx) }()
		// Nodes 0 and 1 released server-side; their replies reach the
		// client d later; the grace is then >= 4x the majority's time
		// (>= 4*2d): cancel well inside it.
		deadline := time.Now().Add(dlocktest.HangTimeout)
		for len(rt18Remnants(t, c, key, lk.Owner(), 0, 1)) > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(2*d + 10*time.Millisecond)
		cancel()
		select {
		case err = <-res:
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: Release did not return after its ctx was cancelled")
		}
		if err != nil {
			t.Errorf("round %d: Release cancelled during the grace (majority released): %v, want nil", round, err)
		}
		link.Heal()
	}
}
