package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
)

// The reply to an acquisition's create is lost: Abort finds the entry by
// its owner and deletes it (not another owner's), and the key is free
// without waiting for the lease, which another lock keeps alive.
// Symptom: the entry of a create whose reply was lost stayed while another lock kept its lease alive.
func TestLostCreateReplyIsAborted(t *testing.T) {
	t.Parallel()
	c, l, r := lossyLocker(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key, key2 := dlocktest.Key(t), dlocktest.Key(t)
	ttl := dlock.WithTTL(time.Minute)
	keeper, err := l.Acquire(dlocktest.Context(t), key2, ttl) // keeps the shared lease alive
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Release(context.Background())
	lost := r.arm(txnPutUnder(l.QueuePrefix(key)))
	lk, err := l.TryAcquire(dlocktest.Context(t), key, ttl)
	mustHaveLost(t, lost, "the TryAcquire's create")
	if err == nil {
		t.Fatalf("TryAcquire whose reply was lost succeeded (token %d)", lk.Token())
	} else if errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a lost reply reported as a held key: %v", err)
	}
	ctx, cancel := ctxFor(15 * time.Second) // < the lease (1 min) and its renewal (20s)
	defer cancel()
	lk2, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("the entry of the attempt whose reply was lost was left behind: %v", err)
	}
	lk2.Release(context.Background())
	if err := keeper.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("another lock of the same lease was touched: %v", err)
	}
}
