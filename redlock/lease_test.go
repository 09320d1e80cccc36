package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

func TestReleaseCleansEveryNode(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if h := c.holders(t, key); strings.Count(strings.Join(h, ","), lk.Owner()) < 3 {
		t.Fatalf("held on fewer than a majority: %q", h)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Release returns after a majority; the rest follow promptly. Each
	// node keeps only the release marker "|<token>".
	marker := "|" + strconv.FormatUint(lk.Token(), 10)
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for h := c.holders(t, key); strings.Join(h, ",") != strings.Repeat(marker+",", len(h)-1)+marker; h = c.holders(t, key) {
		if time.Now().After(deadline) {
			t.Fatalf("leases left after release: %q, want %q on every node", h, marker)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Release waits, in its grace, for the acquisition's grants still in
// flight: a node whose phase-one grant lands after it answered the release
// holds no released lease when Release returns.
// Symptom: a forced Break right after Release removed the released lease from such a node.
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

// Symptom: a grant whose answer came after Acquire returned was released
// twice, by Release and again when its answer arrived: 12 scripts per
// acquire+release on five nodes instead of 10.
// A straggling grant that its node ran before the lock's Release there is
// not released again: node 2 runs one grant and one release.
func TestRelease_StragglingGrantRanBeforeRelease_ReleasedOnce(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t, redlock.WithNodeTimeout(5*time.Second))
	// Release waits for node 2's answers.
	redlock.SetEndlessGrace(t)
	// Load the scripts.
	warm, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	warm.Release(dlocktest.Context(t))
	gate := make(chan struct{})
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(release)
	// Node 2 runs its grant at once; its answer waits until Release has
	// released the majority and waits for the rest.
	redlock.SetGrantHook(t, l, 2, func() {}, func() { <-gate })
	redlock.SetSettleHook(t, func(context.Context) { release() })
	if err := c.admin[2].ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h := c.holders(t, key)[2]; strings.HasPrefix(h, lk.Owner()) {
		t.Fatalf("node 2 holds the released lease: %q", h)
	}
	stats, err := c.admin[2].Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	scripts := 0
	for _, line := range strings.Split(stats, "\n") {
		var calls int
		if _, err := fmt.Sscanf(strings.TrimPrefix(strings.TrimPrefix(line, "cmdstat_evalsha:"), "cmdstat_eval:"), "calls=%d,", &calls); err == nil &&
			(strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:")) {
			scripts += calls
		}
	}
	if scripts != 2 {
		t.Fatalf("node 2 ran %d scripts; want its grant and one release", scripts)
	}
}

// A node a little slower than the majority (here: every link delayed by
// d, the third node's by 3d, so its release lands after the majority
// released) answers within Release's grace, and holds no remnant of the
// lease when Release returns: a forced Break or a List right after it
// does not see the released lease there.
// Symptom: the conformance check "a forced break of a released key removes nothing" failed on a loaded machine.
func TestRelease_SlowerNodeFreeOnReturn(t *testing.T) {
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
// Symptom: a Release waiting for the slower nodes waits for a hung one past its context or the node timeout.
func TestRelease_NilByDeadlineOrNodeTimeout_NodeHung(t *testing.T) {
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

// The caller's deadline passes while Release waits, after a majority
// released, for a stalled node (the grace): Release returns nil, by the
// deadline.
// Symptom: the grace ran on the core's own context past the caller's deadline, and a lock a majority had released came back ErrUnavailable.
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
// released, for a stalled node (the grace): Release returns nil.
// Symptom: a cancel during the grace turned a lock a majority had released into ErrUnavailable.
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

// Three callers release one Lock concurrently, node 2 hung: one with a
// short deadline, one cancelled once the majority released, one on
// context.Background. Each returns nil (a majority released) and by its
// own bound.
func TestRelease_ConcurrentCallersBoundedByOwnContexts_NodeHung(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(time.Second))
	for round := range 3 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, lk)
		link.Stall()
		short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
		cctx, cancel := context.WithCancel(context.Background())
		// The cancelled caller is cancelled once it waits in the grace (a
		// majority released).
		inGrace := make(chan struct{}, 1)
		redlock.SetSettleHook(t, func(ctx context.Context) {
			if ctx == cctx {
				inGrace <- struct{}{}
			}
		})
		var wg sync.WaitGroup
		errs := make([]error, 3)
		took := make([]time.Duration, 3)
		start := time.Now()
		release := func(i int, ctx context.Context) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = lk.Release(ctx)
				took[i] = time.Since(start)
			}()
		}
		// The cancellable caller starts the release and reaches its
		// grace; the others join the release in flight, or find it done.
		release(1, cctx)
		select {
		case <-inGrace:
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: the cancellable caller never reached the grace")
		}
		release(0, short)
		release(2, context.Background())
		cancelAt := time.Since(start)
		cancel()
		wg.Wait()
		cancelShort()
		t.Logf("round %d: short %v, cancelled (at %v) %v, background %v", round, took[0], cancelAt, took[1], took[2])
		for i, name := range []string{"short deadline", "cancelled", "background"} {
			if errs[i] != nil {
				t.Errorf("round %d: %s caller: %v, want nil (a majority released)", round, name, errs[i])
			}
		}
		if took[0] > 2*time.Second+dlocktest.OverrunBound {
			t.Errorf("round %d: short-deadline caller took %v", round, took[0])
		}
		if took[1] > cancelAt+dlocktest.OverrunBound {
			t.Errorf("round %d: cancelled caller took %v, cancelled at %v", round, took[1], cancelAt)
		}
		if took[2] > time.Second+dlocktest.OverrunBound {
			t.Errorf("round %d: background caller took %v, node timeout 1s", round, took[2])
		}
		link.Heal()
	}
}

