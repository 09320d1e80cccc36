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

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redislock/redisproto"
	"github.com/dlock-go/dlock/redlock"
)

// plantLeases sets key's lease on the nodes listed, value per node.
func plantLeases(t *testing.T, c *cluster, key string, vals map[int]string) {
	t.Helper()
	for i, v := range vals {
		if err := c.admin[i].Set(context.Background(), lockKey(key), v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// reservationFor is a reservation for waiter that lasts a minute more.
func reservationFor(waiter string) string {
	return fmt.Sprintf("|7|%s|%d", waiter, time.Now().Add(time.Minute).UnixMilli())
}

// staleReservationFor is a reservation whose "until" has passed.
func staleReservationFor(waiter string) string {
	return fmt.Sprintf("|7|%s|%d", waiter, time.Now().Add(-time.Second).UnixMilli())
}

// acquireVerdict is "held" (NotAcquiredError, ErrNotAcquired, not
// ErrTransient), "split" (ErrTransient, not ErrNotAcquired, saying split
// vote), or what else err is.
func acquireVerdict(err error) string {
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

func TestMinorityAndMajorityHeld(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	other := `0123456789abcdef0123456789abcdef|7|{"host":"elsewhere","pid":"99"}`
	for _, i := range []int{1, 4} {
		c.admin[i].Set(ctx, lockKey(key), other, time.Minute)
	}
	lk, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("minority held by another owner: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The other owner's minority leases are untouched by our release.
	if h := c.holders(t, key); h[1] != other || h[4] != other {
		t.Fatalf("release touched another owner's leases: %q", h)
	}
	c.admin[2].Set(ctx, lockKey(key), other, time.Minute)
	_, err = l.TryAcquire(ctx, key)
	var na *dlock.NotAcquiredError
	var qe *redlock.QuorumError
	if !errors.As(err, &na) || !errors.As(err, &qe) {
		t.Fatalf("majority held: %v", err)
	}
	if len(na.Holders) != 1 || na.Holders[0].Owner != "0123456789abcdef0123456789abcdef" || na.Holders[0].Metadata["host"] != "elsewhere" {
		t.Fatalf("holders = %+v, want the one owner holding the majority", na.Holders)
	}
	if !strings.Contains(err.Error(), "held by owner 0123456789ab (host=elsewhere pid=99)") {
		t.Fatalf("message: %v", err)
	}
	// The failed attempt left nothing behind (cleanup runs in the
	// background; wait for it, bounded).
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for {
		h := c.holders(t, key)
		if h[0] == "" && h[3] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("failed attempt left leases: %q", h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Two other owners hold the key on different nodes, one of them on a
// majority: the NotAcquiredError lists both, the one seen on most nodes
// first, each with its own lease left; the per-node report is its Cause.
// (Owners on minorities alone are a split vote: TestTryAcquire_SplitVoteIsTransient.)
func TestNotAcquiredListsHoldersAcrossNodes(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	const (
		ownerA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		ownerB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	)
	held := map[int]struct {
		value string
		ttl   time.Duration
	}{
		0: {ownerA + `|5|{"host":"a","pid":"1"}`, time.Minute},
		1: {ownerB + `|7|{"host":"b","pid":"2"}`, time.Minute},
		2: {ownerB + `|7|{"host":"b","pid":"2"}`, 30 * time.Second},
		3: {ownerB + `|7|{"host":"b","pid":"2"}`, time.Minute},
	}
	for i, h := range held {
		if err := c.admin[i].Set(ctx, lockKey(key), h.value, h.ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Phase one stops once B's majority decides the verdict, so node 0 may
	// still be unheard ("no answer yet"): A is listed exactly when its node
	// answered. (One attempt: a refused attempt's own grant on node 4 is
	// released in the background, so a second one could list it.)
	_, err := l.TryAcquire(ctx, key)
	t.Logf("TryAcquire: %v", err)
	var na *dlock.NotAcquiredError
	var qe *redlock.QuorumError
	if !errors.As(err, &na) || !errors.As(na.Cause, &qe) {
		t.Fatalf("TryAcquire with 4 of 5 nodes held: %v, want a NotAcquiredError caused by a QuorumError", err)
	}
	sawA := false
	for _, r := range qe.Results {
		if r.Outcome == redlock.OutcomeHeld && r.Holder == ownerA {
			sawA = true
		}
	}
	want := 1
	if sawA {
		want = 2
	}
	if len(na.Holders) != want {
		t.Fatalf("holders = %+v, want %d (owner A's node answered: %v)", na.Holders, want, sawA)
	}
	b := na.Holders[0]
	if b.Owner != ownerB || b.Token != 7 || b.Metadata["host"] != "b" || b.Mode != dlock.Exclusive {
		t.Fatalf("first holder = %+v, want %s (seen on three nodes) with token 7", b, ownerB)
	}
	if b.TTL <= 0 || b.TTL > 30*time.Second {
		t.Fatalf("B's TTL %v, want the shortest lease left across its nodes (≤30s)", b.TTL)
	}
	if !sawA {
		return
	}
	a := na.Holders[1]
	if a.Owner != ownerA || a.Token != 5 || a.Metadata["host"] != "a" {
		t.Fatalf("second holder = %+v, want %s with token 5", a, ownerA)
	}
	if a.TTL <= 30*time.Second || a.TTL > time.Minute {
		t.Fatalf("A's TTL %v, want its lease left (30s, 1m]", a.TTL)
	}
	if msg := err.Error(); !strings.Contains(msg, "and 1 more") || !strings.Contains(msg, "held by owner aaaaaaaaaaaa") {
		t.Fatalf("message does not name both holders: %v", err)
	}
}

// A key that a release reserved for the waiter it woke (every node holds
// the reservation marker |0|<wait id>|<until ms>): a TryAcquire by
// someone else is refused and names the reservation: no holder, the
// waiter's id in the metadata, the reservation left as TTL. The markers
// are written on the nodes directly, with a reservation long enough that
// the attempt always comes within it (a release's lasts 100ms, which a
// starved test process can miss).
// Symptom: a key reserved for a woken waiter was reported as held by an unknown holder.
func TestTryAcquire_NamesReservation(t *testing.T) {
	c := startNodes(t, 3)
	other := c.locker(t)
	key := dlocktest.Key(t)
	const id, left = "1700000000000000-0a1b2c3d", time.Minute
	for i, a := range c.admin {
		now, err := a.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		marker := fmt.Sprintf("|0|%s|%d", id, now.Add(left).UnixMilli())
		if err := a.Set(context.Background(), lockKey(key), marker, left).Err(); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	_, err := other.TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire of a reserved key = %v, want a *dlock.NotAcquiredError", err)
	}
	if len(na.Holders) == 0 || na.Holders[0].Owner != "" || na.Holders[0].Metadata[redlock.MetaReservedForWaiter] != id {
		t.Fatalf("TryAcquire of a key reserved for waiter %s: holders %+v", id, na.Holders)
	}
	if ttl := na.Holders[0].TTL; ttl <= 0 || ttl > left {
		t.Fatalf("TTL %v, want the reservation left, within (0, %v]", ttl, left)
	}
	if msg := err.Error(); !strings.Contains(msg, "reserved for waiter "+id) {
		t.Fatalf("message %q does not name the reservation", msg)
	}
}

// A split vote (every refusing node holds another attempt's uncommitted
// phase-one grant, none a majority) means nobody holds the key: the attempt
// fails with ErrTransient, so TryAcquire's callers (RunOnce) try again
// instead of skipping a key nobody holds.
// Symptom: RunOnce's four replicas all skipped a period nobody ran.
func TestTryAcquire_SplitVoteIsTransient(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	ctx := dlocktest.Context(t)

	key := dlocktest.Key(t)
	// Two other attempts, each granted on one node, neither committed.
	for i, owner := range []string{"contender-a", "contender-b"} {
		if err := c.admin[i].Set(ctx, lockKey(key), owner+"|0|{}", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := l.TryAcquire(ctx, key)
	if !errors.Is(err, dlock.ErrTransient) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire against a split vote: %v, want ErrTransient and not ErrNotAcquired", err)
	}
	if !strings.Contains(err.Error(), "split vote") {
		t.Errorf("error does not say split vote: %v", err)
	}

	// A committed holder on a majority is a real holder.
	key2 := dlocktest.Key(t)
	for i := range 2 {
		if err := c.admin[i].Set(ctx, lockKey(key2), "holder|42|{}", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.TryAcquire(ctx, key2); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire against a committed holder on a majority: %v, want ErrNotAcquired", err)
	}

	// So is a contender whose phase one reached a majority: it will commit.
	key3 := dlocktest.Key(t)
	for i := range 2 {
		if err := c.admin[i].Set(ctx, lockKey(key3), "contender|0|{}", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.TryAcquire(ctx, key3); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire against a contender granted on a majority: %v, want ErrNotAcquired", err)
	}
}

// A committed holder on a minority, beside other contenders' minorities,
// holds nothing (its Release returned once a majority released, its lease
// still on the last node): the attempt is a split vote (ErrTransient,
// which RunOnce retries), not a holder.
// Symptom: RunOnce's replicas all saw "held" on a releasing holder's last node and skipped a period nobody ran.
func TestTryAcquire_HolderMinorityBesideContenderIsSplitVote(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	if err := c.admin[0].Set(ctx, lockKey(key), "holder|42|{}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.admin[1].Set(ctx, lockKey(key), "contender|0|{}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := l.TryAcquire(ctx, key)
	if !errors.Is(err, dlock.ErrTransient) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire: %v, want a split vote (ErrTransient, not ErrNotAcquired)", err)
	}
	// Likewise a reservation for a woken waiter on a minority: the waiter
	// won elsewhere (or lost), and a reservation outlives its waiter's
	// release by up to its 100ms. It arises beside two contenders when a
	// waiter queued on a node its grant reached before the previous
	// holder's release.
	keyW := dlocktest.Key(t)
	until := time.Now().Add(time.Minute).UnixMilli()
	if err := c.admin[0].Set(ctx, lockKey(keyW), fmt.Sprintf("|7|waiter-x|%d", until), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.admin[1].Set(ctx, lockKey(keyW), "contender|0|{}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, keyW); !errors.Is(err, dlock.ErrTransient) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire beside a minority reservation: %v, want a split vote", err)
	}

	// The holder's release reaches the last node and the contender gives
	// up: the repeated attempt wins.
	for i := range 2 {
		if err := c.admin[i].Del(ctx, lockKey(key)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	lk, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("the repeated attempt: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTryAcquire_HeldExactlyWhenOneOwnerIsOnAMajority: refusals planted on 3 and 5 nodes; the
// verdict is "held" exactly when one owner (or one reserved waiter) is on
// a majority, else a split vote.
func TestTryAcquire_HeldExactlyWhenOneOwnerIsOnAMajority(t *testing.T) {
	c3, c5 := startNodes(t, 3), startNodes(t, 5)
	l3, l5 := c3.locker(t), c5.locker(t)
	w := reservationFor
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
		{"3/stale reservations", false, map[int]string{0: staleReservationFor("wx"), 1: staleReservationFor("wx")}, "acquired"},
		{"5/stale reservations beside a contender", true, map[int]string{0: staleReservationFor("wx"), 1: staleReservationFor("wx"), 2: "b|0|{}"}, "acquired"},
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
			plantLeases(t, c, key, tc.vals)
			lk, err := l.TryAcquire(dlocktest.Context(t), key)
			if lk != nil {
				_ = lk.Release(dlocktest.Context(t))
			}
			if got := acquireVerdict(err); got != tc.want {
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

// TestTryAcquire_NoSplitVoteWhileStalledNodesMayCompleteAMajority: refusals mixed so that the stalled
// node decides the verdict (one owner on quorum−1 nodes): TryAcquire waits
// no longer than its ctx (nor the node timeout) and then reports the
// owner as a possible holder, never a split vote.
func TestTryAcquire_NoSplitVoteWhileStalledNodesMayCompleteAMajority(t *testing.T) {
	for _, tc := range []struct {
		n     int
		vals  map[int]string
		stall []int
	}{
		{3, map[int]string{0: "a|42|{}"}, []int{2}},
		{5, map[int]string{0: "a|42|{}", 1: "a|0|{}", 2: "b|0|{}"}, []int{4}},
		{5, map[int]string{0: "a|42|{}", 1: "b|0|{}"}, []int{3, 4}},
		{5, map[int]string{0: reservationFor("wx"), 1: reservationFor("wx"), 2: "b|0|{}"}, []int{3}},
	} {
		t.Run(fmt.Sprintf("%d nodes, %d stalled", tc.n, len(tc.stall)), func(t *testing.T) {
			c := startNodes(t, tc.n)
			// A long node timeout: ctx must end the attempt.
			l, link := c.lockerVia(t, tc.stall, redlock.WithNodeTimeout(20*time.Second))
			t.Cleanup(link.Heal)
			key := dlocktest.Key(t)
			plantLeases(t, c, key, tc.vals)
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

// TestTryAcquire_WaitsForDecidingNodeAtMostTheNodeTimeout: with no deadline on ctx, a
// stalled node that decides the verdict is waited for no longer than the
// node timeout.
func TestTryAcquire_WaitsForDecidingNodeAtMostTheNodeTimeout(t *testing.T) {
	c := startNodes(t, 5)
	const nodeTimeout = 300 * time.Millisecond
	l, link := c.lockerVia(t, []int{4}, redlock.WithNodeTimeout(nodeTimeout))
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	plantLeases(t, c, key, map[int]string{0: "a|42|{}", 1: "a|42|{}", 2: "b|0|{}"})
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
		if got := acquireVerdict(err); got != "held" {
			t.Errorf("TryAcquire: %s (%v), want held: the silent node may be a's third", got, err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: TryAcquire waited for a stalled node past the node timeout")
	}
}

// TestTryAcquire_DecidedSplitVoteDoesNotWaitForStalledNode: when the answers in already
// rule out a majority for anyone (three owners on three of five nodes),
// TryAcquire reports the split vote without waiting for a stalled node
// (its node timeout is long, ctx has no deadline).
func TestTryAcquire_DecidedSplitVoteDoesNotWaitForStalledNode(t *testing.T) {
	c := startNodes(t, 5)
	const nodeTimeout = 20 * time.Second
	l, link := c.lockerVia(t, []int{4}, redlock.WithNodeTimeout(nodeTimeout))
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	plantLeases(t, c, key, map[int]string{0: "a|0|{}", 1: "b|42|{}", 2: reservationFor("wx")})
	link.Stall()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := l.TryAcquire(context.Background(), key)
		done <- err
	}()
	select {
	case err := <-done:
		if got := acquireVerdict(err); got != "split" {
			t.Errorf("TryAcquire: %s (%v), want a split vote", got, err)
		}
		if took := time.Since(start); took > nodeTimeout/2 {
			t.Errorf("TryAcquire took %v: it waited for a node that could not change the verdict", took)
		}
	case <-time.After(nodeTimeout / 2):
		t.Fatal("TryAcquire waited for a stalled node that could not change the verdict")
	}
}

// TestAcquire_WaitsWithoutSpinningForAMajorityHolder: a blocking Acquire against
// a holder on a majority waits (it is not told "split vote" and does not
// spin), and wins once the holder releases.
func TestAcquire_WaitsWithoutSpinningForAMajorityHolder(t *testing.T) {
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

// TestAcquire_WaitEndingOnSplitVoteIsTransientNotNotAcquired: a blocking Acquire whose wait ends
// while every attempt met a split vote (leftover minorities of crashed
// contenders, or of a holder whose release reached only some nodes, live
// out their TTL) observed no holder: per dlock's error rules
// (ErrNotAcquired means a holder was seen) it ends with the last attempt's
// ErrTransient joined with the deadline, never ErrNotAcquired, and it does
// not spin meanwhile.
// Symptom: Locker.Acquire's doc promised ErrNotAcquired for every wait that ends (doc corrected in d73359a).
func TestAcquire_WaitEndingOnSplitVoteIsTransientNotNotAcquired(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	plantLeases(t, c, key, map[int]string{0: "a|0|{}", 1: "b|42|{}"})
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

// Many replicas firing RunOnce at once on a cold key: exactly one runs the
// job, round after round (bounded: 20 rounds).
// Symptom: RunOnce replicas racing on a free key all skipped the job.
func TestRunOnce_OneRunPerRound_ThreeNodes(t *testing.T) {
	runOnceRounds(t, startNodes(t, 3), 4, 20)
}

// TestRunOnce_OneRunPerRound_FiveNodes: 4 to 6 replicas over 5 nodes fire
// RunOnce at once on a fresh key: exactly one runs each round.
func TestRunOnce_OneRunPerRound_FiveNodes(t *testing.T) {
	c := startNodes(t, 5)
	rounds := map[int]int{4: 6, 5: 7, 6: 7} // 20 rounds in all
	for _, replicas := range []int{4, 5, 6} {
		runOnceRounds(t, c, replicas, rounds[replicas])
	}
}

// runOnceRounds has replicas lockers on c fire RunOnce at once on a fresh
// key, rounds times: exactly one must run the job each round.
func runOnceRounds(t *testing.T, c *cluster, replicas, rounds int) {
	t.Helper()
	ls := make([]dlock.Locker, replicas)
	for i := range ls {
		ls[i] = c.locker(t)
		// Warm each client's connections.
		lk, err := ls[i].Acquire(dlocktest.Context(t), dlocktest.Key(t))
		if err != nil {
			t.Fatal(err)
		}
		_ = lk.Release(dlocktest.Context(t))
	}
	for r := range rounds {
		key := dlocktest.Key(t)
		var runs atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, l := range ls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := dlock.RunOnce(dlocktest.Context(t), l, key, 4*time.Second, time.Second, func(context.Context) error {
					runs.Add(1)
					return nil
				})
				if err != nil {
					t.Errorf("%d replicas, round %d: %v", replicas, r, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := runs.Load(); n != 1 {
			t.Fatalf("%d replicas, round %d: the job ran %d times, want once", replicas, r, n)
		}
	}
}

// TestAcquire_SharedAndLimitedUnsupportedWhateverTheNodesHold: redlock offers neither shared nor limited
// locks; asking is ErrUnsupported, before any node is asked, even where
// a split vote or a holder would be seen.
func TestAcquire_SharedAndLimitedUnsupportedWhateverTheNodesHold(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	plantLeases(t, c, key, map[int]string{0: "a|0|{}", 1: "b|0|{}"})
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

func TestTokensAcross200Acquisitions(t *testing.T) {
	c := startNodes(t, 5)
	ls := []*redlock.Locker{c.locker(t), c.locker(t)}
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 200; i++ {
		lk, err := ls[i%2].Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("acquisition %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A node that restarts empty (no persistence) does not break monotonicity
// while the majority keeps its counters: the commit phase put the last
// token on a majority, and every majority overlaps it.
func TestRestartedNodeKeepsTokensIncreasing(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 30; i++ {
		if i%10 == 5 {
			c.srvs[i%5].Restart()
		}
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("acquisition %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		lk.Release(dlocktest.Context(t))
	}
}

// The committed token is what the nodes record, and it is above every
// node's counter: push one node's counter far ahead, and the next token
// follows it.
func TestQuorumCounterWins(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	ahead := uint64(time.Now().Add(24*time.Hour).UnixMicro()) + 12345
	for _, a := range c.admin {
		a.Set(context.Background(), lockKey(key)+":fence", ahead, time.Hour)
	}
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if lk.Token() != ahead+1 {
		t.Fatalf("token %d, want counter+1 = %d", lk.Token(), ahead+1)
	}
	committed := 0 // the token is recorded on the granting majority
	for _, v := range c.holders(t, key) {
		if strings.HasPrefix(v, fmt.Sprintf("%s|%d|", lk.Owner(), lk.Token())) {
			committed++
		}
	}
	if committed < l.Quorum() {
		t.Fatalf("token committed on %d nodes: %q", committed, c.holders(t, key))
	}
	// List reports only keys a majority holds for one owner (the count of
	// nodes holding it is checked above, from the nodes themselves).
	infos, err := l.List(dlocktest.Context(t), key)
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Token != lk.Token() || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	lk.Release(dlocktest.Context(t))
}

// Symptom: every acquisition took a second round trip to each granting
// node, to commit a token the grants could have recorded.
// The first attempt of a Locker commits (it measures the nodes' clocks);
// after it, a proposal recorded by a majority is the token: no commit
// round runs, and the token is in the lease and the counter of that
// majority.
func TestTry_ProposalRecordedOnMajority_NoCommitRound(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	l := c.locker(t)
	// Proposals a minute above the measure, which the nodes accept: no
	// scheduling delay makes one fall short.
	redlock.SetMaxProposalLead(l, time.Hour)
	key := dlocktest.Key(t)
	var last uint64
	for i := range 3 {
		redlock.RaiseClockMeasure(l, time.Duration(i+1)*time.Minute) // above the last one's
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("acquisition %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		recorded := 0
		for j, v := range c.holders(t, key) {
			fence, _ := c.admin[j].Get(context.Background(), lockKey(key)+":fence").Result()
			if strings.HasPrefix(v, fmt.Sprintf("%s|%d|", lk.Owner(), lk.Token())) && fence == fmt.Sprint(lk.Token()) {
				recorded++
			}
		}
		if recorded < l.Quorum() {
			t.Fatalf("acquisition %d: token %d recorded on %d nodes: %q", i, lk.Token(), recorded, c.holders(t, key))
		}
		if n := redlock.CommitRounds(l); n != 1 {
			t.Fatalf("after acquisition %d: %d commit rounds, want the first attempt's", i, n)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// Symptom: a Locker's tokens ran ahead of the nodes' clocks (its last
// token of another key, its own wall clock stepping), and a key whose
// counter expired after its retention then gave a lower token.
// Every token is at most MaxProposalLead (the nodes' limit) ahead of the
// nodes' clocks, even right after a key whose counter is a day ahead was
// acquired.
func TestTry_TokensFollowTheNodesClocks(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	l := c.locker(t)
	ahead := dlocktest.Key(t) + "-ahead"
	high := uint64(time.Now().Add(24 * time.Hour).UnixMicro())
	for _, a := range c.admin {
		if err := a.Set(context.Background(), lockKey(ahead)+":fence", high, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	nodeTime := func() uint64 { // the furthest node's clock, µs
		var m uint64
		for _, a := range c.admin {
			tm, err := a.Time(context.Background()).Result()
			if err != nil {
				t.Fatal(err)
			}
			m = max(m, uint64(tm.UnixMicro()))
		}
		return m
	}
	for i, key := range []string{ahead, dlocktest.Key(t), ahead, dlocktest.Key(t) + "-2"} {
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		limit := nodeTime() + uint64(redisproto.MaxProposalLead.Microseconds())
		if key == ahead {
			limit = high + 2
		}
		if lk.Token() > limit {
			t.Fatalf("acquisition %d of %s: token %d, above %d", i, key, lk.Token(), limit)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// Symptom: a Locker idle for long proposed from a measure whose node
// clocks had moved on by an unknown amount.
// A measure older than a minute is not used: the attempt commits, and
// measures again for the next one.
func TestTry_StaleClockMeasure_CommitsAndMeasuresAgain(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	l := c.locker(t)
	redlock.SetMaxProposalLead(l, time.Hour)
	for i := range 3 {
		if i == 1 {
			redlock.AgeClockMeasure(l, 2*time.Minute)
		}
		redlock.RaiseClockMeasure(l, time.Minute) // no delay makes the proposal short
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
		if err != nil {
			t.Fatal(err)
		}
		lk.Release(dlocktest.Context(t))
		if want := uint64(min(i+1, 2)); redlock.CommitRounds(l) != want {
			t.Fatalf("after acquisition %d: %d commit rounds, want %d", i, redlock.CommitRounds(l), want)
		}
	}
}

// Symptom: a proposal recorded by a minority only was used as the token.
// The attempt commits instead, above the highest floor among the granting
// nodes. Node 0 answers last, so the granting majority is node 1 (its
// counter a day ahead: it does not record) and node 2 (it records).
func TestTry_ProposalRecordedOnMinority_Commits(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	measure, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t)+"-measure")
	if err != nil {
		t.Fatal(err)
	}
	measure.Release(dlocktest.Context(t))
	key := dlocktest.Key(t)
	high := uint64(time.Now().Add(24 * time.Hour).UnixMicro())
	for _, a := range c.admin[:2] {
		if err := a.Set(context.Background(), lockKey(key)+":fence", high, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	gate := make(chan struct{})
	var node2 string // node 2's lease as its grant left it
	redlock.SetGrantHooks(t, l, func(i int) func() {
		switch i {
		case 0:
			<-gate
		case 2:
			return func() { node2 = c.holders(t, key)[2] }
		}
		return nil
	})
	lk, err := l.Acquire(dlocktest.Context(t), key)
	close(gate)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(dlocktest.Context(t))
	if !strings.HasPrefix(node2, lk.Owner()+"|") || strings.HasPrefix(node2, lk.Owner()+"|0|") {
		t.Fatalf("node 2's lease after its grant: %q; want the proposal recorded", node2)
	}
	if lk.Token() != high+1 || redlock.CommitRounds(l) != 2 {
		t.Fatalf("token %d after %d commit rounds; want %d after two", lk.Token(), redlock.CommitRounds(l), high+1)
	}
}

// The defaults take the one-round path: of five acquisitions after the
// Locker's first, at least one proposal is recorded by a majority (each
// falls short only if its request takes longer than the lead, 100 ms,
// plus the measured round trip to reach the nodes).
func TestTry_Defaults_ProposalRecorded(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	l := c.locker(t)
	for range 6 {
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
		if err != nil {
			t.Fatal(err)
		}
		lk.Release(dlocktest.Context(t))
	}
	if n := redlock.CommitRounds(l); n == 6 {
		t.Fatalf("%d commit rounds in 6 acquisitions: no proposal was recorded", n)
	}
}

// Symptom: a counter past 2^53 gave the same token twice (Lua keeps
// 2^53 + 1 as 2^53).
// An attempt whose nodes' counter is at 2^53 or more fails with an error
// saying so, and releases its grants.
func TestTry_CounterAt2To53_FailsClearly(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	for _, a := range c.admin {
		if err := a.Set(context.Background(), lockKey(key)+":fence", "9007199254740992", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err == nil || !strings.Contains(err.Error(), "2^53") || errors.Is(err, dlock.ErrTransient) {
		t.Fatalf("TryAcquire over a counter of 2^53 = %v, %v; want a non-transient error naming 2^53", lk, err)
	}
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for h := c.holders(t, key); strings.Join(h, "") != ""; h = c.holders(t, key) {
		if time.Now().After(deadline) {
			t.Fatalf("the failed attempt left leases: %q", h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// denyFenceWrites makes node i refuse SET on fence counters (a Redis ACL
// user that may SET lock keys only, checked inside scripts too): grants
// succeed there, commits fail.
func (c *cluster) denyFenceWrites(t *testing.T, i int) *redis.Client {
	if _, err := c.srvs[i].Do("ACL", "SETUSER", "nocommit", "on", ">any", "allchannels", "~*", "+@all", "-set",
		"(+set ~dlock:{*})"); err != nil {
		t.Fatal(err)
	}
	cl := redis.NewClient(&redis.Options{Addr: c.srvs[i].Addr(), Username: "nocommit", Password: "any"})
	t.Cleanup(func() { cl.Close() })
	return cl
}

// A majority grants but the commit cannot reach a majority: the attempt is
// cleaned up and reported as transient (Acquire tries again), saying what
// happened on each node, never "held by unknown holder".
func TestCommitFailureIsTransient(t *testing.T) {
	c := startNodes(t, 3)
	cls := []redis.UniversalClient{c.denyFenceWrites(t, 0), c.denyFenceWrites(t, 1), c.client(t, c.srvs[2])}
	l := redlock.New(cls)
	redlock.CommitEveryToken(l) // a recorded proposal needs no commit
	key := dlocktest.Key(t)
	_, err := l.TryAcquire(dlocktest.Context(t), key)
	t.Logf("TryAcquire: %v", err)
	var qe *redlock.QuorumError
	if !errors.Is(err, dlock.ErrTransient) || errors.Is(err, dlock.ErrNotAcquired) || !errors.As(err, &qe) || qe.Op != "commit" {
		t.Fatalf("commit on a minority: %v, want a transient commit QuorumError", err)
	}
	if msg := err.Error(); strings.Contains(msg, "unknown holder") || !strings.Contains(msg, "can't access") {
		t.Fatalf("message does not say what happened: %v", err)
	}
	// Acquire keeps trying until its deadline, then reports the outage.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = l.Acquire(ctx, key)
	if !errors.Is(err, dlock.ErrTransient) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("Acquire with failing commits: %v, want transient joined with the deadline", err)
	}
	// Every attempt was cleaned up: the key is free on every node.
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for h := c.holders(t, key); strings.Join(h, "") != ""; h = c.holders(t, key) {
		if time.Now().After(deadline) {
			t.Fatalf("failed attempts left leases: %q", h)
		}
		time.Sleep(10 * time.Millisecond)
	}
	lk, err := c.locker(t).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(dlocktest.Context(t))
}
