package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// Red team 17: the split-vote judgement (countRefusals, undecided,
// splitVote, settle) and HELD-FOR on redlock.

// rt17Plant sets key's lease on the nodes listed, value per node.
func rt17Plant(t *testing.T, c *cluster, key string, vals map[int]string) {
	t.Helper()
	for i, v := range vals {
		if err := c.admin[i].Set(context.Background(), lockKey(key), v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func rt17Reservation(waiter string) string {
	return fmt.Sprintf("|7|%s|%d", waiter, time.Now().Add(time.Minute).UnixMilli())
}

// rt17Stale is a reservation whose "until" has passed.
func rt17Stale(waiter string) string {
	return fmt.Sprintf("|7|%s|%d", waiter, time.Now().Add(-time.Second).UnixMilli())
}

// rt17Verdict is "held" (NotAcquiredError, ErrNotAcquired, not
// ErrTransient), "split" (ErrTransient, not ErrNotAcquired, saying split
// vote), or what else err is.
func rt17Verdict(err error) string {
	var na *dlock.NotAcquiredError
	switch {
	case err == nil:
		return "acquired"
	case errors.As(err, &na) && errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, dlock.ErrTransient):
		return "held"
	case errors.Is(err, dlock.ErrTransient) && !errors.Is(err, dlock.ErrNotAcquired) && strings.Contains(err.Error(), "split vote"):
		return "split"
	}
	return "other: " + err.Error()
}

// TestRedTeam17_SplitVoteMatrix: refusals planted on 3 and 5 nodes; the
// verdict is "held" exactly when one owner (or one reserved waiter) is on
// a majority, else a split vote.
func TestRedTeam17_SplitVoteMatrix(t *testing.T) {
	c3, c5 := startNodes(t, 3), startNodes(t, 5)
	l3, l5 := c3.locker(t), c5.locker(t)
	w := rt17Reservation
	cases := []struct {
		name string
		five bool
		vals map[int]string
		want string
	}{
		// Three nodes, quorum 2.
		{"3/two contenders", false, map[int]string{0: "a|0|{}", 1: "b|0|{}"}, "split"},
		{"3/contender on a majority", false, map[int]string{0: "a|0|{}", 1: "a|0|{}"}, "held"},
		{"3/committed on a majority", false, map[int]string{0: "a|42|{}", 1: "a|42|{}"}, "held"},
		{"3/same owner committed and in phase one", false, map[int]string{0: "a|42|{}", 1: "a|0|{}"}, "held"},
		{"3/committed minority beside contender", false, map[int]string{0: "a|42|{}", 1: "b|0|{}"}, "split"},
		{"3/reservation on a majority", false, map[int]string{0: w("wx"), 1: w("wx")}, "held"},
		{"3/reservation minority beside contender", false, map[int]string{0: w("wx"), 1: "b|0|{}"}, "split"},
		{"3/two waiters' reservations", false, map[int]string{0: w("wx"), 1: w("wy")}, "split"},
		{"3/all three different", false, map[int]string{0: "a|42|{}", 1: "b|0|{}", 2: w("wx")}, "split"},
		// A waiter id that looks like an owner id is still another identity.
		{"3/owner and waiter of the same name", false, map[int]string{0: "a|0|{}", 1: w("a")}, "split"},
		// A reservation past its "until" is no one's: the key is free.
		{"3/stale reservations", false, map[int]string{0: rt17Stale("wx"), 1: rt17Stale("wx")}, "acquired"},
		{"5/stale reservations beside a contender", true, map[int]string{0: rt17Stale("wx"), 1: rt17Stale("wx"), 2: "b|0|{}"}, "acquired"},
		// Five nodes, quorum 3.
		{"5/three contenders", true, map[int]string{0: "a|0|{}", 1: "b|0|{}", 2: "c|0|{}"}, "split"},
		{"5/two and two", true, map[int]string{0: "a|0|{}", 1: "a|0|{}", 2: "b|0|{}", 3: "b|0|{}"}, "split"},
		{"5/two, two and one", true, map[int]string{0: "a|0|{}", 1: "a|0|{}", 2: "b|42|{}", 3: "b|42|{}", 4: "c|0|{}"}, "split"},
		{"5/three of one", true, map[int]string{0: "a|42|{}", 1: "a|0|{}", 2: "a|42|{}", 3: "b|0|{}"}, "held"},
		{"5/committed on a majority", true, map[int]string{0: "a|42|{}", 1: "a|42|{}", 2: "a|42|{}"}, "held"},
		{"5/reservation on a majority", true, map[int]string{0: w("wx"), 1: w("wx"), 2: w("wx"), 3: "b|0|{}"}, "held"},
		{"5/reservation on two, contenders", true, map[int]string{0: w("wx"), 1: w("wx"), 2: "b|0|{}", 3: "c|42|{}"}, "split"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, l := c3, l3
			if tc.five {
				c, l = c5, l5
			}
			key := dlocktest.Key(t)
			rt17Plant(t, c, key, tc.vals)
			lk, err := l.TryAcquire(dlocktest.Context(t), key)
			if lk != nil {
				_ = lk.Release(dlocktest.Context(t))
			}
			if got := rt17Verdict(err); got != tc.want {
				t.Fatalf("TryAcquire: %s (%v), want %s", got, err, tc.want)
			}
			if tc.want == "acquired" {
				return
			}
			// Nothing of this attempt is left on any node once its
			// background release is done (bounded poll).
			var left []string
			for try := 0; try < 100; try++ {
				left = nil
				for i, v := range c.holders(t, key) {
					if v != tc.vals[i] {
						left = append(left, fmt.Sprintf("node %d: %q, want %q", i, v, tc.vals[i]))
					}
				}
				if left == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if left != nil {
				t.Errorf("the attempt's grants stay after 5s: %v", left)
			}
		})
	}
}

// TestRedTeam17_SplitVoteStalledNode: refusals mixed so that the stalled
// node decides the verdict (one owner on quorum−1 nodes): TryAcquire waits
// no longer than its ctx (nor the node timeout) and then reports the
// owner as a possible holder, never a split vote.
func TestRedTeam17_SplitVoteStalledNode(t *testing.T) {
	for _, tc := range []struct {
		n     int
		vals  map[int]string
		stall []int
	}{
		{3, map[int]string{0: "a|42|{}"}, []int{2}},
		{5, map[int]string{0: "a|42|{}", 1: "a|0|{}", 2: "b|0|{}"}, []int{4}},
		{5, map[int]string{0: "a|42|{}", 1: "b|0|{}"}, []int{3, 4}},
		{5, map[int]string{0: w17("wx"), 1: w17("wx"), 2: "b|0|{}"}, []int{3}},
	} {
		t.Run(fmt.Sprintf("%d nodes, %d stalled", tc.n, len(tc.stall)), func(t *testing.T) {
			c := startNodes(t, tc.n)
			// A long node timeout: ctx must end the attempt.
			l, link := c.lockerVia(t, tc.stall, redlock.WithNodeTimeout(20*time.Second))
			t.Cleanup(link.Heal)
			key := dlocktest.Key(t)
			rt17Plant(t, c, key, tc.vals)
			link.Stall()
			const budget = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			deadline, _ := ctx.Deadline()
			done := make(chan error, 1)
			go func() {
				lk, err := l.TryAcquire(ctx, key)
				if lk != nil {
					_ = lk.Release(context.Background())
				}
				done <- err
			}()
			select {
			case err := <-done:
				if over := time.Since(deadline); over > dlocktest.OverrunBound {
					t.Errorf("TryAcquire returned %v past its deadline (bound %v)", over, dlocktest.OverrunBound)
				}
				if errors.Is(err, dlock.ErrTransient) && strings.Contains(err.Error(), "split vote") {
					t.Errorf("TryAcquire: %v: a split vote although the silent nodes may hold the owner's majority", err)
				}
				if err == nil {
					t.Errorf("TryAcquire acquired a key whose majority is held or silent")
				}
				t.Logf("TryAcquire: %v", err)
			case <-time.After(dlocktest.HangTimeout):
				t.Fatal("hang: TryAcquire waited for a stalled node past its context")
			}
		})
	}
}

func w17(waiter string) string { return rt17Reservation(waiter) }

// TestRedTeam17_SplitVoteStalledNodeNoCtx: with no deadline on ctx, a
// stalled node that decides the verdict is waited for no longer than the
// node timeout.
func TestRedTeam17_SplitVoteStalledNodeNoCtx(t *testing.T) {
	c := startNodes(t, 5)
	const nodeTimeout = 300 * time.Millisecond
	l, link := c.lockerVia(t, []int{4}, redlock.WithNodeTimeout(nodeTimeout))
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	rt17Plant(t, c, key, map[int]string{0: "a|42|{}", 1: "a|42|{}", 2: "b|0|{}"})
	link.Stall()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := l.TryAcquire(context.Background(), key)
		done <- err
	}()
	select {
	case err := <-done:
		if over := time.Since(start) - nodeTimeout; over > dlocktest.OverrunBound {
			t.Errorf("TryAcquire took %v past the node timeout", over)
		}
		if got := rt17Verdict(err); got != "held" {
			t.Errorf("TryAcquire: %s (%v), want held: the silent node may be a's third", got, err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: TryAcquire waited for a stalled node past the node timeout")
	}
}

// TestRedTeam17_NoSharedModes: redlock offers neither shared nor limited
// locks; asking is ErrUnsupported, before any node is asked, even where
// a split vote or a holder would be seen.
func TestRedTeam17_NoSharedModes(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	rt17Plant(t, c, key, map[int]string{0: "a|0|{}", 1: "b|0|{}"})
	for name, opt := range map[string]dlock.Option{"shared": dlock.WithShared(), "limit 3": dlock.WithLimit(3)} {
		for _, wait := range []bool{false, true} {
			var err error
			if wait {
				_, err = l.Acquire(dlocktest.Context(t), key, opt, dlock.WithWait(time.Second))
			} else {
				_, err = l.TryAcquire(dlocktest.Context(t), key, opt)
			}
			if !errors.Is(err, dlock.ErrUnsupported) || errors.Is(err, dlock.ErrTransient) || errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("%s (wait %v): %v, want ErrUnsupported alone", name, wait, err)
			}
		}
	}
}

// TestRedTeam17_RunOnceFiveNodes: 4 to 6 replicas over 5 nodes fire
// RunOnce at once on a fresh key: exactly one runs each round.
func TestRedTeam17_RunOnceFiveNodes(t *testing.T) {
	c := startNodes(t, 5)
	rounds := map[int]int{4: 6, 5: 7, 6: 7} // 20 rounds in all
	for _, replicas := range []int{4, 5, 6} {
		runOnceRounds(t, c, replicas, rounds[replicas])
	}
}

// TestRedTeam17_AcquireWaitsForMajorityHolder: a blocking Acquire against
// a holder on a majority waits (it is not told "split vote" and does not
// spin), and wins once the holder releases.
func TestRedTeam17_AcquireWaitsForMajorityHolder(t *testing.T) {
	c := startNodes(t, 5)
	holder, waiter := c.locker(t), c.locker(t)
	key := dlocktest.Key(t)
	first, err := holder.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int32
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventAttempt {
			attempts.Add(1)
		}
	})
	got := make(chan error, 1)
	var lk *dlock.Lock
	go func() {
		var err error
		lk, err = waiter.Acquire(dlocktest.Context(t), key, dlock.WithWait(20*time.Second), dlock.WithCallObserver(obs))
		got <- err
	}()
	const hold = 2 * time.Second
	select {
	case err := <-got:
		t.Fatalf("Acquire returned while the key was held: %v", err)
	case <-time.After(hold):
	}
	if err := first.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Acquire after the release: %v", err)
		}
		defer lk.Release(dlocktest.Context(t))
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Acquire did not wake on the release")
	}
	// A busy spin makes thousands of attempts in 2s; the default backoff
	// with release notifications makes a few dozen at most.
	if n := attempts.Load(); n > 200 {
		t.Errorf("%d attempts while the key was held for %v: a busy spin", n, hold)
	}
	t.Logf("%d attempts", attempts.Load())
}

