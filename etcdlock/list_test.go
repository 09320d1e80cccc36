package etcdlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
)

// List returns by its context's deadline on a stalled link.
// Symptom: List on a stalled link outliving its context's deadline.
func TestListHonoursContext(t *testing.T) {
	t.Parallel()
	_, l, p := proxied(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	ctx, cancel := ctxFor(300 * time.Millisecond)
	start := time.Now()
	_, err = l.List(ctx, key)
	cancel()
	if over := time.Since(start) - 300*time.Millisecond; over > dlocktest.OverrunBound || err == nil {
		t.Fatalf("List on a stalled link: %v after %v", err, time.Since(start))
	}
	p.Heal()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}
