package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Renewals (backend.RefreshBatch): every lock of a Locker is renewed by
// one watchdog, in pipelines. What these tests assert is what the client
// sends (round trips, counted by a go-redis hook) and what the server
// holds (each lease's expiry, PEXPIRETIME), compared with the holder's
// view: never a latency. How late the watchdog closes Lost() after a
// deadline is the core's to test, on a fake clock
// (watchdog_stream_internal_test.go in package dlock): on a real server a
// starved process is a paused process, whose timers wait for the
// scheduler, and only fencing covers that.

// renewalHook counts the pipelines a client sends (the watchdog's renewal
// batches: nothing else pipelines without WithReplicaAcks) and their
// scripts.
type renewalHook struct {
	mu sync.Mutex
	renewalCounts
}

// renewalCounts are renewalHook's counters.
type renewalCounts struct {
	// Pipes counts the pipelines with a script (EVALSHA or EVAL: the
	// watchdog's renewal batches and their resends; go-redis pipelines a
	// new connection's handshake too); Evalsha and Eval the scripts in
	// them.
	Pipes, Evalsha, Eval int
	// Renewed counts the scripts in them that answered without an error.
	Renewed int
	// NoScript counts the EVALSHAs that met NOSCRIPT, NoScriptPipes the
	// pipelines with at least one, EvalPipes the pipelines with an EVAL.
	NoScript, NoScriptPipes, EvalPipes int
}

func (h *renewalHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *renewalHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *renewalHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.mu.Lock()
		defer h.mu.Unlock()
		noscript, eval, script := false, false, false
		for _, cmd := range cmds {
			switch cmd.Name() {
			case "evalsha":
				h.Evalsha++
			case "eval":
				h.Eval++
				eval = true
			default:
				continue
			}
			script = true
			switch cerr := cmd.Err(); {
			case cerr == nil:
				h.Renewed++
			case strings.HasPrefix(cerr.Error(), "NOSCRIPT"):
				h.NoScript++
				noscript = true
			}
		}
		if script {
			h.Pipes++
		}
		if noscript {
			h.NoScriptPipes++
		}
		if eval {
			h.EvalPipes++
		}
		return err
	}
}

// counts returns the counters.
func (h *renewalHook) counts() renewalCounts {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewalCounts
}

// waitRenewed waits (bounded by dlocktest.HangTimeout) until the hook
// has counted at least n renewals answered without an error.
func (h *renewalHook) waitRenewed(t *testing.T, n int) renewalCounts {
	t.Helper()
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
		c := h.counts()
		if c.Renewed >= n {
			return c
		}
		if time.Now().After(end) {
			t.Fatalf("hang: %d renewals answered within %v, want %d (%+v)", c.Renewed, dlocktest.HangTimeout, n, c)
		}
	}
}

// manyLocks is n locks of one Locker whose client goes through a fault
// proxy (Link) and counts its pipelines (Hook).
type manyLocks struct {
	Srv   *testserver.Redis
	Link  *testserver.Proxy
	Hook  *renewalHook
	L     *redislock.Locker
	Keys  []string
	Locks []*dlock.Lock
}

// acquireMany takes n locks of TTL ttl through one Locker, from 16
// goroutines at once (the locks' renewals coalesce sooner the closer
// together they were taken).
func acquireMany(t *testing.T, n int, ttl time.Duration) *manyLocks {
	t.Helper()
	m := &manyLocks{Srv: testserver.StartRedis(t), Hook: &renewalHook{}}
	m.Link = testserver.StartProxy(t, m.Srv.Addr())
	t.Cleanup(m.Link.Heal) // before the proxy stops: abandoned calls end
	c := redis.NewClient(&redis.Options{Addr: m.Link.Addr(), Password: m.Srv.Password(), PoolSize: 32})
	t.Cleanup(func() { c.Close() })
	c.AddHook(m.Hook)
	m.L = redislock.New(c)
	base := dlocktest.Key(t)
	m.Keys = make([]string, n)
	m.Locks = make([]*dlock.Lock, n)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	start := time.Now()
	for g := 0; g < 16; g++ {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				m.Keys[i] = fmt.Sprintf("%s.%d", base, i)
				lk, err := m.L.Acquire(dlocktest.Context(t), m.Keys[i], dlock.WithTTL(ttl))
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				m.Locks[i] = lk
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	t.Logf("%d locks of TTL %v acquired in %v", n, ttl, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		m.Link.Heal()
		for _, lk := range m.Locks {
			lk.Release(context.Background())
		}
	})
	return m
}

