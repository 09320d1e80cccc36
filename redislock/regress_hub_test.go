package redislock_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Waits that end while their SUBSCRIBE is in flight must not leave their
// channel subscribed: the hub sends UNSUBSCRIBE on a goroutine of its own,
// which can reach go-redis's PubSub before the SUBSCRIBE it undoes. A
// channel left behind stays subscribed for as long as the Locker has any
// waiter, and PUBLISH counts it as a listener.
func TestRegressHubLeaksSubscriptions(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	l := redislock.New(c)
	holder := redislock.New(newClient(t, srv))
	key, other := dlocktest.Key(t), dlocktest.Key(t)
	h1, err := holder.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Release(context.Background())
	h2, err := holder.Acquire(dlocktest.Context(t), other)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Release(context.Background())
	// One long waiter keeps the hub's connection open.
	longCtx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _, _ = l.Acquire(longCtx, other) }()
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 2000; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(300+rand.IntN(1500))*time.Microsecond)
		_, _ = l.Acquire(ctx, key)
		cancel()
	}
	// The UNSUBSCRIBEs run in the background: wait (bounded) for them. A
	// leaked channel stays subscribed while the long waiter keeps the
	// connection open.
	admin := newClient(t, srv)
	pattern := redislock.New(admin).LockKey(key) + ":w:*"
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
		chans, err := admin.PubSubChannels(context.Background(), pattern).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(chans) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d waiter channels of ended waits are still subscribed, e.g. %q", len(chans), chans[0])
		}
	}
	// The long waiter's channel is subscribed: the connection lived
	// throughout (a closed one would have dropped leaked channels too).
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
		chans, err := admin.PubSubChannels(context.Background(), redislock.New(admin).LockKey(other)+":w:*").Result()
		if err == nil && len(chans) == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the long waiter's channel: %q, %v", chans, err)
		}
	}
}
