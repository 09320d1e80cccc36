package redislock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Waiters are woken one at a time: with 8 waiters queued, one release
// leads to one acquisition attempt, not eight.
func TestReleaseWakesOneWaiter(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	key := dlocktest.Key(t)
	holder, err := redislock.New(newClient(t, srv)).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	got := make(chan *dlock.Lock, n)
	for i := 0; i < n; i++ {
		l := redislock.New(newClient(t, srv))
		go func() {
			lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Minute}))
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
	}
	waiters := l0waiters(t, admin, key, n)
	t.Logf("%d waiters queued", waiters)
	admin.ConfigResetStat(dlocktest.Context(t))
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	first := <-got
	evals := evalCalls(t, admin)
	// The release itself, and the one woken waiter's attempt.
	if evals > 3 {
		t.Errorf("one release caused %d script calls: waiters were not woken one at a time", evals)
	}
	// The rest follow one by one.
	first.Release(dlocktest.Context(t))
	for i := 1; i < n; i++ {
		select {
		case lk := <-got:
			lk.Release(dlocktest.Context(t))
		case <-time.After(dlocktest.HangTimeout):
			t.Fatalf("hang: waiter %d never woken", i)
		}
	}
}

// l0waiters waits until n waiters are queued for key.
func l0waiters(t *testing.T, c *redis.Client, key string, n int64) int64 {
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for {
		k := redislock.New(c).LockKey(key) + ":waiters"
		if got, _ := c.ZCard(dlocktest.Context(t), k).Result(); got >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatal("hang: waiters never queued")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// evalCalls is the number of EVALSHA calls the server has run.
func evalCalls(t *testing.T, c *redis.Client) int { return commandStat(t, c, "evalsha", "calls") }

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

// Symptom: departed waiters stayed queued; the queue grew without bound and releases woke nobody.
// A waiter that gives up (its context ends) removes itself from the key's
// waiter queue, in the background; a live waiter queued next is woken by
// the release, which reserves the key for it.
//
// The test makes sure each waiter really queued before it leaves, then
// waits for dlock's background work to end (not for the queue to look
// empty): the queue must then hold nobody.
func TestWaiters_DepartedWaiters_LeaveTheQueue(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	holder := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	h, err := holder.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	queue := holder.LockKey(key) + ":waiters"
	l := redislock.New(newClient(t, srv))
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(dlocktest.Context(t))
		got := make(chan error, 1)
		go func() {
			_, err := l.Acquire(ctx, key)
			got <- err
		}()
		waitQueued(t, admin, queue, 1)
		cancel()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter %d: %v, want context.Canceled", i, err)
		}
		if !background.Wait(dlocktest.HangTimeout) {
			t.Fatalf("hang: background work did not end within %v", dlocktest.HangTimeout)
		}
		if n, err := admin.ZCard(context.Background(), queue).Result(); err != nil || n != 0 {
			t.Fatalf("waiter %d left, and %s still holds %d waiters (%v)", i, queue, n, err)
		}
	}
	// Then a live waiter queues; the release wakes it and reserves the key
	// for it.
	got := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err == nil {
			lk.Release(context.Background())
		}
		got <- err
	}()
	waitQueued(t, admin, queue, 1)
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the live waiter: %v", err)
	}
}

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

func (h *dequeueHook) DialHook(next redis.DialHook) redis.DialHook { return next }

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
// Symptom: a removal sent once left the departed waiter queued after all
// of dlock's background work ended. Failed removals are retried
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

// Symptom: channels of waits that ended while their SUBSCRIBE was in flight stayed subscribed.
// Waits that end while their SUBSCRIBE is in flight leave no channel
// subscribed. A channel left behind would stay subscribed for as long as
// the Locker has any waiter, and PUBLISH would count it as a listener.
func TestWatch_EndedWaits_LeaveNothingSubscribed(t *testing.T) {
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

// Symptom: on a Cluster a release on another master popped up to 16 waiters and reserved the key for none.
// On a Cluster, one Locker multiplexes every waiter on one pub/sub
// connection, opened on the master of the first waiter's key. A release on
// another master PUBLISHes to the waiter's channel; Redis Cluster forwards
// the message over the bus, but PUBLISH counts only the local receivers
// (0). A release still wakes the first queued waiter, and reserves the
// key for it, so one release causes one retry, not a herd.
//
// The waiters reach the cluster through fault proxies, stalled while the
// release runs, so that what the release did (the queue, the lock key) is
// observed before any woken waiter can act on it.
func TestCluster_ReleaseOnOtherMaster_WakesAndReservesOneWaiter(t *testing.T) {
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

// A wait that ends granted keeps its channel subscribed, for the next
// wait of the same key: a release meanwhile reserves the key for nobody
// (no queue holds the kept id), and the next wait is queued, under the
// same id, by its first attempt.
// Symptom: every contended Acquire paid a SUBSCRIBE (and, with its Locker's last wait ended, a new pub/sub connection) and a second attempt before it was queued.
func TestWatch_GrantedWaitsChannel_ServesNextWaitReservesNothing(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	holder := redislock.New(newClient(t, srv))
	var attempts atomic.Int32
	obs := dlock.WithCallObserver(dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventAttempt {
			attempts.Add(1)
		}
	}))
	l := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	lockKey := holder.LockKey(key)
	queue := lockKey + ":waiters"
	ctx := dlocktest.Context(t)

	// wait queues l behind the holder's lock h and returns l's lock once
	// h is released, with the id l was queued under.
	wait := func(h *dlock.Lock) (*dlock.Lock, string) {
		t.Helper()
		got := make(chan *dlock.Lock, 1)
		go func() {
			lk, err := l.Acquire(ctx, key, obs)
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
		waitQueued(t, admin, queue, 1)
		ids, err := admin.ZRange(ctx, queue, 0, -1).Result()
		if err != nil || len(ids) != 1 {
			t.Fatalf("queue: %q, %v", ids, err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lk := <-got
		if lk == nil {
			t.FailNow()
		}
		return lk, ids[0]
	}

	h, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	lk, id := wait(h)
	chans, err := admin.PubSubChannels(ctx, lockKey+":w:*").Result()
	if err != nil || !slices.Equal(chans, []string{lockKey + ":w:" + id}) {
		t.Fatalf("after the granted wait: subscribed %q (%v), want the wait's channel kept", chans, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := admin.Get(ctx, lockKey).Result(); err != nil || strings.Count(v, "|") != 1 {
		t.Fatalf("after a release with only a kept channel: %s = %q (%v), want a marker reserving nothing", lockKey, v, err)
	}

	h, err = holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	attempts.Store(0)
	lk, again := wait(h)
	defer lk.Release(ctx)
	if again != id {
		t.Errorf("the next wait was queued as %s, want the kept channel's %s", again, id)
	}
	if n := attempts.Load(); n != 2 {
		t.Errorf("the next wait made %d attempts, want 2: one queued, one granted on the wake-up", n)
	}
}
