package redislock_test

import (
	"context"
	"errors"
	"net"
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

// The Sentinel tests run redislock on a default go-redis failover client
// (redis.NewFailoverClient with only the master name, the sentinels and the
// passwords set), against a real primary, two replicas and three
// redis-sentinel processes (internal/testserver.StartSentinel).

// failoverOptions are the options a user of s would write: the master name,
// the sentinels' addresses and the passwords, nothing else.
func failoverOptions(s *testserver.Sentinel) *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:       s.Master(),
		SentinelAddrs:    s.Addrs(),
		Password:         s.Servers[0].Password(),
		SentinelPassword: s.Sentinels[0].Password(),
	}
}

// newFailoverClient is a failover client built from opt, closed at cleanup.
func newFailoverClient(t testing.TB, opt *redis.FailoverOptions) *redis.Client {
	c := redis.NewFailoverClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// sentinelClient is a default failover client on s.
func sentinelClient(t testing.TB, s *testserver.Sentinel) *redis.Client {
	return newFailoverClient(t, failoverOptions(s))
}

// viaProxy makes the failover client's connections to the data server at
// target go through p (test plumbing: the client still discovers the master
// through the sentinels; only the dial to that address is redirected).
// Connections to the sentinels are not redirected.
func viaProxy(opt *redis.FailoverOptions, target string, p *testserver.Proxy) {
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == target {
			addr = p.Addr()
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// conformanceDownAfter is the sentinels' down-after for the deployments
// that must not fail over (every one but the failover tests', which fail
// over when they say so): the conformance suite's Pause (SIGSTOP of the
// primary) lasts a few seconds at most on a healthy machine and
// HangTimeout (30s) at worst, and a starved machine can keep a primary
// from answering the sentinels' PINGs for a while; a failover then would
// turn a paused or slow server into a new primary without the keys, which
// is not what these tests are about (failover is tested on its own).
const conformanceDownAfter = 2 * dlocktest.HangTimeout

func TestSentinelConformance(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithDownAfter(conformanceDownAfter))
	primary := s.Primary()
	admin := newClient(t, primary)
	proxied := func(t testing.TB) (dlock.Locker, *testserver.Proxy) {
		p := testserver.StartProxy(t, primary.Addr())
		opt := failoverOptions(s)
		viaProxy(opt, primary.Addr(), p)
		return redislock.New(newFailoverClient(t, opt)), p
	}
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL: conformanceTTL,
		New: func(t testing.TB) dlock.Locker { return redislock.New(sentinelClient(t, s)) },
		Expire: func(t testing.TB, key string) {
			if err := admin.Del(context.Background(), redislock.New(admin).LockKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Faults: &dlocktest.Faults{
			// A default failover client whose connections to the primary
			// go through a fault proxy.
			New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				return proxied(t)
			},
			// The same, the proxy stopped by down (the sentinels still
			// name the primary behind it).
			Down: func(t testing.TB) (dlock.Locker, func()) {
				l, p := proxied(t)
				return l, p.Stop
			},
			// SIGSTOP of the primary, shorter than conformanceDownAfter:
			// the sentinels keep it as the primary.
			Pause: func(t testing.TB, keys ...string) func() {
				primary.Pause()
				return primary.Resume
			},
		},
	})
	if p := s.Primary(); p != primary {
		t.Fatalf("the sentinels failed over to %s during the suite: its Pause tests did not test a paused primary", p.Addr())
	}
}

// The same, with passwords on the data servers and on the sentinels (a
// shorter run: the locking semantics do not depend on them; reaching the
// master through authenticated sentinels does).
func TestSentinelWithPasswords(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithDownAfter(conformanceDownAfter),
		testserver.WithDataPassword("data-pw-1"), testserver.WithSentinelPassword("sentinel-pw-1"))
	ctx := dlocktest.Context(t)
	l1, l2 := redislock.New(sentinelClient(t, s)), redislock.New(sentinelClient(t, s))
	key := dlocktest.Key(t)
	lk, err := l1.Acquire(ctx, key, dlock.WithMetadata("job", "sentinel"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l2.TryAcquire(ctx, key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Owner != lk.Owner() {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	infos, err := l2.List(ctx, "dlocktest.")
	if err != nil || len(infos) != 1 || infos[0].Key != key || infos[0].Holders[0].Metadata["job"] != "sentinel" {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lk2, err := l2.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token %d after %d", lk2.Token(), lk.Token())
	}
	if err := lk2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The lease is on the primary the sentinels name, and replicated.
	if v, err := s.Primary().Do("EXISTS", l1.LockKey(key)); err != nil || v != "1" {
		t.Fatalf("release marker on the primary: %q %v", v, err)
	}
}

// badSentinelDeadline is the context of a call that cannot be answered
// (nothing listens, or the sentinels hang): it must return by then, with
// dlocktest.OverrunBound to spare. A call that is answered with an error
// (a wrong password, an unknown master) gets dlocktest.HangTimeout: it
// returns as soon as the sentinels answer, which on a loaded machine may
// take longer than badSentinelDeadline, and the error must name the
// cause.
const badSentinelDeadline = 2 * time.Second

// failsInTime runs TryAcquire, Acquire and List on l, each with a context
// of deadline, and checks that each returns an error (never "held by
// someone") by that deadline. It returns the errors by path.
func failsInTime(t *testing.T, l dlock.Locker, key string, deadline time.Duration) map[string]error {
	t.Helper()
	errs := map[string]error{}
	for _, path := range []string{"TryAcquire", "Acquire", "List"} {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		var err error
		switch path {
		case "TryAcquire":
			var lk *dlock.Lock
			if lk, err = l.TryAcquire(ctx, key); err == nil {
				lk.Release(context.Background())
			}
		case "Acquire":
			var lk *dlock.Lock
			if lk, err = l.Acquire(ctx, key); err == nil {
				lk.Release(context.Background())
			}
		case "List":
			_, err = l.(*redislock.Locker).List(ctx, "")
		}
		took := time.Since(start)
		cancel()
		t.Logf("%s: %v after %v", path, err, took.Round(time.Millisecond))
		if err == nil {
			t.Errorf("%s succeeded", path)
		}
		if errors.Is(err, dlock.ErrNotAcquired) {
			t.Errorf("%s: an unreachable master reported as a held key: %v", path, err)
		}
		if over := took - deadline; over > dlocktest.OverrunBound {
			t.Errorf("%s overran its %v context by %v", path, deadline, over)
		}
		errs[path] = err
	}
	return errs
}

// wantText checks that every error names the cause: one of texts appears
// in it, or, with unavailable, it may instead wrap dlock.ErrUnavailable
// (no answer by the deadline: go-redis retries a refused dial until the
// context ends and then reports the context's error, not the refusal).
func wantText(t *testing.T, what string, errs map[string]error, unavailable bool, texts ...string) {
	t.Helper()
	for path, err := range errs {
		if err == nil {
			continue
		}
		ok := unavailable && errors.Is(err, dlock.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded)
		for _, s := range texts {
			ok = ok || strings.Contains(err.Error(), s)
		}
		if !ok {
			t.Errorf("%s, %s: %v, want one of %q", what, path, err, texts)
		}
	}
}

// TestSentinelBadInput: a failover client with one thing wrong fails
// clearly, on TryAcquire, Acquire and List, by the context's deadline, and
// is never told the key is held. The cases share one healthy deployment
// (their faults are in the client's options); unreachable sentinels are
// free loopback ports nothing listens on.
func TestSentinelBadInput(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithDownAfter(conformanceDownAfter),
		testserver.WithDataPassword("right-data-pw"), testserver.WithSentinelPassword("right-sentinel-pw"))
	key := dlocktest.Key(t)
	// The cases run in parallel, as subtests of one group that ends before
	// the right options are tried.
	t.Run("Cases", func(cases *testing.T) { sentinelBadInputCases(cases, s, key) })
	// The right options, after all that: the key was never taken.
	lk, err := redislock.New(sentinelClient(t, s)).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("right options: %v", err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// sentinelBadInputCases runs TestSentinelBadInput's cases on s, each
// failing to take key.
func sentinelBadInputCases(cases *testing.T, s *testserver.Sentinel, key string) {
	for _, tc := range []struct {
		name string
		// bad breaks the right options.
		bad func(t *testing.T, opt *redis.FailoverOptions)
		// unavailable: an error wrapping dlock.ErrUnavailable and the
		// context's error (no answer by the deadline) names the cause too.
		unavailable bool
		// texts: one of them in the error names the cause.
		texts []string
	}{
		{"UnknownMaster", func(_ *testing.T, opt *redis.FailoverOptions) { opt.MasterName = "nosuchmaster" },
			false, []string{"redis: nil"}},
		{"SentinelsUnreachable", func(t *testing.T, opt *redis.FailoverOptions) {
			opt.SentinelAddrs = nil
			for range 3 {
				opt.SentinelAddrs = append(opt.SentinelAddrs, "127.0.0.1:"+strconv.Itoa(testserver.FreePort(t)))
			}
		}, true, []string{"connection refused"}},
		{"WrongSentinelPassword", func(_ *testing.T, opt *redis.FailoverOptions) { opt.SentinelPassword = "wrong-sentinel-pw" },
			false, []string{"WRONGPASS"}},
		{"NoSentinelPassword", func(_ *testing.T, opt *redis.FailoverOptions) { opt.SentinelPassword = "" },
			false, []string{"NOAUTH"}},
		{"WrongDataPassword", func(_ *testing.T, opt *redis.FailoverOptions) { opt.Password = "wrong-data-pw" },
			false, []string{"WRONGPASS"}},
	} {
		cases.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opt := failoverOptions(s)
			tc.bad(t, opt)
			deadline := dlocktest.HangTimeout
			if tc.unavailable {
				deadline = badSentinelDeadline
			}
			errs := failsInTime(t, redislock.New(newFailoverClient(t, opt)), key, deadline)
			wantText(t, tc.name, errs, tc.unavailable, tc.texts...)
		})
	}
}

// One sentinel hangs (SIGSTOP) while the others answer: a fresh client
// still reaches the master through them, on every path.
//
// go-redis asks every sentinel at once and takes the first answer, but
// waits for all of them before it dials the master: a hung sentinel holds
// a fresh default client's first connection for its handshake's read
// timeout (5s by default), whatever the context. A call with a shorter
// context then fails by its deadline (dlock.ErrUnavailable); one with a
// longer context succeeds. Later connections ask the sentinel that
// answered.
func TestSentinelOnePaused(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithDownAfter(conformanceDownAfter))
	s.Sentinels[0].Pause()
	defer s.Sentinels[0].Resume()
	key := dlocktest.Key(t)

	// A short context: an answer or ErrUnavailable, by the deadline.
	short, cancel := context.WithTimeout(dlocktest.Context(t), badSentinelDeadline)
	start := time.Now()
	lk, err := redislock.New(sentinelClient(t, s)).TryAcquire(short, key)
	took := time.Since(start)
	cancel()
	t.Logf("TryAcquire with a %v context, one sentinel paused: %v after %v", badSentinelDeadline, err, took.Round(time.Millisecond))
	if over := took - badSentinelDeadline; over > dlocktest.OverrunBound {
		t.Fatalf("TryAcquire overran its %v context by %v", badSentinelDeadline, over)
	}
	if err == nil {
		lk.Release(dlocktest.Context(t))
	} else if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("TryAcquire with a short context: %v, want success or ErrUnavailable", err)
	}

	// The suite's context: it succeeds, on every path.
	start = time.Now()
	l, other := redislock.New(sentinelClient(t, s)), redislock.New(sentinelClient(t, s))
	lk, err = l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("Acquire with one of three sentinels paused: %v", err)
	}
	t.Logf("Acquire with one sentinel paused: %v", time.Since(start).Round(time.Millisecond))
	if _, err := other.TryAcquire(dlocktest.Context(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of the held key by a fresh client: %v", err)
	}
	infos, err := other.List(dlocktest.Context(t), key)
	if err != nil || len(infos) != 1 || infos[0].Holders[0].Token != lk.Token() {
		t.Fatalf("List by a fresh client = %+v, %v", infos, err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	lk2, err := other.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
	if err := lk2.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// TestSentinelAllPaused_ConnectedClientKeepsWorking: every sentinel hangs
// (SIGSTOP) while the primary is fine. A fresh client cannot discover the
// master: a clear error by its deadline, on every path. A client connected
// before the sentinels hung keeps working on the connections it has: its
// held lock is renewed (a renewal sent after the sentinels hung
// succeeds), and it acquires, lists and releases.
func TestSentinelAllPaused_ConnectedClientKeepsWorking(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithDownAfter(conformanceDownAfter))
	c := sentinelClient(t, s)
	l := redislock.New(c)
	const ttl = 2 * time.Second
	acquired := time.Now()
	held, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// Warm the client's pools: a few connections in use at once, and the
	// pipeline pool of the watchdog's renewals (one renewal done).
	warm := make(chan error, 4)
	for i := 0; i < cap(warm); i++ {
		go func() {
			lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
			if err == nil {
				err = lk.Release(dlocktest.Context(t))
			}
			warm <- err
		}()
	}
	for i := 0; i < cap(warm); i++ {
		if err := <-warm; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.List(dlocktest.Context(t), ""); err != nil {
		t.Fatal(err)
	}
	renewedAfter(t, held, acquired)

	for _, sn := range s.Sentinels {
		sn.Pause()
		defer sn.Resume()
	}
	paused := time.Now()
	m := dlocktest.StartStallMeter(paused)
	defer m.Stop()
	// premiseGone reports that the test process stalled long enough for
	// one of the client's reads to time out (go-redis's default read
	// timeout, 3s): the connection is then closed, and a new one needs
	// the hung sentinels, so "the connections it has" no longer holds.
	premiseGone := func(what string, err error) bool {
		m.Stop()
		if m.Longest() >= 3*time.Second {
			t.Logf("%s: %v, after this process stalled %v at once: a connection may have timed out", what, err, m.Longest().Round(time.Millisecond))
			return true
		}
		return false
	}
	key := dlocktest.Key(t)
	errs := failsInTime(t, redislock.New(sentinelClient(t, s)), key, badSentinelDeadline)
	wantText(t, "all sentinels paused, fresh client", errs, true, "i/o timeout")

	renewedAfter(t, held, paused)
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		if premiseGone("TryAcquire by the connected client", err) {
			return
		}
		t.Fatalf("TryAcquire by the connected client: %v", err)
	}
	infos, err := l.List(dlocktest.Context(t), key)
	if err != nil || len(infos) != 1 || infos[0].Holders[0].Token != lk.Token() {
		if err != nil && premiseGone("List by the connected client", err) {
			return
		}
		m.Stop()
		t.Fatalf("List by the connected client = %+v, %v (the process stalled at most %v at once)", infos, err, m.Longest().Round(time.Millisecond))
	}
	m.Stop()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release by the connected client: %v", err)
	}
	if err := held.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release of the renewed lock: %v", err)
	}
}

// When the client itself gives up at the deadline (go-redis's dial loop,
// retrying sentinels that refuse connections, returns the context's error)
// a moment before dlock would abandon the call, List and the Guard still
// report "no answer" (dlock.ErrUnavailable joined with the context's
// error), as Acquire does: the outcome is the same, the wording must be.
// The race is decided per call; repeated calls catch it.
func TestSentinelClientDeadlineIsUnavailable(t *testing.T) {
	t.Parallel()
	opt := &redis.FailoverOptions{MasterName: testserver.SentinelMaster, SentinelAddrs: []string{
		"127.0.0.1:" + strconv.Itoa(testserver.FreePort(t)),
		"127.0.0.1:" + strconv.Itoa(testserver.FreePort(t)),
	}}
	c := newFailoverClient(t, opt)
	l, g := redislock.New(c), redislock.NewGuard(c)
	f := dlock.Fence{Token: 1, Owner: "o"}
	for i := 0; i < 30; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		_, lerr := l.List(ctx, "")
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), 150*time.Millisecond)
		_, _, gerr := g.Get(ctx, "r", f, "v")
		cancel()
		for what, err := range map[string]error{"List": lerr, "Guard.Get": gerr} {
			if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s, attempt %d, sentinels refusing: %v, want ErrUnavailable and the context's error", what, i, err)
			}
		}
	}
}
