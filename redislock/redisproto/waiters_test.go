package redisproto_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// A waiter that leaves is dequeued once its last attempt in flight has
// returned, also when that attempt queued it after it left (an attempt
// abandoned at its caller's deadline).
func TestWaiterDequeuedAfterAttemptsInFlight(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	k := key(t)
	if g, err := n.Acquire(ctx, k, strings.Repeat("a", 32), time.Minute, "{}", "", ""); err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	var ws redisproto.Waiters
	w := ws.Add(k, "w1", n)
	end := ws.Begin("w1")
	w.Leave()
	// The attempt in flight reaches the server after the waiter left.
	if g, err := n.Acquire(ctx, k, strings.Repeat("b", 32), time.Minute, "{}", "w1", ""); err != nil || g.Granted {
		t.Fatal(g, err)
	}
	if q, _ := c.ZCard(ctx, n.WaitersKey(k)).Result(); q != 1 {
		t.Fatalf("queue holds %d waiters, want the one in flight", q)
	}
	end()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		q, err := c.ZCard(ctx, n.WaitersKey(k)).Result()
		if err == nil && q == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d waiters (%v) after the waiter left and its attempt returned", q, err)
		}
	}
	// Attempts begun after it left are not tracked.
	ws.Begin("w1")()
}

// A waiter's Leave is clean (nothing to dequeue: its channel may serve
// the next wait) only when its last attempt was granted and none is in
// flight: a grant followed by a refused attempt (the core refused the
// grant, the wait went on and queued it again) is not, and the waiter
// is dequeued.
// Symptom: a grant flag that was never cleared let a queued waiter's channel be kept, and releases reserved the key for nobody.
func TestWaiterLeave_RefusedAfterGrant_Dequeued(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	k := key(t)
	if g, err := n.Acquire(ctx, k, strings.Repeat("a", 32), time.Minute, "{}", "", ""); err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	var ws redisproto.Waiters
	w := ws.Add(k, "w1", n)
	end := ws.Begin("w1")
	ws.Granted("w1") // an attempt granted (its grant then refused by the core)
	end()
	end = ws.Begin("w1") // the next attempt is refused and queues w1
	if g, err := n.Acquire(ctx, k, strings.Repeat("b", 32), time.Minute, "{}", "w1", ""); err != nil || g.Granted {
		t.Fatal(g, err)
	}
	end()
	if w.Leave() {
		t.Fatal("Leave reported clean, with the waiter queued by its last attempt")
	}
	for deadline := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
		q, err := c.ZCard(ctx, n.WaitersKey(k)).Result()
		if err == nil && q == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d waiters (%v) after the waiter left", q, err)
		}
	}
	// Granted last, nothing in flight: clean.
	w2 := ws.Add(k, "w2", n)
	end = ws.Begin("w2")
	ws.Granted("w2")
	end()
	if !w2.Leave() {
		t.Error("Leave after a grant with nothing in flight: not clean")
	}
}
