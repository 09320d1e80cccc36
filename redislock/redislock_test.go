package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func newClient(t testing.TB, srv *testserver.Redis) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Password()})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConformance(t *testing.T) {
	t.Parallel()
	conformance(t, testserver.StartRedis(t), 0)
}

// conformanceTTL is the suite's short lease (Harness.TTL) on every Redis
// deployment: 4 times the suite's default (500ms), so that a holder
// starved of CPU for a moment (the tests of four modules run at once on
// two cores, under the race detector) still renews in time: a renewal is
// due every TTL/3, and a lock is lost when none answered within the TTL.
const conformanceTTL = 2 * time.Second

// conformance runs the dlocktest suite through Lockers on srv configured
// by opts, on clients whose ReadTimeout is readTimeout (0: go-redis's
// default).
func conformance(t *testing.T, srv *testserver.Redis, readTimeout time.Duration, opts ...redislock.Option) {
	admin := newClient(t, srv)
	proxied := func(t testing.TB) (dlock.Locker, *testserver.Proxy) {
		p := testserver.StartProxy(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password(), ReadTimeout: readTimeout})
		t.Cleanup(func() { c.Close() })
		return redislock.New(c, opts...), p
	}
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL: conformanceTTL,
		// A break publishes a notice; holders check their keys at once.
		TellsBroken: true,
		New: func(t testing.TB) dlock.Locker {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Password(), ReadTimeout: readTimeout})
			t.Cleanup(func() { c.Close() })
			return redislock.New(c, opts...)
		},
		Expire: func(t testing.TB, key string) {
			if err := admin.Del(context.Background(), redislock.New(admin).LockKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Faults: &dlocktest.Faults{
			// A client (default, but for readTimeout) whose every
			// connection goes through a fault proxy.
			New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				return proxied(t)
			},
			// The same, the proxy stopped by down.
			Down: func(t testing.TB) (dlock.Locker, func()) {
				l, p := proxied(t)
				return l, p.Stop
			},
			Pause: func(t testing.TB, keys ...string) func() {
				srv.Pause()
				return srv.Resume
			},
		},
	})
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

func TestLostWhenServerPaused(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	const ttl = 400 * time.Millisecond
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	paused := time.Now()
	defer srv.Resume()
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Lost() not closed while the server was paused")
	}
	// The key cannot have expired on the server before Lost() closed: the
	// server is stopped, so its clock for this key starts after resume. We
	// can at least check the local deadline is before acquire + TTL.
	if !errors.Is(lk.Err(), dlock.ErrLockLost) {
		t.Fatalf("Err() = %v", lk.Err())
	}
	t.Logf("Lost() closed %v after SIGSTOP (ttl %v)", time.Since(paused).Round(time.Millisecond), ttl)
	srv.Resume()
	// After resume the lock becomes free again (cleanup or expiry).
	lk2, err := redislock.New(newClient(t, srv)).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token %d after %d", lk2.Token(), lk.Token())
	}
	lk2.Release(dlocktest.Context(t))
}

func TestTokenIncreasesAfterRestart(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	key := dlocktest.Key(t)
	l := redislock.New(newClient(t, srv))
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	before := lk.Token()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	srv.Restart() // no persistence: the fence counter is gone
	l2 := redislock.New(newClient(t, srv))
	lk2, err := l2.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Release(dlocktest.Context(t))
	if lk2.Token() <= before {
		t.Fatalf("token after restart %d <= before %d", lk2.Token(), before)
	}
}

func TestHolderInError(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithMetadata("job", "nightly"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(dlocktest.Context(t))
	_, err = redislock.New(newClient(t, srv)).TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("err = %v", err)
	}
	if len(na.Holders) != 1 {
		t.Fatalf("NotAcquiredError = %+v, want one holder", na)
	}
	if h := na.Holders[0]; h.Owner != lk.Owner() || h.Token != lk.Token() || h.Metadata["job"] != "nightly" || h.Metadata[dlock.MetaPID] == "" || h.TTL <= 0 {
		t.Fatalf("NotAcquiredError = %+v", na)
	}
	if !strings.Contains(err.Error(), "pid=") {
		t.Fatalf("message lacks holder: %v", err)
	}
	infos, err := l.List(dlocktest.Context(t), "dlocktest.")
	if err != nil || len(infos) != 1 || infos[0].Key != key || len(infos[0].Holders) != 1 || infos[0].Holders[0].Token != lk.Token() || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List = %+v, %v", infos, err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithPassword("s3cret"))
	ctx := dlocktest.Context(t)
	// nil clients, plain and typed.
	for _, l := range []*redislock.Locker{redislock.New(nil), redislock.New((*redis.Client)(nil)), redislock.New((*redis.ClusterClient)(nil))} {
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("nil client Acquire: %v", err)
		}
		if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("nil client TryAcquire: %v", err)
		}
		if _, err := l.List(ctx, ""); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("nil client List: %v", err)
		}
	}
	// Wrong password.
	bad := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "wrong"})
	defer bad.Close()
	_, err := redislock.New(bad).Acquire(ctx, "k")
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("wrong password: %v", err)
	}
	// Unreachable server: an error, not a hang, within the context.
	unreach := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testserver.FreePort(t)), MaxRetries: 1})
	defer unreach.Close()
	start := time.Now()
	_, err = redislock.New(unreach).Acquire(ctx, "k")
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("unreachable: %v", err)
	}
	t.Logf("unreachable server: %v after %v", err, time.Since(start).Round(time.Millisecond))
	// Right password works.
	good := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "s3cret"})
	defer good.Close()
	lk, err := redislock.New(good).Acquire(ctx, "k", dlock.WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(ctx)
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

func evalCalls(t *testing.T, c *redis.Client) int {
	info, err := c.Info(dlocktest.Context(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:calls=") {
			n, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(line, ",", 2)[0], "cmdstat_evalsha:calls="))
			return n
		}
	}
	return 0
}

// The reply to an acquisition is lost on a warm connection, so the script
// itself ran: go-redis sends it again on a new connection, and the repeat
// finds the lease of its own owner. It must be granted (the same lease),
// not reported as held by someone — a phantom that would keep everyone
// out for the TTL.
func TestLostAcquireReplyIsOwnLease(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.Heal)
	l := redislock.New(c)
	// Warm up: the connection is open and the server has the script.
	warm, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	key := dlocktest.Key(t)
	p.LoseNextReply()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire with its reply lost: %v", err)
	}
	defer lk.Release(context.Background())
	v, err := newClient(t, srv).Get(dlocktest.Context(t), l.LockKey(key)).Result()
	if err != nil || !strings.HasPrefix(v, lk.Owner()+"|"+strconv.FormatUint(lk.Token(), 10)+"|") {
		t.Fatalf("server holds %q (%v), want the lease of owner %s, token %d", v, err, lk.Owner(), lk.Token())
	}
}

// List returns by its context's deadline on a stalled link, where a default
// client waits for its read timeout and retries.
func TestListReturnsByDeadline(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.Heal)
	l := redislock.New(c)
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	p.Stall()
	const d = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err = l.List(ctx, "")
	over := time.Since(start) - d
	t.Logf("List on a stalled link: returned %v after its deadline: %v", over.Round(10*time.Microsecond), err)
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("List on a stalled link = %v, want ErrUnavailable and the deadline", err)
	}
	if over > dlocktest.OverrunBound {
		t.Fatalf("List overran its deadline by %v", over)
	}
	p.Heal()
	if infos, err := l.List(dlocktest.Context(t), ""); err != nil || len(infos) != 1 {
		t.Fatalf("List after heal = %+v, %v", infos, err)
	}
}