// deadlinesBeforeServerExpiry checks the promise a holder's local
// deadline rests on: it is never after the server's expiry of its lease.
// It takes every held lock's Deadline first, then reads each lease's
// PEXPIRETIME from the server directly (not through the link): both only
// move forward, so a deadline read before the expiry can only be
// compared against an expiry as late or later. A lease already gone from
// the server (expired, -2) must have its deadline passed by the time it
// was read. It returns the number of locks checked.
func (m *manyLocks) deadlinesBeforeServerExpiry(t *testing.T) int {
	t.Helper()
	admin := newClient(t, m.Srv)
	type held struct {
		i        int
		deadline time.Time
	}
	var hs []held
	for i, lk := range m.Locks {
		if lk.Err() == nil {
			hs = append(hs, held{i, lk.Deadline()})
		}
	}
	cmds := make([]*redis.Cmd, len(hs))
	_, err := admin.Pipelined(dlocktest.Context(t), func(p redis.Pipeliner) error {
		for k, h := range hs {
			cmds[k] = p.Do(dlocktest.Context(t), "PEXPIRETIME", m.L.LockKey(m.Keys[h.i]))
		}
		return nil
	})
	read := time.Now()
	if err != nil {
		t.Fatalf("PEXPIRETIME of the leases: %v", err)
	}
	bad := 0
	for k, h := range hs {
		ms, err := cmds[k].Int64()
		var why string
		switch {
		case err != nil:
			why = err.Error()
		case ms == -1:
			why = "the lease has no expiry"
		case ms == -2 && h.deadline.After(read):
			why = fmt.Sprintf("the lease is gone from the server, its holder's deadline %v after that was seen", h.deadline.Sub(read))
		case ms >= 0 && h.deadline.After(time.UnixMilli(ms)):
			why = fmt.Sprintf("the holder's deadline is %v after the server's expiry", h.deadline.Sub(time.UnixMilli(ms)))
		}
		if why != "" {
			if bad++; bad <= 5 {
				t.Errorf("lock %s: %s", m.Keys[h.i], why)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d held locks: the holder's deadline is not before the server's expiry of its lease", bad, len(hs))
	}
	return len(hs)
}

// allLost waits for every lock's Lost() (the link is stalled: no renewal
// answers), bounded by dlocktest.HangTimeout.
func (m *manyLocks) allLost(t *testing.T) {
	t.Helper()
	start := time.Now()
	end := time.After(dlocktest.HangTimeout)
	for i, lk := range m.Locks {
		select {
		case <-lk.Lost():
		case <-end:
			t.Fatalf("hang: lock %s not lost within %v of a stalled link (deadline %v ago)", m.Keys[i], dlocktest.HangTimeout, time.Since(lk.Deadline()))
		}
	}
	t.Logf("every Lost() closed %v after the stall", time.Since(start).Round(time.Millisecond))
}

// TestRenewalBatch_StalledLink_DeadlinesBeforeServerExpiry: a few hundred
// locks of one Locker are renewed in batches (many renewals per round
// trip); when the link stalls, every holder's local deadline is at or
// before the server's expiry of its lease, and every Lost() closes (no
// renewal can answer). (The scale variants, thousands of locks, are
// TestManyLocks_StalledLink_DeadlinesBeforeServerExpiry and
// TestManyLocksSharedDeadline_StalledLink_DeadlinesBeforeServerExpiry.)
func TestRenewalBatch_StalledLink_DeadlinesBeforeServerExpiry(t *testing.T) {
	t.Parallel()
	const n = 300
	// Locks due within TTL/12 of each other are renewed together: the
	// longer the TTL, the more of the locks taken over a slow machine's
	// acquisition phase share a batch.
	m := acquireMany(t, n, 3*time.Second)
	c := m.Hook.waitRenewed(t, 2*n) // every lock renewed twice, on average
	t.Logf("%d renewals in %d pipelines", c.Evalsha+c.Eval, c.Pipes)
	if c.Pipes*5 > c.Evalsha+c.Eval {
		t.Errorf("renewals not batched: %d renewals in %d round trips", c.Evalsha+c.Eval, c.Pipes)
	}
	m.Link.Stall()
	if checked := m.deadlinesBeforeServerExpiry(t); checked < n/2 {
		t.Logf("only %d of %d locks were still held at the stall", checked, n)
	}
	m.allLost(t)
}

// TestManyLocks_StalledLink_DeadlinesBeforeServerExpiry: thousands of
// locks on one Locker, and the link stalls soon after they were taken
// (their deadlines still spread out): every holder's local deadline is at
// or before the server's expiry of its lease, and every Lost() closes.
// With 6000 locks under -race, another client polling the keys once got
// one while its holder's Lost() was still open, 31-120ms after the
// holder's deadline (a scan of every lock per watchdog pass, a goroutine
// per lost lock); that the watchdog loses each lock by its deadline is
// now tested on a fake clock (watchdog_stream_internal_test.go), and here
// the order of the deadline and the server's expiry, which holds however
// starved the process is.
//
// Long (make test-long): scale, 6000 locks (RT_N overrides).
func TestManyLocks_StalledLink_DeadlinesBeforeServerExpiry(t *testing.T) {
	testserver.Long(t, "scale: 6000 locks on one Locker")
	m := acquireMany(t, envInt("RT_N", 6000), time.Second)
	m.Link.Stall()
	t.Logf("%d locks still held at the stall checked against the server's expiry", m.deadlinesBeforeServerExpiry(t))
	m.allLost(t)
}

// TestManyLocksSharedDeadline_StalledLink_DeadlinesBeforeServerExpiry: as
// TestManyLocks_StalledLink_DeadlinesBeforeServerExpiry, but the link
// stalls only after a few renewal rounds, by which time the batches have
// coalesced and thousands of locks share one local deadline (the
// watchdog's hardest case: it must start losing them early by what losing
// them all costs).
//
// Long (make test-long): scale, 6000 locks (RT_N overrides).
func TestManyLocksSharedDeadline_StalledLink_DeadlinesBeforeServerExpiry(t *testing.T) {
	testserver.Long(t, "scale: 6000 locks on one Locker sharing a deadline")
	n := envInt("RT_N", 6000)
	m := acquireMany(t, n, time.Second)
	c := m.Hook.waitRenewed(t, 3*n) // three renewals a lock, on average
	deadlines := map[int64]int{}
	for _, lk := range m.Locks {
		if lk.Err() == nil {
			deadlines[lk.Deadline().UnixMilli()]++
		}
	}
	var groups []int
	for _, k := range deadlines {
		groups = append(groups, k)
	}
	slices.Sort(groups)
	slices.Reverse(groups)
	reasons := map[string]int{}
	for _, lk := range m.Locks {
		if err := lk.Err(); err != nil {
			reasons[err.Error()[strings.LastIndex(err.Error(), ":")+1:]]++
		}
	}
	t.Logf("lost before the stall: %v", reasons)
	t.Logf("before the stall: %d renewals in %d pipelines; %d distinct deadline ms, largest groups %v", c.Evalsha+c.Eval, c.Pipes, len(deadlines), groups[:min(5, len(groups))])
	m.Link.Stall()
	t.Logf("%d locks still held at the stall checked against the server's expiry", m.deadlinesBeforeServerExpiry(t))
	m.allLost(t)
}

// TestRenewalBatch_NoScript_ResentInOnePipeline: a renewal batch that
// meets NOSCRIPT (the refresh script is not in the server's cache: the
// first renewal ever on a fresh server, or after a restart, a failover or
// SCRIPT FLUSH) is resent as EVAL in one pipeline, not one request per
// lock: with a few hundred locks and a round trip of a millisecond or
// two, one request per lock outlived the locks' deadlines (49-129 of 500
// lost). Asserted on the round trips: every pipeline that met NOSCRIPT is
// followed by one pipeline of EVALs, as many as there were NOSCRIPTs.
func TestRenewalBatch_NoScript_ResentInOnePipeline(t *testing.T) {
	t.Parallel()
	const n = 300
	m := acquireMany(t, n, 2*time.Second)
	admin := newClient(t, m.Srv)
	phase := func(name string, before renewalCounts) {
		t.Helper()
		// The next renewal batch meets NOSCRIPT (renewals go on every
		// TTL/3); its resend follows the pipeline that met it.
		var c renewalCounts
		for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
			if c = m.Hook.counts(); c.NoScript > before.NoScript && c.Eval == c.NoScript && c.EvalPipes == c.NoScriptPipes {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("%s: %d renewals met NOSCRIPT in %d pipelines (%d before); resent within %v: %d EVALs in %d pipelines (want as many, in as many)", name, c.NoScript, c.NoScriptPipes, before.NoScript, dlocktest.HangTimeout, c.Eval, c.EvalPipes)
			}
		}
		t.Logf("%s: %+v", name, c)
	}
	phase("fresh server", renewalCounts{}) // the hook counted from the start
	before := m.Hook.counts()
	if err := admin.ScriptFlush(dlocktest.Context(t)).Err(); err != nil { // a restart / failover loses the script cache
		t.Fatal(err)
	}
	phase("after SCRIPT FLUSH", before)
}

// envInt is the integer in environment variable name, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// TestRelease_RetryAfterLostReplyAndTwoHandovers_ReportsReleased: the
// holder's release takes effect but its reply is lost (Release returns a
// network error). The key then changes hands twice. The caller retries
// Release, as the docs invite ("after a network error the next call
// retries"; "reports a release whose reply was lost as released"). The
// retry must not report the lock lost: it was released by us, cleanly.
//
// The holder's client does not resend a request itself (MaxRetries -1):
// a default client resends the script on a new connection after a short
// random backoff, and the resend, answered, would hide the lost reply.
func TestRelease_RetryAfterLostReplyAndTwoHandovers_ReportsReleased(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(p.Heal)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c)
	other := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)

	// Warm up: the scripts are cached, so the lost reply is the release's.
	w, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	p.LoseNextReply()
	err1 := lk.Release(dlocktest.Context(t))
	t.Logf("first Release: %v", err1)
	if err1 == nil {
		t.Fatal("the release whose reply was lost succeeded: the client resent it")
	}
	if v, err := newClient(t, srv).Get(dlocktest.Context(t), l.LockKey(key)).Result(); err != nil || !strings.HasPrefix(v, "|") {
		t.Fatalf("the key holds %q (%v) after the release whose reply was lost, want its release marker", v, err)
	}
	// The release did take effect: the key is free. Two hand-overs.
	for i := 0; i < 2; i++ {
		o, err := other.TryAcquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("hand-over %d: %v", i, err)
		}
		t.Logf("hand-over %d: token %d (ours was %d)", i, o.Token(), lk.Token())
		if err := o.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	err2 := lk.Release(dlocktest.Context(t))
	if errors.Is(err2, dlock.ErrLockLost) || errors.Is(err2, dlock.ErrNotHeld) {
		t.Fatalf("retried Release of a lock we released cleanly reports it lost: %v", err2)
	}
	if err2 != nil {
		t.Fatalf("retried Release: %v", err2)
	}
}

