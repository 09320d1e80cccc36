package redlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"

	"github.com/dlock-go/dlock/dlocktest"
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

// The caller's deadline passes while Release waits, after a majority
// released, for a stalled node (the grace): Release returns nil, by the
// deadline. Symptom: a grace run on the core's own context (at least
// DefaultReleaseTimeout) went past the caller's deadline, and the core
// reported ErrUnavailable for a lock a majority had released.
func TestRelease_NilWhenDeadlinePassesInGrace(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(5*time.Second))
	// The grace holds until the caller's deadline has passed.
	redlock.SetSettleHook(t, func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-time.After(dlocktest.HangTimeout):
		}
	})
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	heldOnAll(t, c, lk.Key(), lk)
	link[2].Stall()
	defer link.Heal()
	const budget = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	err = lk.Release(ctx)
	took := time.Since(start)
	if err != nil {
		t.Errorf("Release whose deadline passed in the grace (a majority released, node 2 stalled): %v after %v, want nil", err, took)
	}
	if took > budget+dlocktest.OverrunBound {
		t.Errorf("Release took %v with a %v deadline", took, budget)
	}
}

// The caller cancels Release's context while it waits, after a majority
// released, for a stalled node (the grace): Release returns nil. The
// grace's wait did not see the caller's cancellation, and the core's did:
// it reported ErrUnavailable for a lock a majority had released.
func TestRelease_NilWhenCancelledInGrace(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(5*time.Second))
	inGrace, cancelled := make(chan struct{}), make(chan struct{})
	var once sync.Once
	redlock.SetSettleHook(t, func(ctx context.Context) {
		if ctx == context.Background() {
			return // a stray Settle of another Release
		}
		once.Do(func() { close(inGrace) })
		<-cancelled
	})
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	heldOnAll(t, c, lk.Key(), lk)
	link[2].Stall()
	defer link.Heal()
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- lk.Release(ctx) }()
	select {
	case <-inGrace:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Release never reached its grace")
	}
	cancel()
	close(cancelled)
	select {
	case err = <-res:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Release did not return after its ctx was cancelled")
	}
	if err != nil {
		t.Errorf("Release cancelled in the grace (a majority released): %v, want nil", err)
	}
}

// Tiny and huge node timeouts, an already-cancelled ctx and a ctx without
// cancellation, node 2 stalled: Release returns nil, or (a node timeout
// too short for any node to answer) a QuorumError; never a panic or hang,
// and by the node timeout plus the overrun bound.
func TestRedTeam18_NodeTimeoutsAndContexts(t *testing.T) {
	c := startNodes(t, 3)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	ctxs := map[string]context.Context{
		"background":    context.Background(),
		"cancelled":     cancelled,
		"withoutCancel": context.WithoutCancel(cancelled),
	}
	for _, nt := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, time.Hour} {
		l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(nt))
		for name, ctx := range ctxs {
			key := dlocktest.Key(t)
			// Bounded: with a 1ms node timeout a loaded machine may fail
			// every attempt (Acquire would retry until its deadline).
			actx, acancel := context.WithTimeout(context.Background(), 3*time.Second)
			lk, err := l.Acquire(actx, key)
			acancel()
			if err != nil {
				t.Logf("node timeout %v: Acquire: %v (skipped)", nt, err)
				continue
			}
			link.Stall()
			start := time.Now()
			err = lk.Release(ctx)
			took := time.Since(start)
			var qe *redlock.QuorumError
			if err != nil && !errors.As(err, &qe) {
				t.Errorf("node timeout %v, ctx %s: Release = %v, want nil or a QuorumError", nt, name, err)
			}
			bound := min(nt, dlock.DefaultReleaseTimeout)
			if took > bound+dlocktest.OverrunBound {
				t.Errorf("node timeout %v, ctx %s: Release took %v", nt, name, took)
			}
			t.Logf("node timeout %v, ctx %s: Release = %v in %v", nt, name, err, took.Round(time.Millisecond))
			link.Heal()
		}
	}
}

// Five nodes, two stalled; then two nodes losing their release reply.
// Release is nil; the healthy nodes hold no remnant when it returns.
func TestRedTeam18_FiveNodesStalledAndLostReplies(t *testing.T) {
	c := startNodes(t, 5)
	l, link := c.lockerVia(t, []int{3, 4}, redlock.WithNodeTimeout(5*time.Second))
	for round := range 4 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, lk)
		healthy := []int{0, 1, 2}
		if round%2 == 0 {
			link.Stall()
		} else {
			link[0].LoseNextReply()
			link[1].LoseNextReply()
			healthy = []int{0, 1, 2, 3, 4}
		}
		start := time.Now()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Errorf("round %d: Release: %v", round, err)
		}
		took := time.Since(start)
		if r := rt18Remnants(t, c, key, lk.Owner(), healthy...); len(r) > 0 {
			t.Errorf("round %d: nodes %v hold the released lease when Release returned", round, r)
		}
		if took >= 5*time.Second {
			t.Errorf("round %d: Release took %v: the node timeout, not the grace", round, took)
		}
		t.Logf("round %d (stall=%v): Release in %v", round, round%2 == 0, took.Round(time.Millisecond))
		link.Heal()
	}
}

