package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
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

// Symptom: with 6000 locks another client got a lock 31-120ms after its holder's deadline, Lost() still open.
// TestManyLocks_StalledLink_DeadlinesBeforeServerExpiry: thousands of
// locks on one Locker, and the link stalls soon after they were taken
// (their deadlines still spread out): every holder's local deadline is at
// or before the server's expiry of its lease, and every Lost() closes.
// That the watchdog loses each lock by its deadline is tested on a fake
// clock (watchdog_stream_internal_test.go in package dlock); this test
// checks the order of the deadline and the server's expiry, which holds
// however starved the process is.
//
// Long (make test-long): scale, 6000 locks (SCALE_N overrides).
func TestManyLocks_StalledLink_DeadlinesBeforeServerExpiry(t *testing.T) {
	testserver.Long(t, "scale: 6000 locks on one Locker")
	m := acquireMany(t, envInt("SCALE_N", 6000), time.Second)
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
// Long (make test-long): scale, 6000 locks (SCALE_N overrides).
func TestManyLocksSharedDeadline_StalledLink_DeadlinesBeforeServerExpiry(t *testing.T) {
	testserver.Long(t, "scale: 6000 locks on one Locker sharing a deadline")
	n := envInt("SCALE_N", 6000)
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

// Symptom: renewals that met NOSCRIPT, resent one request per lock, outlived the locks' deadlines (49-129 of 500 lost).
// TestRenewalBatch_NoScript_ResentInOnePipeline: a renewal batch that
// meets NOSCRIPT (the refresh script is not in the server's cache: the
// first renewal ever on a fresh server, or after a restart, a failover or
// SCRIPT FLUSH) is resent as EVAL in one pipeline, not one request per
// lock. Asserted on the round trips: every pipeline that met NOSCRIPT is
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

// A release leaves the last token in the key as a marker with a bounded
// lifetime: the next holder's token is above it, and a service that locks
// many distinct keys does not keep them forever.
func TestReleaseMarker(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	l := redislock.New(c)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	v, _ := c.Get(dlocktest.Context(t), l.LockKey(key)).Result()
	if v != "|"+strconv.FormatUint(lk.Token(), 10) {
		t.Fatalf("marker = %q, want |%d", v, lk.Token())
	}
	pttl, err := c.PTTL(dlocktest.Context(t), l.LockKey(key)).Result()
	if err != nil || pttl <= 0 || pttl > redislock.FenceRetention {
		t.Fatalf("marker PTTL = %v, %v", pttl, err)
	}
	if infos, _ := l.List(dlocktest.Context(t), key); len(infos) != 0 {
		t.Fatalf("a released key is listed: %+v", infos)
	}
	lk2, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Release(dlocktest.Context(t))
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token after the marker = %d, want above %d", lk2.Token(), lk.Token())
	}
}

// TestLostWhenValueChanged_ReportsNotHeld: someone overwrites the lock's
// key: the holder's next renewal finds it and closes Lost() with
// ErrNotHeld, and the holder's release leaves the intruder's value alone.
// (A holder starved past its deadline before that renewal loses the lock
// by its deadline instead: correct too, and told apart.)
func TestLostWhenValueChanged_ReportsNotHeld(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	l := redislock.New(c)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Someone overwrites the key (another owner, a buggy script).
	if err := c.Set(dlocktest.Context(t), l.LockKey(key), "intruder|1|{}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Lost() not closed after the value changed")
	}
	switch {
	case !errors.Is(lk.Err(), dlock.ErrLockLost):
		t.Fatalf("Err() = %v, want ErrLockLost", lk.Err())
	case errors.Is(lk.Err(), dlock.ErrNotHeld):
	case time.Now().Before(lk.Deadline()):
		t.Fatalf("Err() = %v before the deadline, want ErrNotHeld", lk.Err())
	default:
		t.Logf("lost by the deadline before a renewal found the key changed (a starved machine): %v", lk.Err())
	}
	// The intruder's key is untouched by the loser's cleanup and release.
	if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release = %v", err)
	}
	if v, _ := c.Get(dlocktest.Context(t), l.LockKey(key)).Result(); v != "intruder|1|{}" {
		t.Fatalf("intruder's value = %q", v)
	}
}

