package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Red team (issue 9): a waiter queues, its link stalls and it gives up;
// its removal goes into the stall, the link is then cut (refused) and
// heals. The removal used to be sent once: after all of dlock's background
// work ended the departed waiter was still queued (3 of 3 runs). Failed
// removals are now retried with backoff (up to 30s, or until the client
// is closed).
func TestRegressDepartedWaiterDequeuedAfterStall(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	holder := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	h, err := holder.Acquire(dlocktest.Context(t), key, dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(context.Background())
	queue := holder.LockKey(key) + ":waiters"

	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password()})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, key)
		got <- err
	}()
	waitQueued(t, admin, queue, 1)
	p.Stall()
	t.Logf("Acquire: %v", <-got)
	// go-redis read timeout (3s) ends the attempt in flight; the dequeue
	// then goes into the stall too (request timeout 5s).
	time.Sleep(4 * time.Second)
	p.Cut()
	time.Sleep(6 * time.Second)
	p.Heal()
	if !background.Wait(dlocktest.HangTimeout) {
		t.Fatal("background work did not end")
	}
	n, err := admin.ZCard(context.Background(), queue).Result()
	members, _ := admin.ZRange(context.Background(), queue, 0, -1).Result()
	pttl, _ := admin.PTTL(context.Background(), queue).Result()
	t.Logf("after the waiter left and the link healed: %s holds %d waiters %v (pttl %v)", queue, n, members, pttl)
	if n != 0 {
		t.Errorf("the departed waiter is still queued after the link healed")
	}
}