// Release called twice in a row and from several goroutines at once with
// a stalled node: every call returns nil.
func TestRedTeam18_ReleaseTwiceAndConcurrently(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(2*time.Second))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	heldOnAll(t, c, lk.Key(), lk)
	link.Stall()
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = lk.Release(dlocktest.Context(t))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Release %d: %v", i, err)
		}
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Errorf("Release again: %v", err)
	}
	if !errors.Is(lk.Err(), dlock.ErrReleased) {
		t.Errorf("Err() = %v, want ErrReleased", lk.Err())
	}
	link.Heal()
}

// Release racing a forced Break: Release returns nil or the loss
// (ErrLockLost), or with node 2 hung a QuorumError; the key ends free on
// every healthy node.
func TestRedTeam18_ReleaseRacesBreak(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(2*time.Second))
	b := c.locker(t)
	for round := range 10 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, lk.Key(), lk)
		if round%2 == 0 {
			link.Stall()
		}
		var wg sync.WaitGroup
		var rerr, berr error
		wg.Add(2)
		go func() { defer wg.Done(); rerr = lk.Release(dlocktest.Context(t)) }()
		go func() { defer wg.Done(); _, berr = dlock.Break(dlocktest.Context(t), b, key, "") }()
		wg.Wait()
		// With node 2 hung, a Break that got to one node first leaves
		// Release with one "released", one "lease gone" and one no
		// answer: neither a majority released nor a majority gone, so a
		// *QuorumError after the node timeout (observation, see report).
		var qe *redlock.QuorumError
		switch {
		case rerr == nil, errors.Is(rerr, dlock.ErrLockLost):
		case round%2 == 0 && errors.As(rerr, &qe):
			t.Logf("round %d: Release racing Break, node 2 hung: %v", round, rerr)
		default:
			t.Errorf("round %d: Release racing Break = %v, want nil, ErrLockLost or (node 2 hung) a QuorumError", round, rerr)
		}
		if berr != nil {
			t.Errorf("round %d: Break racing Release = %v", round, berr)
		}
		link.Heal()
		if r := rt18Remnants(t, c, key, lk.Owner(), 0, 1); len(r) > 0 {
			t.Errorf("round %d: nodes %v hold the lease after Release and Break", round, r)
		}
	}
}

// Release racing a waiter's hand-over, node 2 stalled for the releaser:
// the waiter gets the lock, and never while the releaser still holds it.
func TestRedTeam18_ReleaseHandsOverToWaiter(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(2*time.Second))
	w := c.locker(t, redlock.WithNodeTimeout(2*time.Second))
	for round := range 4 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, lk)
		got := make(chan error, 1)
		var wl *dlock.Lock
		var mu sync.Mutex
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			x, err := w.Acquire(ctx, key)
			mu.Lock()
			wl = x
			mu.Unlock()
			got <- err
		}()
		time.Sleep(100 * time.Millisecond) // the waiter queued
		link.Stall()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Errorf("round %d: Release: %v", round, err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("round %d: waiter: %v", round, err)
			}
		case <-time.After(dlocktest.HangTimeout):
			t.Fatalf("round %d: hang: waiter never got the lock", round)
		}
		link.Heal()
		mu.Lock()
		if wl != nil {
			// One holder: the waiter on a majority, the releaser's lease
			// on no healthy node.
			if r := rt18Remnants(t, c, key, wl.Owner(), 0, 1, 2); len(r) < 2 {
				t.Errorf("round %d: the waiter holds %v only", round, r)
			}
			if r := rt18Remnants(t, c, key, lk.Owner(), 0, 1); len(r) > 0 {
				t.Errorf("round %d: double holder: nodes %v keep the releaser's lease", round, r)
			}
			if err := wl.Release(dlocktest.Context(t)); err != nil {
				t.Errorf("round %d: waiter Release: %v", round, err)
			}
		}
		mu.Unlock()
	}
}

