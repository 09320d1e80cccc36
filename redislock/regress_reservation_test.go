package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// While a release reserves the key for the waiter it woke, a TryAcquire by
// someone else used to get ErrNotAcquired naming an empty holder and no
// metadata ("not acquired", by nobody). It must say that the key is
// reserved, for which waiter, and for how long.
func TestRegressReservationReportedAsHolder(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	l1 := redislock.New(newClient(t, srv))
	px := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(px.Heal)
	c2 := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { c2.Close() })
	l2 := redislock.New(c2)
	l3 := redislock.New(newClient(t, srv))
	// The reservation lasts 100ms: if the TryAcquire comes later than
	// that (a slow machine), it gets the key; then try again (bounded).
	for round := 0; ; round++ {
		key := dlocktest.Key(t)
		lk, err := l1.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		waiting := make(chan error, 1)
		go func() {
			w, err := l2.Acquire(dlocktest.Context(t), key)
			if err == nil {
				err = w.Release(context.Background())
			}
			waiting <- err
		}()
		queue := l1.LockKey(key) + ":waiters"
		waitQueued(t, admin, queue, 1)
		ids, err := admin.ZRange(context.Background(), queue, 0, -1).Result()
		if err != nil || len(ids) != 1 {
			t.Fatal(ids, err)
		}
		px.Stall() // the waiter's host hangs: the key stays reserved
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
		o, err := l3.TryAcquire(dlocktest.Context(t), key)
		px.Heal()
		if err == nil {
			t.Logf("round %d: the reservation ended before the TryAcquire", round)
			if err := o.Release(dlocktest.Context(t)); err != nil {
				t.Fatal(err)
			}
			if err := <-waiting; err != nil {
				t.Fatal(err)
			}
			if round == 9 {
				t.Skip("the TryAcquire never came within the reservation")
			}
			continue
		}
		if err := <-waiting; err != nil {
			t.Fatal(err)
		}
		t.Logf("TryAcquire: %v", err)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) {
			t.Fatalf("TryAcquire of a reserved key = %v, want a *dlock.NotAcquiredError", err)
		}
		if len(na.Holders) != 1 {
			t.Fatalf("TryAcquire of a key reserved for waiter %s: holders %+v, want one (the reservation)", ids[0], na.Holders)
		}
		h := na.Holders[0]
		if h.Owner != "" || h.Metadata[redislock.MetaReservedForWaiter] != ids[0] {
			t.Fatalf("TryAcquire of a key reserved for waiter %s: holder %q, metadata %v", ids[0], h.Owner, h.Metadata)
		}
		if h.TTL <= 0 || h.TTL > 100*time.Millisecond {
			t.Fatalf("TTL %v, want the reservation left, within (0, 100ms]", h.TTL)
		}
		if msg := err.Error(); !strings.Contains(msg, "reserved it for waiter "+ids[0]) {
			t.Fatalf("message %q does not name the reservation", msg)
		}
		return
	}
}
