package redislock_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// On a Cluster, one Locker multiplexes every waiter on one pub/sub
// connection, opened on the master of the first waiter's key. A release on
// another master PUBLISHes to the waiter's channel; Redis Cluster forwards
// the message over the bus, but PUBLISH counts only the local receivers
// (0). The release used to take every queued waiter for departed: it
// popped (and woke) up to 16 of them and reserved the key for none. The
// promise: a release wakes the first queued waiter, and reserves the key
// for it, so one release causes one retry, not a herd.
//
// The waiters reach the cluster through fault proxies, stalled while the
// release runs, so that what the release did (the queue, the lock key) is
// observed before any woken waiter can act on it.
func TestRegressClusterWakeAcrossMasters(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	keyA := dlocktest.Key(t)
	keyB := ""
	for i := 0; i < 1000 && keyB == ""; i++ {
		if k := keyA + "." + strconv.Itoa(i); tc.master(t, k) != tc.master(t, keyA) {
			keyB = k
		}
	}
	if keyB == "" {
		t.Fatal("no key on another master in 1000 tries")
	}
	holder := redislock.New(tc.client(t, nil))
	hA, err := holder.Acquire(dlocktest.Context(t), keyA)
	if err != nil {
		t.Fatal(err)
	}
	defer hA.Release(context.Background())
	hB, err := holder.Acquire(dlocktest.Context(t), keyB)
	if err != nil {
		t.Fatal(err)
	}
	var link testserver.Proxies
	via := map[string]string{}
	for _, n := range tc.nodes {
		p := testserver.StartProxy(t, n.Addr())
		link = append(link, p)
		via[n.Addr()] = p.Addr()
	}
	t.Cleanup(link.Heal)
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	admin := redislock.New(tc.admin)
	queueA, queueB := admin.LockKey(keyA)+":waiters", admin.LockKey(keyB)+":waiters"
	const n = 3
	got := make(chan *dlock.Lock, n)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		for len(got) > 0 {
			(<-got).Release(context.Background())
		}
	}()
	for i := 0; i < n; i++ {
		w := redislock.New(tc.client(t, via))
		// This Locker's first waiter, on keyA: its hub's connection is on
		// keyA's master.
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _ = w.Acquire(ctx, keyA)
		}()
		waitQueued(t, tc.admin, queueA, int64(i+1))
		go func() {
			defer wg.Done()
			lk, err := w.Acquire(ctx, keyB, dlock.WithTTL(5*time.Second))
			if err == nil {
				got <- lk
			}
		}()
		waitQueued(t, tc.admin, queueB, int64(i+1))
	}
	link.Stall()
	if err := hB.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	v, _ := tc.admin.Get(context.Background(), admin.LockKey(keyB)).Result()
	after, _ := tc.admin.ZCard(context.Background(), queueB).Result()
	link.Heal()
	t.Logf("waiters queued before the release: %d, after: %d; lock key after the release: %q", n, after, v)
	if strings.Count(v, "|") != 3 || after != n-1 {
		t.Fatalf("one release took %d waiters off the queue (want 1); lock key %q (want a reservation \"|<token>|<id>|<until>\")", n-after, v)
	}
	select {
	case lk := <-got:
		lk.Release(context.Background())
	case <-ctx.Done():
		t.Fatal("hang: the woken waiter did not get the lock")
	}
}

// waitQueued waits (bounded) until queue holds n waiters.
func waitQueued(t *testing.T, c redis.Cmdable, queue string, n int64) {
	t.Helper()
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
		got, err := c.ZCard(context.Background(), queue).Result()
		if err == nil && got == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("hang: %s holds %d waiters (%v), want %d", queue, got, err, n)
		}
	}
}
