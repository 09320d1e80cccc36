package redislock

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A second Close of a wait's subscription, after its channel was kept and
// handed to the next wait of the key, leaves that wait alone: its waiter
// stays tracked and its channel subscribed.
// Symptom: the second Close dropped the next wait's waiter (never dequeued) and unsubscribed the channel it was using.
func TestSubscriptionClose_Twice_LeavesReusedChannelAlone(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Password()})
	t.Cleanup(func() { c.Close() })
	b := New(c).b
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	first, err := b.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	s := first.(*subscription)
	b.waiters.Begin(s.id)()
	end := b.waiters.Begin(s.id)
	b.waiters.Granted(s.id) // the wait ends granted, nothing in flight
	end()
	s.Close()
	next, ok := b.Ready(key).(*subscription)
	if !ok || next == nil || next.id != s.id {
		t.Fatalf("Ready after a granted wait: %v, want its channel %s", next, s.id)
	}
	defer next.Close()
	s.Close() // again
	if !next.Subscription.Confirmed() {
		t.Error("the next wait's channel was unsubscribed by the first wait's second Close")
	}
	end = b.waiters.Begin(next.id)
	b.waiters.Granted(next.id)
	end()
	if !next.w.Leave() {
		t.Error("the next wait's waiter is no longer tracked after the first wait's second Close")
	}
}