// A Release whose ctx is already cancelled (the core then uses its own
// DefaultReleaseTimeout context) with node 2 hung and a 5s node timeout:
// nil, within the grace, far below the node timeout; a second Release
// afterwards returns nil at once.
func TestRelease_PreCancelledContextReturnsWithinGrace_NodeHung(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(5*time.Second))
	for round := range 3 {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		heldOnAll(t, c, key, lk)
		link.Stall()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		err = lk.Release(ctx)
		took := time.Since(start)
		start = time.Now()
		err2 := lk.Release(context.Background())
		took2 := time.Since(start)
		t.Logf("round %d: pre-cancelled Release %v after %v; again %v after %v", round, err, took, err2, took2)
		if err != nil || err2 != nil {
			t.Errorf("round %d: Release = %v, again %v; want nil, nil", round, err, err2)
		}
		if took > 2*time.Second || took2 > dlocktest.OverrunBound {
			t.Errorf("round %d: Release took %v (node timeout 5s), again %v", round, took, took2)
		}
		link.Heal()
	}
}

// Release with ctx deadlines from 5ms to 300ms, node 2 hung, links
// undelayed: each returns by its deadline, with nil or ErrUnavailable
// (whether a majority answered in time depends on the machine's load,
// so the outcome is logged; TestRelease_NilWhenDeadlinePassesInGrace
// makes the deadline pass after the majority and asserts nil).
func TestRelease_ReturnsByDeadline_NodeHung(t *testing.T) {
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

// Tiny and huge node timeouts, an already-cancelled ctx and a ctx without
// cancellation, node 2 stalled: Release returns nil, or (a node timeout
// too short for any node to answer) a QuorumError; never a panic or hang,
// and by the node timeout plus the overrun bound.
func TestRelease_BoundedByNodeTimeoutWhateverTheContext_NodeStalled(t *testing.T) {
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

// Throughput: Releases with one hung node of three, node timeout 5s, each
// cost about the grace (>= 20ms), never the node timeout.
func TestRelease_CostsTheGraceNotTheNodeTimeout_NodeHung(t *testing.T) {
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

// Five nodes, two stalled; then two nodes losing their release reply.
// Release is nil; the healthy nodes hold no remnant when it returns.
func TestRelease_HealthyNodesFreeOnReturn_FiveNodes(t *testing.T) {
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
		if r := nodesHolding(t, c, key, lk.Owner(), healthy...); len(r) > 0 {
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
func TestRelease_RepeatedAndConcurrentCallsReturnNil_NodeStalled(t *testing.T) {
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

// A Redlock release takes effect on every node but every reply is lost
// (Release returns an error). The key then changes hands once. The caller
// retries Release ("after a network error the next call retries"); the
// promise is that a release whose reply was lost is reported released,
// never lost.
// Symptom: the retried Release reported the lock lost once the key had changed hands.
func TestRelease_RetryAfterLostRepliesSucceedsAfterHandover(t *testing.T) {
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

// A Release with every link stalled fails with an error wrapping
// dlock.ErrUnavailable, as (*dlock.Lock).Release promises when the server
// does not answer; after Heal the retry succeeds, its Settle uses the
// retry's state (no hang, no panic), and every node ends free of the
// lease.
// Symptom: a Release with every node silent failed with a bare *QuorumError that wrapped no dlock sentinel.
func TestRelease_UnavailableWhenAllSilentAndRetrySucceeds(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(300*time.Millisecond))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	link.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err = lk.Release(ctx)
	cancel()
	t.Logf("first Release, every link stalled: %v (ErrUnavailable %v, ErrNotHeld %v, DeadlineExceeded %v)", err, errors.Is(err, dlock.ErrUnavailable), errors.Is(err, dlock.ErrNotHeld), errors.Is(err, context.DeadlineExceeded))
	if err == nil {
		t.Fatal("Release with every link stalled: nil")
	}
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Release with every node silent: %v does not wrap dlock.ErrUnavailable", err)
	}
	link.Heal()
	start := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var last error
	for range 20 {
		if last = lk.Release(ctx); last == nil || errors.Is(last, dlock.ErrNotHeld) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("retry after Heal: %v after %v", last, time.Since(start))
	if last != nil {
		t.Errorf("retry after Heal: %v, want nil", last)
	}
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for len(nodesHolding(t, c, key, lk.Owner(), 0, 1, 2)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if r := nodesHolding(t, c, key, lk.Owner(), 0, 1, 2); len(r) > 0 {
		t.Errorf("lease still on nodes %v after the retry", r)
	}
}

// The lease deleted on a majority (c.admin[i].Del) before Release, node 2
// hung: Release reports ErrNotHeld, bounded; Settle does not run on it.
func TestRelease_NotHeldWhenGoneFromMajority_NodeHung(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(time.Second))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	heldOnAll(t, c, key, lk)
	for _, i := range []int{0, 1} {
		if err := c.admin[i].Del(context.Background(), lockKey(key)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	link.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	err = lk.Release(ctx)
	took := time.Since(start)
	t.Logf("Release of a lease deleted on a majority, node 2 hung: %v after %v", err, took)
	if !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release: %v, want ErrNotHeld", err)
	}
	if took > time.Second+dlocktest.OverrunBound {
		t.Errorf("Release took %v (node timeout 1s)", took)
	}
	link.Heal()
}

// A node's phase-one grant straggles (its link delayed 300ms) while the
// lock is acquired and committed on the other two; the caller releases at
// once with one of those two hung. The release reaches the straggler
// before its grant does, so that node answers "lease gone" (nothing of
// ours there yet); the grant then lands and the lease's finish removes
// it. Only node 0 proves the lock was still held when released, node 2 is
// silent: whether the lock was held on a majority up to the release is
// unknown, so Release fails after the node timeout, with an error
// wrapping dlock.ErrUnavailable. The key is free for others at once
// (nodes 0 and 1), and a retry succeeds. Counting "gone" on a node that
// did not grant as released would also report success for a lock lost
// before its release (5 nodes, granted on 3, expired on 2 of those).
// Symptom: the failed Release wrapped no dlock sentinel.
func TestRelease_UnavailableWhenItOvertakesAStragglingGrant(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{1, 2}, redlock.WithNodeTimeout(time.Second))
	for round := range 3 {
		key := dlocktest.Key(t)
		link[0].Delay(300 * time.Millisecond) // node 1
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		link[0].Heal()
		link[1].Stall() // node 2
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now()
		err = lk.Release(ctx)
		took := time.Since(start)
		cancel()
		time.Sleep(400 * time.Millisecond) // the straggling grant lands and is cleaned
		t.Logf("round %d: Release, node 1's grant straggling, node 2 hung: %v after %v; remnants %v", round, err, took, nodesHolding(t, c, key, lk.Owner(), 0, 1))
		if took > time.Second+dlocktest.OverrunBound {
			t.Errorf("round %d: Release took %v (node timeout 1s)", round, took)
		}
		if err != nil {
			var qe *redlock.QuorumError
			if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrNotHeld) || !errors.As(err, &qe) {
				t.Errorf("round %d: Release: %v, want nil or a QuorumError wrapping dlock.ErrUnavailable (not ErrNotHeld)", round, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			err2 := lk.Release(ctx)
			cancel()
			t.Logf("round %d: retry: %v", round, err2)
			if err2 != nil && !errors.Is(err2, dlock.ErrNotHeld) {
				t.Errorf("round %d: retry after the straggler was cleaned: %v", round, err2)
			}
		}
		if r := nodesHolding(t, c, key, lk.Owner(), 0, 1); len(r) > 0 {
			t.Errorf("round %d: lease left on %v", round, r)
		}
		link.Heal()
	}
}

// The release a hung node did not answer in the grace is delivered after
// the key changed hands (node 2 stalled through the release and the next
// acquisition, then healed): the new lock stays held, and no node keeps
// the old lease.
func TestRelease_LateReleaseSparesTheNextHolder(t *testing.T) {
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
		for len(nodesHolding(t, c, key, old.Owner(), 0, 1, 2)) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if r := nodesHolding(t, c, key, old.Owner(), 0, 1, 2); len(r) > 0 {
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

// Release racing a waiter's hand-over, node 2 stalled for the releaser:
// the waiter gets the lock, and never while the releaser still holds it.
func TestRelease_HandsOverToWaiterWithoutDoubleHolder_NodeStalled(t *testing.T) {
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
			if r := nodesHolding(t, c, key, wl.Owner(), 0, 1, 2); len(r) < 2 {
				t.Errorf("round %d: the waiter holds %v only", round, r)
			}
			if r := nodesHolding(t, c, key, lk.Owner(), 0, 1); len(r) > 0 {
				t.Errorf("round %d: double holder: nodes %v keep the releaser's lease", round, r)
			}
			if err := wl.Release(dlocktest.Context(t)); err != nil {
				t.Errorf("round %d: waiter Release: %v", round, err)
			}
		}
		mu.Unlock()
	}
}

// Release racing a forced Break: Release returns nil or the loss
// (ErrLockLost), or with node 2 hung a QuorumError; the key ends free on
// every healthy node.
func TestRelease_RacingBreakFreesHealthyNodes(t *testing.T) {
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
		// *QuorumError after the node timeout.
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
		if r := nodesHolding(t, c, key, lk.Owner(), 0, 1); len(r) > 0 {
			t.Errorf("round %d: nodes %v hold the lease after Release and Break", round, r)
		}
	}
}

// A Set of 8 locks, node 2 hung, whose caller's context ends in the grace
// of the first lock it releases: Set.Release returns nil (a majority
// released every lock) and no healthy node keeps a lease. A hook ends the
// context inside the first grace, so no step depends on the machine's
// speed.
// Symptom: the lock whose grace straddled the caller's deadline came back ErrUnavailable.
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
		if r := nodesHolding(t, c, k, s.Lock(k).Owner(), 0, 1); len(r) > 0 {
			t.Errorf("key %s: nodes %v still hold it", k, r)
		}
	}
}

// Set.Release and RunOnce with a hung node: nil, bounded.
func TestSetReleaseAndRunOnce_Bounded_NodeHung(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(time.Second))
	keys := []string{dlocktest.Key(t) + "a", dlocktest.Key(t) + "b", dlocktest.Key(t) + "c"}
	s, err := dlock.AcquireAll(dlocktest.Context(t), l, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, lk := range s.Locks() {
		heldOnAll(t, c, lk.Key(), lk)
	}
	link.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	start := time.Now()
	err = s.Release(ctx)
	took := time.Since(start)
	cancel()
	t.Logf("Set.Release of 3, node 2 hung: %v after %v", err, took)
	if err != nil {
		t.Errorf("Set.Release: %v, want nil", err)
	}
	if took > 500*time.Millisecond+dlocktest.OverrunBound {
		t.Errorf("Set.Release took %v", took)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start = time.Now()
	ran, err := dlock.RunOnce(ctx, l, dlocktest.Key(t)+"job", 2*time.Second, 0, func(ctx context.Context) error { return nil })
	t.Logf("RunOnce, node 2 hung: ran %v, %v after %v", ran, err, time.Since(start))
	if !ran || err != nil {
		t.Errorf("RunOnce: ran %v, %v; want true, nil", ran, err)
	}
	link.Heal()
}

func TestLostWhenMajorityLosesLease(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	key := dlocktest.Key(t)
	// A TTL that a loaded machine's renewals keep up with (a 300ms lease
	// can be lost by its local deadline when the test process is starved):
	// the sleep outlives one TTL, so the lock is held by renewals alone.
	const ttl = 2 * time.Second
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} { // a minority: still held
		c.admin[i].Del(context.Background(), lockKey(key))
	}
	time.Sleep(ttl + ttl/4)
	if lk.Err() != nil {
		t.Fatalf("lost after a minority dropped it: %v", lk.Err())
	}
	c.admin[2].Del(context.Background(), lockKey(key))
	c.admin[3].Del(context.Background(), lockKey(key))
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Lost() not closed after a majority dropped the lease")
	}
	if !errors.Is(lk.Err(), dlock.ErrLockLost) || !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Fatalf("Err() = %v", lk.Err())
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
