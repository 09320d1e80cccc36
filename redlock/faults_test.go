package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// TestFaults runs the suite, fault section included, on three nodes.
func TestFaults(t *testing.T) {
	conformanceGrace(t)
	c := startNodes(t, 3)
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL:         conformanceTTL,
		TellsBroken: true, // each node publishes the break
		New:         func(t testing.TB) dlock.Locker { return c.locker(t, redlock.WithNodeTimeout(conformanceNodeTimeout)) },
		Expire: func(t testing.TB, key string) {
			for _, a := range c.admin {
				if err := a.Del(context.Background(), lockKey(key)).Err(); err != nil {
					t.Fatal(err)
				}
			}
		},
		Faults: &dlocktest.Faults{
			// Every node through a proxy of its own.
			New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(conformanceNodeTimeout))
				return l, link
			},
			// The same, every proxy stopped by down.
			Down: func(t testing.TB) (dlock.Locker, func()) {
				l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(conformanceNodeTimeout))
				return l, func() {
					for _, p := range link {
						p.Stop()
					}
				}
			},
			Pause: func(t testing.TB, keys ...string) func() {
				for _, s := range c.srvs[:2] { // a majority
					s.Pause()
				}
				return func() {
					for _, s := range c.srvs[:2] {
						s.Resume()
					}
				}
			},
			// One node of three through a proxy.
			NewMinority: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(conformanceNodeTimeout))
				return l, link
			},
		},
	})
}

func TestNodesDown(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	c.srvs[0].Stop()
	c.srvs[3].Stop()
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatalf("2 of 5 down: %v", err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("release with 2 of 5 down: %v", err)
	}

	c.srvs[4].Stop() // 3 of 5 down
	start := time.Now()
	_, err = l.TryAcquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(30*time.Second))
	elapsed := time.Since(start)
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("3 of 5 down: %v, want a QuorumError", err)
	}
	if !strings.Contains(err.Error(), "majority is impossible") || !strings.Contains(err.Error(), c.srvs[4].Addr()) {
		t.Fatalf("quorum error does not say what happened: %v", err)
	}
	t.Logf("3 of 5 down: %v after %v", err, elapsed.Round(time.Millisecond))
	// "Quickly": the answer comes from the per-node timeout (1s here),
	// not from the TTL.
	if elapsed > 15*time.Second {
		t.Fatalf("quorum error took %v with a 30s TTL", elapsed)
	}
	// A default client takes longer than the node timeout to give up
	// dialling a dead node, so dead nodes look silent: Acquire keeps
	// trying until its deadline (they may come back), then says so.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = l.Acquire(ctx, dlocktest.Key(t), dlock.WithTTL(30*time.Second))
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with 3 of 5 down: %v, want an outage joined with the deadline", err)
	}
}

func TestSlowNodeDoesNotDelay(t *testing.T) {
	c := startNodes(t, 5)
	const nodeTimeout = 5 * time.Second
	l := c.locker(t, redlock.WithNodeTimeout(nodeTimeout))
	c.srvs[2].Pause()
	defer c.srvs[2].Resume()
	start := time.Now()
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	acquired := time.Since(start)
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	released := time.Since(start) - acquired
	t.Logf("with one node paused: acquire %v, release %v", acquired.Round(time.Millisecond), released.Round(time.Millisecond))
	// Waiting for the paused node would take the whole node timeout.
	if acquired >= nodeTimeout || released >= nodeTimeout {
		t.Fatalf("a paused node delayed acquire (%v) or release (%v) to its %v timeout", acquired, released, nodeTimeout)
	}
}

// A node that does not answer counts as failed once the per-node timeout
// passes, even though a default client ignores the per-node context on a
// stalled link (it would wait for its 5s read timeout and retry): the
// attempt is decided by the timer, with a context that never ends.
func TestSilentNodeCountsAsFailed(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(200*time.Millisecond))
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	other := `0123456789abcdef0123456789abcdef|7|{"host":"elsewhere","pid":"99"}`
	if err := c.admin[1].Set(context.Background(), lockKey(key), other, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	link.Stall()
	done := make(chan error, 1)
	go func() {
		_, err := l.TryAcquire(context.Background(), key)
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("TryAcquire: %v", err)
		var qe *redlock.QuorumError
		if !errors.As(err, &qe) || !strings.Contains(err.Error(), "no answer within 200ms") {
			t.Fatalf("TryAcquire with one node held and one silent: %v, want the silent node timed out", err)
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("a holder was seen: %v, want ErrNotAcquired", err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: TryAcquire waited for a stalled node")
	}
}

// Grants whose replies are lost on warm connections are sent again by
// go-redis; the repeats are granted without touching the lease, and the
// lock is taken once.
func TestLostGrantReplies(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2})
	t.Cleanup(link.Heal)
	warm, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t)) // connections open, scripts loaded
	if err != nil {
		t.Fatal(err)
	}
	warm.Release(dlocktest.Context(t))
	key := dlocktest.Key(t)
	link.LoseNextReply()
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("TryAcquire with the grant replies lost: %v", err)
	}
	committed := 0
	for _, v := range c.holders(t, key) {
		if strings.HasPrefix(v, fmt.Sprintf("%s|%d|", lk.Owner(), lk.Token())) {
			committed++
		}
	}
	if committed < l.Quorum() {
		t.Fatalf("token committed on %d nodes: %q", committed, c.holders(t, key))
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}
