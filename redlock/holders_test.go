package redlock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// Two other owners hold the key on different nodes, one of them on a
// majority: the NotAcquiredError lists both, the one seen on most nodes
// first, each with its own lease left; the per-node report is its Cause.
// (Owners on minorities alone are a split vote: TestRegressSplitVote*.)
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
