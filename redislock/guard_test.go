package redislock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestGuardSuite runs the conformance suite of every guard. Each Guard has
// a client of its own; the second instance (guardtest.Shared) is another
// client on the same server, as another process would open it.
func TestGuardSuite(t *testing.T) {
	srv := testserver.StartRedis(t)
	newGuard := func(t *testing.T, opts ...driver.Option) guard.Guard {
		return redislock.NewGuard(newClient(t, srv), opts...)
	}
	guardtest.Run(t, newGuard, guardtest.Shared(func(t *testing.T, _ guard.Guard, opts ...driver.Option) guard.Guard {
		return newGuard(t, opts...)
	}), guardtest.Stallable(func(t *testing.T) (guard.Guard, func()) {
		p := testserver.StartProxy(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password()})
		t.Cleanup(func() { c.Close() })
		t.Cleanup(p.Heal) // before the client closes
		return redislock.NewGuard(c), p.Stall
	}))
}

func TestGuardRules(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	g := redislock.NewGuard(newClient(t, srv))
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	a := dlock.Fence{Token: 10, Owner: "a"}
	if err := g.Put(ctx, res, a, "v", "1"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, res, a, "v", "2"); err != nil { // same token, same owner
		t.Fatalf("same owner, same token: %v", err)
	}
	var st *dlock.StaleTokenError
	err := g.Put(ctx, res, dlock.Fence{Token: 10, Owner: "b"}, "v", "x")
	if !errors.Is(err, dlock.ErrStaleToken) || !errors.As(err, &st) || st.Highest != 10 {
		t.Fatalf("same token, other owner: %v", err)
	}
	if err := g.Put(ctx, res, dlock.Fence{Token: 9, Owner: "a"}, "v", "x"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("older token: %v", err)
	}
	// A fenced read by a newer holder shuts out the older one's write.
	b := dlock.Fence{Token: 1 << 60, Owner: "b"} // large: compared exactly
	if v, ok, err := g.Get(ctx, res, b, "v"); err != nil || !ok || v != "2" {
		t.Fatalf("fenced read = %q, %v, %v", v, ok, err)
	}
	if err := g.Put(ctx, res, a, "v", "late"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("write after newer read: %v", err)
	}
	if n, err := g.IncrBy(ctx, res, b, "n", 5); err != nil || n != 5 {
		t.Fatalf("IncrBy = %d, %v", n, err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != b {
		t.Fatalf("Highest = %+v, %v", hi, err)
	}
	if _, err := g.Eval(ctx, res, dlock.Fence{}, "return 1", nil); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("zero fence: %v", err)
	}
	if _, _, err := redislock.NewGuard(nil).Get(ctx, res, b, "v"); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("nil client: %v", err)
	}
}