// Throughput: Releases with one hung node of three, node timeout 5s, each
// cost about the grace (>= 20ms), never the node timeout.
func TestRedTeam18_ReleaseThroughputHungNode(t *testing.T) {
	c := startNodes(t, 3)
	const nt = 5 * time.Second
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(nt))
	link.Stall() // hung from the start: acquisitions are won by nodes 0 and 1
	const n = 20
	var total, worst time.Duration
	for range n {
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Errorf("Release: %v", err)
		}
		took := time.Since(start)
		total += took
		worst = max(worst, took)
	}
	t.Logf("%d Releases with one hung node: mean %v, worst %v (node timeout %v)", n, (total / n).Round(time.Microsecond), worst.Round(time.Microsecond), nt)
	if worst >= nt {
		t.Errorf("a Release took %v: the node timeout, not the grace", worst)
	}
	link.Heal()
}

// Release with ctx deadlines from 5ms to 300ms, node 2 hung, links
// undelayed: each returns by its deadline, with nil or ErrUnavailable
// (whether a majority answered in time depends on the machine's load,
// so the outcome is logged; TestRelease_NilWhenDeadlinePassesInGrace
// makes the deadline pass after the majority and asserts nil).
func TestRedTeam18_DeadlineScan(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(5*time.Second))
	for _, dl := range []time.Duration{5, 10, 15, 20, 25, 30, 50, 100, 300} {
		dl *= time.Millisecond
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, lk.Key(), lk)
		link.Stall()
		ctx, cancel := context.WithTimeout(context.Background(), dl)
		start := time.Now()
		err = lk.Release(ctx)
		took := time.Since(start)
		cancel()
		t.Logf("deadline %v: Release = %v in %v", dl, err, took.Round(100*time.Microsecond))
		if err != nil && !errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("deadline %v: Release with one hung node = %v, want nil or ErrUnavailable", dl, err)
		}
		if took > dl+dlocktest.OverrunBound {
			t.Errorf("deadline %v: Release took %v", dl, took)
		}
		link.Heal()
	}
}

// A Set of 8 locks, node 2 hung, whose caller's context ends in the grace
// of the first lock it releases: Set.Release returns nil (a majority
// released every lock) and no healthy node keeps a lease. A hook ends the
// context inside the first grace, so no step depends on the machine's
// speed. Symptom: the lock whose grace straddled the caller's deadline
// came back ErrUnavailable.
func TestSetRelease_NilWhenContextEndsInGrace_NodeHung(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(5*time.Second))
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = dlocktest.Key(t)
	}
	s, err := dlock.AcquireAll(dlocktest.Context(t), l, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, lk := range s.Locks() {
		heldOnAll(t, c, lk.Key(), lk)
	}
	// The first release's grace (Settle, after its majority released)
	// ends the caller's context and waits for it; the later releases run
	// on contexts of their own and pass the hook at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	redlock.SetSettleHook(t, func(sctx context.Context) {
		cancel()
		select {
		case <-sctx.Done():
		case <-ctx.Done():
		}
	})
	link.Stall()
	start := time.Now()
	err = s.Release(ctx)
	t.Logf("Set.Release of %d locks, one hung node, context ended in the grace: %v in %v", len(keys), err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("Set.Release = %v, want nil: a majority released every lock", err)
	}
	if ctx.Err() == nil {
		t.Errorf("Set.Release returned without a grace: the hook never ran")
	}
	link.Heal()
	for _, k := range keys {
		if r := rt18Remnants(t, c, k, s.Lock(k).Owner(), 0, 1); len(r) > 0 {
			t.Errorf("key %s: nodes %v still hold it", k, r)
		}
	}
}

// The release a hung node did not answer in the grace is delivered after
// the key changed hands (node 2 stalled through the release and the next
// acquisition, then healed): the new lock stays held, and no node keeps
// the old lease.
func TestRedTeam18_StragglerReleaseAfterReacquire(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(2*time.Second))
	other := c.locker(t, redlock.WithNodeTimeout(2*time.Second))
	for round := range 3 {
		key := dlocktest.Key(t)
		old, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, old)
		link.Stall()
		if err := old.Release(dlocktest.Context(t)); err != nil {
			t.Errorf("round %d: Release: %v", round, err)
		}
		acq := l
		if round%2 == 1 {
			acq = other
		}
		nl, err := acq.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("round %d: re-acquire: %v", round, err)
		}
		link.Heal()
		deadline := time.Now().Add(dlocktest.HangTimeout)
		for len(rt18Remnants(t, c, key, old.Owner(), 0, 1, 2)) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if r := rt18Remnants(t, c, key, old.Owner(), 0, 1, 2); len(r) > 0 {
			t.Errorf("round %d: nodes %v keep the released lease", round, r)
		}
		if err := nl.Refresh(dlocktest.Context(t)); err != nil {
			t.Errorf("round %d: the new lock after the straggling release: %v", round, err)
		}
		if err := nl.Release(dlocktest.Context(t)); err != nil {
			t.Errorf("round %d: new lock Release: %v", round, err)
		}
	}
}