// TestRedTeam17_HeldForList: redlock's List derives HeldFor from the
// winning attempt's MetaAcquired: ≥ 0, at most the time since the call,
// not counting a wait; concurrent acquire/list (run with -race).
func TestRedTeam17_HeldForList(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	ctx := dlocktest.Context(t)
	heldFor := func(key string) time.Duration {
		t.Helper()
		infos, err := l.List(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.Key == key && len(in.Holders) == 1 {
				return in.Holders[0].HeldFor
			}
		}
		t.Fatalf("List(%q) = %+v: want one holder", key, infos)
		return 0
	}
	key := dlocktest.Key(t)
	before := time.Now()
	lk, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if h, most := heldFor(key), time.Since(before)+time.Millisecond; h < 0 || h > most {
		t.Errorf("HeldFor %v, want in [0, %v]", h, most)
	}
	// A waiter: its wait is not counted.
	const hold = time.Second
	called := time.Now()
	got := make(chan *dlock.Lock, 1)
	go func() {
		lk2, err := c.locker(t).Acquire(ctx, key, dlock.WithWait(20*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- lk2
	}()
	time.Sleep(hold)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if lk2 := <-got; lk2 != nil {
		if h := heldFor(key); h < 0 || h > time.Since(called)-hold/2 {
			t.Errorf("HeldFor %v after a wait of %v: the wait is counted", h, hold)
		}
		_ = lk2.Release(ctx)
	}
	// User "acquired" values never make HeldFor negative.
	for i, v := range []string{"junk", "-1", "99999999999999999999", fmt.Sprint(time.Now().Add(time.Hour).UnixMilli())} {
		k := fmt.Sprintf("%s.%d", key, i)
		lk, err := l.TryAcquire(ctx, k, dlock.WithMetadata(dlock.MetaAcquired, v))
		if err != nil {
			t.Fatal(err)
		}
		if h := heldFor(k); h < 0 {
			t.Errorf("acquired=%q: HeldFor %v", v, h)
		}
		_ = lk.Release(ctx)
	}
	// Race: acquire, list, release from many goroutines.
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := c.locker(t)
			for i := 0; i < 5; i++ {
				k := fmt.Sprintf("%s.race.%d", key, i%2)
				lk, err := l.Acquire(ctx, k, dlock.WithWait(20*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				infos, err := l.List(ctx, key+".race.")
				if err != nil {
					t.Error(err)
				}
				for _, in := range infos {
					for _, h := range in.Holders {
						if h.HeldFor < 0 || h.HeldFor > time.Since(start)+time.Millisecond {
							t.Errorf("%s: HeldFor %v out of [0, %v]", in.Key, h.HeldFor, time.Since(start))
						}
					}
				}
				_ = lk.Release(ctx)
			}
		}()
	}
	wg.Wait()
}

// TestRedTeam17_DecidedSplitVoteDoesNotWait: when the answers in already
// rule out a majority for anyone (three owners on three of five nodes),
// TryAcquire reports the split vote without waiting for a stalled node
// (its node timeout is long, ctx has no deadline).
func TestRedTeam17_DecidedSplitVoteDoesNotWait(t *testing.T) {
	c := startNodes(t, 5)
	const nodeTimeout = 20 * time.Second
	l, link := c.lockerVia(t, []int{4}, redlock.WithNodeTimeout(nodeTimeout))
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	rt17Plant(t, c, key, map[int]string{0: "a|0|{}", 1: "b|42|{}", 2: w17("wx")})
	link.Stall()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := l.TryAcquire(context.Background(), key)
		done <- err
	}()
	select {
	case err := <-done:
		if got := rt17Verdict(err); got != "split" {
			t.Errorf("TryAcquire: %s (%v), want a split vote", got, err)
		}
		if took := time.Since(start); took > nodeTimeout/2 {
			t.Errorf("TryAcquire took %v: it waited for a node that could not change the verdict", took)
		}
	case <-time.After(nodeTimeout / 2):
		t.Fatal("TryAcquire waited for a stalled node that could not change the verdict")
	}
}

// TestRedTeam17_WaitEndsOnSplitVote: a blocking Acquire whose wait ends
// while every attempt met a split vote (leftover minorities of crashed
// contenders, or of a holder whose release reached only some nodes, live
// out their TTL) must end as dlock.Locker promises: "Waiting ends with an
// error wrapping ErrNotAcquired (and the context's error)". It ends with
// ErrTransient and the deadline instead (engine: waiter.ended joins the
// last transient error), so callers that test ErrNotAcquired for "timed
// out waiting" (dlock run --wait's exit status) see an unexpected error.
// Before 4e85a89 a committed minority beside a contender read as a holder
// and the wait ended with ErrNotAcquired.
func TestRedTeam17_WaitEndsOnSplitVote(t *testing.T) {
	// A wait that ends against a lasting split vote observed no holder:
	// per dlock's error rules (ErrNotAcquired means a holder was seen) it
	// ends with the last attempt's ErrTransient joined with the deadline,
	// never ErrNotAcquired, and it does not spin meanwhile. (The red team
	// read Locker.Acquire's doc as promising ErrNotAcquired; the doc now
	// says which.)
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	rt17Plant(t, c, key, map[int]string{0: "a|0|{}", 1: "b|42|{}"})
	var attempts atomic.Int32
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventAttempt {
			attempts.Add(1)
		}
	})
	_, err := l.Acquire(dlocktest.Context(t), key, dlock.WithWait(time.Second), dlock.WithCallObserver(obs))
	if !errors.Is(err, dlock.ErrTransient) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("Acquire's wait ended with %v, want ErrTransient (a split vote) and the deadline, not ErrNotAcquired", err)
	}
	if n := attempts.Load(); n > 100 {
		t.Errorf("%d attempts in 1s: a spin", n)
	}
}
