package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// dequeueHook records the outcome of every pipeline of ZREMs (a departed
// waiter's removal from its queue) a client sends: when it was sent and
// whether it failed.
type dequeueHook struct {
	mu    sync.Mutex
	sends []dequeueSend
}

type dequeueSend struct {
	at     time.Time
	failed bool
}

func (h *dequeueHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *dequeueHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *dequeueHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		at := time.Now()
		err := next(ctx, cmds)
		if len(cmds) > 0 && cmds[0].Name() == "zrem" {
			h.mu.Lock()
			h.sends = append(h.sends, dequeueSend{at, err != nil})
			h.mu.Unlock()
		}
		return err
	}
}

// waitFailed waits (bounded by dlocktest.HangTimeout) until a removal
// sent at or after since has failed.
func (h *dequeueHook) waitFailed(t *testing.T, since time.Time, what string) {
	t.Helper()
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
		h.mu.Lock()
		for _, s := range h.sends {
			if s.failed && !s.at.Before(since) {
				h.mu.Unlock()
				return
			}
		}
		h.mu.Unlock()
		if time.Now().After(end) {
			t.Fatalf("hang: no removal of the departed waiter failed %s within %v", what, dlocktest.HangTimeout)
		}
	}
}

// TestWaiters_DepartedWaiterDequeued_AfterStallAndCut: a waiter queues,
// its link stalls and it gives up; its removal goes into the stall and
// fails, the link is then cut (a retried removal is refused) and heals.
// The removal used to be sent once: after all of dlock's background work
// ended the departed waiter was still queued. Failed removals are retried
// with backoff (up to 30s, or until the client is closed): once the link
// heals and the background work has ended, the queue is empty. The
// schedule follows the removals a hook on the client sees, not sleeps.
//
// Not parallel: it waits for all of dlock's background work to end.
func TestWaiters_DepartedWaiterDequeued_AfterStallAndCut(t *testing.T) {
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
	t.Cleanup(p.Heal)
	// A short read timeout: a request in the stall fails sooner (the
	// order of events is the same).
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password(), ReadTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	hook := &dequeueHook{}
	c.AddHook(hook)
	l := redislock.New(c)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, key)
		got <- err
	}()
	waitQueued(t, admin, queue, 1)
	stalled := time.Now()
	p.Stall()
	t.Logf("Acquire: %v", <-got)
	hook.waitFailed(t, stalled, "in the stall")
	cut := time.Now()
	p.Cut()
	hook.waitFailed(t, cut, "on the cut link")
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