// Held locks listen for break notices on one pattern subscription per
// Locker: with 300 locks held, the server has one pattern subscriber and
// no break channel subscribed, and the process runs about as many
// goroutines as before; a break of one lock is still heard (its Lost
// closes) and the others stay held.
// Symptom: every lock held past 100 ms subscribed a channel of its own and ran a goroutine for as long as it was held.
func TestBind_ManyHeldLocks_ListenOnOneSubscription(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	l := redislock.New(newClient(t, srv))
	ctx := dlocktest.Context(t)
	const n = 300
	base := dlocktest.Key(t)
	before := runtime.NumGoroutine()
	locks := make([]*dlock.Lock, n)
	for i := range locks {
		lk, err := l.Acquire(ctx, fmt.Sprintf("%s-%d", base, i), dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(context.Background())
		locks[i] = lk
	}
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
		pats, err := admin.PubSubNumPat(ctx).Result()
		if err == nil && pats == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("hang: %d pattern subscriptions (%v), want 1", pats, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // past the delay a lock once waited before it subscribed
	if chans, err := admin.PubSubChannels(ctx, l.LockKey(base+"-*")+":b").Result(); err != nil || len(chans) != 0 {
		t.Errorf("break channels subscribed: %d (%v), want none", len(chans), err)
	}
	if added := runtime.NumGoroutine() - before; added > n/10 {
		t.Errorf("%d goroutines added for %d held locks, want a few at most", added, n)
	}
	other := redislock.New(newClient(t, srv))
	if _, err := other.Break(ctx, locks[7].Key(), ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-locks[7].Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the broken lock was not told")
	}
	if err := locks[7].Err(); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("the broken lock: %v, want dlock.ErrNotHeld", err)
	}
	for i, lk := range locks {
		if i != 7 && lk.Err() != nil {
			t.Errorf("lock %d: %v after another's break", i, lk.Err())
		}
	}
}

// A prefix with glob characters still gets its break notices, and only
// its own: the pattern subscription escapes them.
// Symptom: a pattern built from the raw prefix would match other prefixes' channels, or none of its own.
func TestBind_GlobCharactersInPrefix_BreakHeard(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	ctx := dlocktest.Context(t)
	const prefix = `a*b?[c]\d`
	l := redislock.New(newClient(t, srv), redislock.WithPrefix(prefix))
	other := redislock.New(newClient(t, srv), redislock.WithPrefix("aXb!cd"))
	key := dlocktest.Key(t)
	// No renewal: only the break notice can tell the lock before its
	// deadline.
	mine, err := l.Acquire(ctx, key, dlock.WithTTL(5*time.Minute), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Release(context.Background())
	theirs, err := other.Acquire(ctx, key, dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Release(context.Background())
	if _, err := redislock.New(newClient(t, srv), redislock.WithPrefix(prefix)).Break(ctx, key, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-mine.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the broken lock was not told")
	}
	if err := theirs.Err(); err != nil {
		t.Errorf("a lock under another prefix: %v", err)
	}
}

// breakAfterGrant is a hook that, once, right after an acquisition's
// script has answered (the lock granted, not yet handed to the caller),
// runs breakIt and waits for it.
type breakAfterGrant struct {
	once    sync.Once
	breakIt func()
}

func (h *breakAfterGrant) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *breakAfterGrant) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *breakAfterGrant) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); err == nil && (name == "evalsha" || name == "eval") && h.breakIt != nil {
			h.once.Do(h.breakIt)
		}
		return err
	}
}

// breakBeforeBind waits until l's break subscription is up (l holds a
// lock already), then arms hook to break key (every holder) right after
// l's next acquisition script answers, and to return once the notice is
// out and l's reader has had the time to take it: before the lock it is
// for listens.
func breakBeforeBind(t *testing.T, srv *testserver.Redis, hook *breakAfterGrant, key string) {
	t.Helper()
	ctx := dlocktest.Context(t)
	admin := newClient(t, srv)
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
		if n, err := admin.PubSubNumPat(ctx).Result(); err == nil && n == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("hang: the Locker's break subscription never came up")
		}
	}
	watcher := admin.PSubscribe(ctx, "*:b")
	t.Cleanup(func() { watcher.Close() })
	if _, err := watcher.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	breaker := redislock.New(newClient(t, srv))
	hook.breakIt = func() {
		if _, err := breaker.Break(ctx, key, ""); err != nil {
			t.Error(err)
			return
		}
		// The notice is out (the server wrote it to every subscriber).
		if _, err := watcher.ReceiveMessage(ctx); err != nil {
			t.Error(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLost waits (bounded by dlocktest.HangTimeout) for each lock's
// Lost() and checks its error wraps dlock.ErrNotHeld.
func waitLost(t *testing.T, locks map[string]*dlock.Lock) {
	t.Helper()
	for name, lk := range locks {
		select {
		case <-lk.Lost():
		case <-time.After(dlocktest.HangTimeout):
			t.Fatalf("hang: %s was not told of the break", name)
		}
		if err := lk.Err(); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("%s: Err %v, want dlock.ErrNotHeld", name, err)
		}
	}
}

// A break that comes between a lock's grant and the moment it listens
// (its Locker's break subscription confirmed long before, so no check of
// every lock is coming) still closes its Lost(): the notice heard
// meanwhile makes the lock read its key when it starts listening.
// Symptom: such a break was heard by nobody, and the holder learned of it at its next renewal.
func TestBind_BreakBetweenGrantAndBind_LostCloses(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	ctx := dlocktest.Context(t)
	c := newClient(t, srv)
	hook := &breakAfterGrant{}
	c.AddHook(hook)
	l := redislock.New(c)
	other, err := l.Acquire(ctx, dlocktest.Key(t), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(context.Background())
	key := dlocktest.Key(t)
	breakBeforeBind(t, srv, hook, key)
	// No renewal: only a break notice can tell the lock before its
	// deadline.
	lk, err := l.Acquire(ctx, key, dlock.WithTTL(5*time.Minute), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	waitLost(t, map[string]*dlock.Lock{"the lock broken before it listened": lk})
}

// A break of every holder of a shared key, coming between a reader's
// grant and the moment it listens, reaches that reader too, not only the
// reader of the same Locker that was listening already.
// Symptom: the notice went to the listening sibling only, and the new reader learned of the break at its next renewal.
func TestBind_BreakBetweenGrantAndBindWithSiblingHolder_LostCloses(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	ctx := dlocktest.Context(t)
	c := newClient(t, srv)
	hook := &breakAfterGrant{}
	c.AddHook(hook)
	l := redislock.New(c)
	key := dlocktest.Key(t)
	noRenewal := []dlock.Option{dlock.WithShared(), dlock.WithTTL(5 * time.Minute), dlock.WithAutoRefresh(false)}
	sibling, err := l.Acquire(ctx, key, noRenewal...)
	if err != nil {
		t.Fatal(err)
	}
	defer sibling.Release(context.Background())
	breakBeforeBind(t, srv, hook, key)
	lk, err := l.Acquire(ctx, key, noRenewal...)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	waitLost(t, map[string]*dlock.Lock{"the sibling": sibling, "the new reader": lk})
}
