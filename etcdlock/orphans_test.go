package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
)

// An entry whose delete failed does not linger while another lock keeps
// the shared lease alive: its delete is retried with the lease's next
// keep-alive.
// Symptom: the entry of a failed Release held the key as long as another lock renewed the lease.
func TestFailedReleaseDoesNotLingerOnSharedLease(t *testing.T) {
	t.Parallel()
	c, l, p := proxied(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key, key2 := dlocktest.Key(t), dlocktest.Key(t)
	ttl := dlock.WithTTL(3 * time.Second)
	a, err := l.Acquire(dlocktest.Context(t), key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	keeper, err := l.Acquire(dlocktest.Context(t), key2, ttl) // same TTL: same lease
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Release(context.Background())
	p.Cut()
	ctx, cancel := ctxFor(300 * time.Millisecond)
	err = a.Release(ctx)
	cancel()
	if err == nil {
		t.Fatal("Release through a cut link succeeded")
	}
	p.Heal()
	// The lease is renewed every second by keeper: without the retried
	// delete the key would stay held as long as keeper is.
	lk, err := other.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("the entry whose release failed lingered: %v", err)
	}
	lk.Release(context.Background())
	if keeper.Err() != nil {
		t.Fatalf("keeper: %v", keeper.Err())
	}
}