// TestGuardRejectsPausedHolder plays the GC-pause story: the first holder
// stalls past its lease, a second holder takes the lock and writes, and the
// first one's late write is refused.
func TestGuardRejectsPausedHolder(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	l, g := redislock.New(c), redislock.NewGuard(c)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	first, err := l.Acquire(ctx, key, dlock.WithTTL(200*time.Millisecond), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	<-first.Lost() // "paused": never renewed
	second, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if err := g.Put(ctx, key, second.Fence(), "balance", "100"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, key, first.Fence(), "balance", "0"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("late write by the paused holder: %v", err)
	}
	if v, _ := c.Get(ctx, g.Key(key, "balance")).Result(); v != "100" {
		t.Fatalf("balance = %q", v)
	}
}

// TestGuardFencedIncrements: 8 holders in turn increment a counter through
// the guard; every increment is admitted exactly once.
func TestGuardFencedIncrements(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	g := redislock.NewGuard(newClient(t, srv))
	key := dlocktest.Key(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := redislock.New(newClient(t, srv))
			for j := 0; j < 5; j++ {
				err := dlock.Do(dlocktest.Context(t), l, key, func(ctx context.Context, lk *dlock.Lock) error {
					_, err := g.IncrBy(ctx, key, lk.Fence(), "n", 1)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	v, ok, err := g.Get(dlocktest.Context(t), key, dlock.Fence{Token: 1<<63 + 1, Owner: "reader"}, "n")
	if err != nil || !ok || v != "40" {
		t.Fatalf("counter = %q, %v, %v", v, ok, err)
	}
}

// Key(res, "") is the guard's seen key: a body given it could delete the
// record of a reader's token and let a paused writer in. Eval refuses the
// guard's own keys.
func TestGuardEval_RefusesTheGuardsOwnKeys(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	g := redislock.NewGuard(newClient(t, srv))
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	if err := g.Put(ctx, res, dlock.Fence{Token: 9, Owner: "r", Shared: true}, "n", "v"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{g.Key(res, ""), g.FenceKey(res)} {
		_, err := g.Eval(ctx, res, dlock.Fence{Token: 9, Owner: "r", Shared: true}, `return redis.call('DEL', KEYS[1])`, []string{k})
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("Eval deleting %q = %v, want ErrInvalidOption", k, err)
		}
	}
	if err := g.Put(ctx, res, dlock.Fence{Token: 5, Owner: "w"}, "n", "stale"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("the paused writer after the reader = %v, want refused", err)
	}
}

// Symptom: with data keys "P:data:{R}:<name>", which key a resource/name pair got depended on the resource's braces.
// A Guard's data keys are unambiguous: resource "a" name "b:c" and
// resource "a:b" name "c" are two keys, and each is the fence key, a NUL
// byte and the name.
func TestGuard_DataKeys_Unambiguous(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	g := redislock.NewGuard(c, redislock.WithPrefix("gk"))
	base := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	f := dlock.Fence{Token: 7, Owner: "o"}
	pairs := [][2]string{{base + "a", "b:c"}, {base + "a:b", "c"}, {base + "a", "}:c"}, {base + "a}", "c"}}
	seen := map[string]bool{}
	for i, p := range pairs {
		k := g.Key(p[0], p[1])
		if k != g.FenceKey(p[0])+"\x00"+p[1] || !strings.HasPrefix(k, "gk:guard:{") {
			t.Fatalf("Key(%q, %q) = %q", p[0], p[1], k)
		}
		if seen[k] {
			t.Fatalf("Key(%q, %q) = %q, shared with another pair", p[0], p[1], k)
		}
		seen[k] = true
		if err := g.Put(ctx, p[0], f, p[1], string(rune('0'+i))); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range pairs {
		if v, err := c.Get(ctx, g.Key(p[0], p[1])).Result(); err != nil || v != string(rune('0'+i)) {
			t.Fatalf("%s = %q, %v; want %q", g.Key(p[0], p[1]), v, err, string(rune('0'+i)))
		}
	}
}

// countScripts counts the scripts a client sends.
type countScripts struct{ n atomic.Int64 }

func (c *countScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *countScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *countScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Symptom: token 0 refused only by a check in Go, which a caller of the script could bypass.
// The admission rule runs in the script, for token 0 and shared fences
// too: token 0 is refused by the server (not only by a check in Go that a
// caller of the script could bypass), and a shared fence is admitted at
// or above the highest token without being recorded.
func TestGuard_AdmissionRule_RunsInScript(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	hook := &countScripts{}
	c.AddHook(hook)
	g := redislock.NewGuard(c)
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)

	before := hook.n.Load()
	zero := dlock.Fence{Token: 0, Owner: "z"}
	var st *dlock.StaleTokenError
	if err := g.Put(ctx, res, zero, "n", "v"); !errors.As(err, &st) || st.Token != 0 || st.Highest != 0 {
		t.Fatalf("Put with token 0 = %v, want a StaleTokenError with highest 0", err)
	}
	if hook.n.Load() == before {
		t.Fatal("Put with token 0 was refused without asking the server")
	}

	a5 := dlock.Fence{Token: 5, Owner: "a"}
	if err := g.Put(ctx, res, a5, "n", "v"); err != nil {
		t.Fatal(err)
	}
	sh := dlock.Fence{Token: 9, Owner: "s", Shared: true}
	if v, err := g.Eval(ctx, res, sh, `return redis.call('GET', KEYS[1])`, []string{g.Key(res, "n")}); err != nil || v != "v" {
		t.Fatalf("shared Eval = %v, %v", v, err)
	}
	if v, _ := c.Get(ctx, g.FenceKey(res)).Result(); v != "5|a" {
		t.Fatalf("fence key after a shared fence = %q, want 5|a (not recorded)", v)
	}
	if _, err := g.Eval(ctx, res, dlock.Fence{Token: 4, Owner: "s", Shared: true}, "return 1", nil); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("shared Eval below the highest = %v, want ErrStaleToken", err)
	}
}

type rejections struct {
	mu sync.Mutex
	n  int
}

func (r *rejections) Observe(e dlock.Event) {
	if e.Kind == dlock.EventRejected {
		r.mu.Lock()
		r.n++
		r.mu.Unlock()
	}
}

// Symptom: an Eval body's error reply reading "DLOCKSTALE 3" was reported as a refusal of an admitted fence.
// An Eval body's own error reply is the body's error, never a refusal,
// also when it reads like the guard's refusal ("DLOCKSTALE 3", say a
// value or a pcall's error it passes on): no *dlock.StaleTokenError and
// no EventRejected, and the admitted fence stays recorded.
func TestGuardEval_BodyErrorReply_IsNotRefusal(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	var obs rejections
	g := redislock.NewGuard(c, dlock.WithObserver(&obs))
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	f := dlock.Fence{Token: 5, Owner: "a"}
	for _, body := range []string{
		`return redis.error_reply('DLOCKSTALE 3')`,
		`return {err = 'DLOCKSTALE 3'}`,
		`return redis.error_reply(ARGV[1])`,
	} {
		_, err := g.Eval(ctx, res, f, body, nil, "DLOCKSTALE 3")
		if err == nil || errors.Is(err, dlock.ErrStaleToken) {
			t.Errorf("Eval(%s) with an admitted fence = %v, want the body's error, not a refusal", body, err)
		}
	}
	if obs.n != 0 {
		t.Errorf("%d EventRejected reported for admitted fences", obs.n)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != f {
		t.Fatalf("Highest = %+v, %v; want %+v", hi, err, f)
	}
	// A body's ordinary error and a real refusal keep their meaning.
	if _, err := g.Eval(ctx, res, f, `return redis.error_reply('MYERR boom')`, nil); err == nil || errors.Is(err, dlock.ErrStaleToken) {
		t.Errorf("body error = %v", err)
	}
	var st *dlock.StaleTokenError
	if _, err := g.Eval(ctx, res, dlock.Fence{Token: 4, Owner: "b"}, `return 1`, nil); !errors.As(err, &st) || st.Highest != 5 {
		t.Errorf("older fence = %v, want a StaleTokenError with highest 5", err)
	}
	if obs.n != 1 {
		t.Errorf("%d EventRejected, want 1", obs.n)
	}
}

// Symptom: the script compared garbage in a fence key as a token: "|x" admitted any fence, "007|o" refused token 8.
// A fence key that does not hold a fence the guard wrote ("<token>|<owner>"
// with a canonical decimal token > 0), for example after someone SET
// garbage there, is reported as an error by Highest and by every fenced
// call alike, and left as it is.
func TestGuard_CorruptFenceKey_ReportedAndLeftAsIs(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	g := redislock.NewGuard(c)
	ctx := dlocktest.Context(t)
	f := dlock.Fence{Token: 8, Owner: "me"}
	for _, garbage := range []string{"|x", " |x", "007|o", "0|o", "5 |o", "+5|o", "abc", "x|y", "-5|o", "18446744073709551616|o", "99999999999999999999|o"} {
		res := dlocktest.Key(t)
		if err := c.Set(ctx, g.FenceKey(res), garbage, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if hi, err := g.Highest(ctx, res); err == nil {
			t.Errorf("fence key %q: Highest = %+v, want an error", garbage, hi)
		}
		err := g.Put(ctx, res, f, "n", "v")
		if err == nil || errors.Is(err, dlock.ErrStaleToken) {
			t.Errorf("fence key %q: Put(token 8) = %v, want an error that is not a refusal", garbage, err)
		}
		if v, _ := c.Get(ctx, g.FenceKey(res)).Result(); v != garbage {
			t.Errorf("fence key %q: now %q, want it left as it was", garbage, v)
		}
		if n, _ := c.Exists(ctx, g.Key(res, "n")).Result(); n != 0 {
			t.Errorf("fence key %q: Put wrote its value", garbage)
		}
	}
	// The largest token is still a fence.
	res := dlocktest.Key(t)
	top := dlock.Fence{Token: 1<<64 - 1, Owner: "top"}
	if err := g.Put(ctx, res, top, "n", "v"); err != nil {
		t.Fatal(err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != top {
		t.Fatalf("Highest = %+v, %v; want %+v", hi, err, top)
	}
	if err := g.Put(ctx, res, top, "n", "w"); err != nil {
		t.Fatalf("same fence again: %v", err)
	}
}

// Symptom: Put, Get, IncrBy and Eval of the zero Guard panicked and killed the process.
// The zero Guard (declared as a value, or a literal that forgot NewGuard)
// fails every call with ErrNilClient, as a nil client does, like the zero
// Locker, and never calls a nil client (a panic in the goroutine that
// waits for the reply, which no recover in the caller can catch).
func TestGuard_ZeroValue_FailsWithNilClient(t *testing.T) {
	t.Parallel()
	var g redislock.Guard
	ctx, cancel := context.WithCancel(context.Background()) // a Done channel: the waiting goroutine runs
	defer cancel()
	f := dlock.Fence{Token: 1, Owner: "o"}
	for name, fn := range map[string]func() error{
		"Put":     func() error { return g.Put(ctx, "r", f, "n", "v") },
		"Get":     func() error { _, _, err := g.Get(ctx, "r", f, "n"); return err },
		"IncrBy":  func() error { _, err := g.IncrBy(ctx, "r", f, "n", 1); return err },
		"Eval":    func() error { _, err := g.Eval(ctx, "r", f, "return 1", nil); return err },
		"Highest": func() error { _, err := g.Highest(ctx, "r"); return err },
	} {
		if err := fn(); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("%s on the zero Guard = %v, want ErrNilClient", name, err)
		}
	}
}

// Symptom: Guard writes and Highest took about 5s with a 200ms context on a stalled link.
// Every Guard call returns by its context's deadline on a stalled link,
// even with a default go-redis client (no ContextTimeoutEnabled), which
// would otherwise wait for its own read timeout and retries.
func TestGuard_ReturnsByDeadline_StalledLink(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password()})
	t.Cleanup(func() { c.Close() })
	// A client that gives up at the context's deadline by itself races the
	// Guard's own abandonment: either way the error is ErrUnavailable.
	cc := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	t.Cleanup(p.Heal) // runs before the clients close: abandoned calls finish
	f := dlock.Fence{Token: 5, Owner: "me"}
	if err := redislock.NewGuard(c).Put(dlocktest.Context(t), "res", f, "x", "1"); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	const (
		budget = 200 * time.Millisecond
		slack  = 2 * time.Second // generous: only a wait for the client's own timeouts fails
	)
	for _, client := range []*redis.Client{c, cc} {
		testGuardCallsOnStalledLink(t, redislock.NewGuard(client), f, budget, slack, client.Options().ContextTimeoutEnabled)
	}
}

// testGuardCallsOnStalledLink calls every Guard method once on a stalled
// link: each returns by its context's deadline with an error wrapping
// dlock.ErrUnavailable and the context's error.
func testGuardCallsOnStalledLink(t *testing.T, g *redislock.Guard, f dlock.Fence, budget, slack time.Duration, ctxTimeouts bool) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Eval", func(ctx context.Context) error { _, err := g.Eval(ctx, "res", f, "return 1", nil); return err }},
		{"Put", func(ctx context.Context) error { return g.Put(ctx, "res", f, "x", "2") }},
		{"Get", func(ctx context.Context) error { _, _, err := g.Get(ctx, "res", f, "x"); return err }},
		{"IncrBy", func(ctx context.Context) error { _, err := g.IncrBy(ctx, "res", f, "n", 1); return err }},
		{"Highest", func(ctx context.Context) error { _, err := g.Highest(ctx, "res"); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		start := time.Now()
		err := tc.fn(ctx)
		took := time.Since(start)
		cancel()
		if took > budget+slack {
			t.Errorf("Guard.%s with a %v context on a stalled link returned after %v", tc.name, budget, took.Round(time.Millisecond))
		}
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("Guard.%s on a stalled link (ContextTimeoutEnabled %v) = %v, want an error wrapping dlock.ErrUnavailable and context.DeadlineExceeded", tc.name, ctxTimeouts, err)
		}
	}
}