// TestTryAcquire_ReservedKey_ReportsReservation: while a release reserves
// the key for the waiter it woke, a TryAcquire by someone else says that
// the key is reserved, for which waiter, and for how long. Symptom:
// ErrNotAcquired naming an empty holder and no metadata ("not acquired",
// by nobody).
//
// The reservation lasts HandoffReserve (100ms) on the server's clock, and
// a TryAcquire sent later gets the key. So the test checks the
// reservation the release wrote (for the waiter queued, ending within
// 100ms of the server's time), then moves its end a minute on (the
// marker's <until ms>, nothing else): the TryAcquire that follows comes
// within the reservation however slow the machine.
func TestTryAcquire_ReservedKey_ReportsReservation(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	l1 := redislock.New(newClient(t, srv))
	px := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(px.Heal)
	c2 := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { c2.Close() })
	l2 := redislock.New(c2)
	l3 := redislock.New(newClient(t, srv))
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
	px.Stall() // the waiter's host hangs: it does not take the key
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	ctx := dlocktest.Context(t)
	marker, err := admin.Get(ctx, l1.LockKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Split(marker, "|")
	var until int64
	if len(f) == 4 {
		until, err = strconv.ParseInt(f[3], 10, 64)
	}
	if len(f) != 4 || f[1] != strconv.FormatUint(lk.Token(), 10) || f[2] != ids[0] || err != nil {
		t.Fatalf("after the release the key holds %q, want a marker of token %d reserving it for waiter %s", marker, lk.Token(), ids[0])
	}
	if left := time.Duration(until-now.UnixMilli()) * time.Millisecond; left > redisproto.HandoffReserve {
		t.Fatalf("the reservation ends %v after the server's time, want at most %v", left, redisproto.HandoffReserve)
	}
	f[3] = strconv.FormatInt(now.Add(time.Minute).UnixMilli(), 10)
	if err := admin.SetArgs(ctx, l1.LockKey(key), strings.Join(f, "|"), redis.SetArgs{KeepTTL: true}).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = l3.TryAcquire(ctx, key)
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
	if h.TTL <= 0 || h.TTL > time.Minute {
		t.Fatalf("TTL %v, want the reservation left, within (0, 1m]", h.TTL)
	}
	if msg := err.Error(); !strings.Contains(msg, "reserved it for waiter "+ids[0]) {
		t.Fatalf("message %q does not name the reservation", msg)
	}
	// The reservation is the waiter's: healed, it gets the key.
	px.Heal()
	if err := <-waiting; err != nil {
		t.Fatalf("the waiter the key was reserved for: %v", err)
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
