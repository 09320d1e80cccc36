package redislock_test

import (
	"context"
	"errors"
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

// startTair starts a redis-server with the TairString module (CAS, CAD)
// and the no-scripts ACL user.
func startTair(t *testing.T) *testserver.Redis {
	t.Helper()
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	srv.AddNoScriptsUser(t)
	return srv
}

// noScriptsClient is a default client of srv's no-scripts user.
func noScriptsClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Username: testserver.NoScriptsUser, Password: testserver.NoScriptsPassword})
	t.Cleanup(func() { c.Close() })
	return c
}

// commandStat returns a command's field (calls, rejected_calls) from
// INFO commandstats, 0 when the command never ran.
func commandStat(t *testing.T, c *redis.Client, cmd, field string) int {
	t.Helper()
	info, err := c.Info(dlocktest.Context(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
	}
	return 0
}

// scriptStat is field of INFO commandstats summed over EVALSHA and EVAL:
// calls (scripts run) or rejected_calls (refused).
func scriptStat(t *testing.T, c *redis.Client, field string) int {
	t.Helper()
	return commandStat(t, c, "evalsha", field) + commandStat(t, c, "eval", field)
}

// The default Locker on a user that may run no script, on a server with
// CAS and CAD: one script is refused, then every Locker of the client
// acquires, renews and releases with CAS, and never sends a script
// again; tokens increase.
func TestNew_ScriptsRefused_TairOnceForTheClient(t *testing.T) {
	t.Parallel()
	srv := startTair(t)
	admin := newClient(t, srv)
	c := noScriptsClient(t, srv.Addr())
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	var last uint64
	for i := range 3 {
		lk, err := redislock.New(c).Acquire(ctx, key, dlock.WithTTL(time.Second))
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		if lk.Token() <= last {
			t.Fatalf("token %d after %d", lk.Token(), last)
		}
		last = lk.Token()
		if err := lk.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := scriptStat(t, admin, "rejected_calls"); n != 1 {
		t.Errorf("%d scripts refused, want 1", n)
	}
	if n := scriptStat(t, admin, "calls"); n != 0 {
		t.Errorf("%d scripts ran", n)
	}
	// Grants: one token write, then two takeovers of the marker with
	// theirs (5); 3 renewals; 3 releases.
	if n := commandStat(t, admin, "cas", "calls"); n != 11 {
		t.Errorf("%d CAS calls, want 11", n)
	}
}

// Symptom: every call on a user whose scripts are refused, on a server
// without CAS and CAD, sent its script again. The first refusal says what
// the user needs and that the server offers no CAS/CAD; later calls fail
// the same way without sending a script.
func TestNew_ScriptsRefusedNoCAS_FailsClearlyScriptSentOnce(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	srv.AddNoScriptsUser(t)
	admin := newClient(t, srv)
	l := redislock.New(noScriptsClient(t, srv.Addr()))
	for i := range 3 {
		_, err := l.TryAcquire(dlocktest.Context(t), dlocktest.Key(t))
		if err == nil || !strings.Contains(err.Error(), "+@scripting") || !strings.Contains(err.Error(), "no CAS and CAD") {
			t.Fatalf("attempt %d: %v, want an error naming +@scripting and the missing CAS/CAD", i, err)
		}
	}
	if n := scriptStat(t, admin, "rejected_calls"); n != 1 {
		t.Errorf("%d scripts refused, want 1", n)
	}
}

// Shared and limited locks need the scripts: on the Lua-free protocol
// they are refused with an error wrapping dlock.ErrUnsupported that
// names the mode, and leave nothing on the server.
func TestTryAcquire_GroupModesOnTair_Unsupported(t *testing.T) {
	t.Parallel()
	srv := startTair(t)
	admin := newClient(t, srv)
	l := redislock.New(noScriptsClient(t, srv.Addr()), redislock.WithProtocol(redislock.ProtocolTair))
	key := dlocktest.Key(t)
	for _, c := range []struct {
		opt  dlock.Option
		name string
	}{{dlock.WithShared(), "shared"}, {dlock.WithLimit(2), "limited"}} {
		_, err := l.TryAcquire(dlocktest.Context(t), key, c.opt)
		if !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: %v, want ErrUnsupported naming the mode", c.name, err)
		}
	}
	if n, err := admin.Exists(dlocktest.Context(t), l.LockKey(key)).Result(); n != 0 || err != nil {
		t.Errorf("the refusals left the lock key (%d, %v)", n, err)
	}
}

// WithProtocol forces either protocol: ProtocolTair never sends a script,
// even where scripts run; ProtocolScripts never falls back to CAS/CAD.
func TestWithProtocol_ForcesEitherProtocol(t *testing.T) {
	t.Parallel()
	srv := startTair(t)
	admin := newClient(t, srv)
	ctx := dlocktest.Context(t)
	lk, err := redislock.New(newClient(t, srv), redislock.WithProtocol(redislock.ProtocolTair)).Acquire(ctx, dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := scriptStat(t, admin, "calls"); n != 0 {
		t.Errorf("ProtocolTair ran %d scripts", n)
	}
	cas := commandStat(t, admin, "cas", "calls")
	_, err = redislock.New(noScriptsClient(t, srv.Addr()), redislock.WithProtocol(redislock.ProtocolScripts)).TryAcquire(ctx, dlocktest.Key(t))
	if err == nil || !strings.Contains(err.Error(), "+@scripting") {
		t.Errorf("ProtocolScripts on a user without scripts: %v, want the refusal naming +@scripting", err)
	}
	if n := commandStat(t, admin, "cas", "calls"); n != cas {
		t.Errorf("ProtocolScripts fell back to CAS (%d calls)", n-cas)
	}
	if _, err := redislock.ParseProtocol("lua"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("ParseProtocol(lua): %v, want ErrInvalidOption", err)
	}
	if _, err := redislock.New(newClient(t, srv), redislock.WithProtocol(redislock.ProtocolTair), redislock.WithReplicaAcks(1, 0)).TryAcquire(ctx, dlocktest.Key(t)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("ProtocolTair with WithReplicaAcks: %v, want ErrInvalidOption", err)
	}
}

// A release on the Lua-free protocol wakes the key's waiters by
// notification: with a 30s lease and a minute between polls, every
// waiter would otherwise wait out the lease. Every waiter is told (none
// is reserved the key); the first to retry takes it, and the rest wait
// on. The test logs the hand-over's time and the attempts one release
// caused (the herd).
func TestRelease_Tair_WakesWaitersByNotification(t *testing.T) {
	t.Parallel()
	srv := startTair(t)
	admin := newClient(t, srv)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	holder, err := redislock.New(noScriptsClient(t, srv.Addr())).Acquire(ctx, key, dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	got := make(chan *dlock.Lock, n)
	for range n {
		l := redislock.New(noScriptsClient(t, srv.Addr()))
		go func() {
			// Well before the lease would end: only a notification
			// can hand the key over in time.
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			lk, err := l.Acquire(wctx, key, dlock.WithTTL(30*time.Second), dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Minute}))
			if err != nil {
				t.Error(err)
			}
			got <- lk
		}()
	}
	free := redislock.New(admin).LockKey(key) + ":free"
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
		if m, _ := admin.PubSubNumSub(ctx, free).Result(); m[free] == n {
			break
		}
		if time.Now().After(end) {
			t.Fatal("hang: the waiters never listened")
		}
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first == nil {
		t.Fatal("no waiter took the key")
	}
	t.Logf("hand-over %v after the release; %d grant attempts", time.Since(released), commandStat(t, admin, "set", "calls")-1)
	for i := 1; i < n; i++ {
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if first = <-got; first == nil {
			t.Fatalf("waiter %d never took the key", i)
		}
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Locker.Protocol says which protocol the default Locker takes, and why,
// on a server that runs scripts, on one that refuses them and offers
// CAS/CAD, and when forced.
func TestLocker_Protocol_SaysWhichAndWhy(t *testing.T) {
	t.Parallel()
	srv := startTair(t)
	ctx := dlocktest.Context(t)
	for _, c := range []struct {
		l    *redislock.Locker
		want redislock.Protocol
	}{
		{redislock.New(newClient(t, srv)), redislock.ProtocolScripts},
		{redislock.New(noScriptsClient(t, srv.Addr())), redislock.ProtocolTair},
		{redislock.New(newClient(t, srv), redislock.WithProtocol(redislock.ProtocolTair)), redislock.ProtocolTair},
	} {
		p, why, err := c.l.Protocol(ctx)
		if err != nil || p != c.want || why == "" {
			t.Errorf("Protocol() = %v, %q, %v; want %v and a reason", p, why, err, c.want)
		}
	}
	plain := testserver.StartRedis(t)
	plain.AddNoScriptsUser(t)
	if _, _, err := redislock.New(noScriptsClient(t, plain.Addr())).Protocol(ctx); err == nil || !strings.Contains(err.Error(), "no CAS and CAD") {
		t.Errorf("Protocol() on a server refusing scripts without CAS/CAD: %v, want an error saying so", err)
	}
}

// On a Cluster whose nodes have CAS and CAD and whose user may run no
// script, the default Locker takes, renews (one batch over the masters),
// hands over and releases exclusive locks on keys of every master, with
// increasing tokens.
func TestCluster_Tair_AcquireRenewRelease(t *testing.T) {
	t.Parallel()
	nodes := testserver.StartRedisCluster(t, 3, testserver.WithTairString(t))
	for _, n := range nodes {
		n.AddNoScriptsUser(t)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}, Username: testserver.NoScriptsUser, Password: testserver.NoScriptsPassword})
	t.Cleanup(func() { c.Close() })
	ctx := dlocktest.Context(t)
	l := redislock.New(c)
	masters := map[string]bool{}
	var held []*dlock.Lock
	for i := 0; len(masters) < 3 && i < 100; i++ {
		key := dlocktest.Key(t)
		m, err := c.MasterForKey(ctx, l.LockKey(key))
		if err != nil {
			t.Fatal(err)
		}
		if masters[m.Options().Addr] {
			continue
		}
		masters[m.Options().Addr] = true
		lk, err := l.Acquire(ctx, key, dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatalf("acquire on %s: %v", m.Options().Addr, err)
		}
		held = append(held, lk)
	}
	if len(held) != 3 {
		t.Fatalf("keys on %d masters, want 3", len(held))
	}
	// The watchdog's batch renews each key with CAS: every master counts
	// a second CAS (the first wrote the token).
	for _, n := range nodes {
		for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(20 * time.Millisecond) {
			info, err := n.Do("INFO", "commandstats")
			if err == nil && !strings.Contains(info, "cmdstat_cas:calls=1,") && strings.Contains(info, "cmdstat_cas:calls=") {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("hang: no renewal on %s: %v %s", n.Addr(), err, info)
			}
		}
	}
	for _, lk := range held {
		select {
		case <-lk.Lost():
			t.Fatalf("%s lost: %v", lk.Key(), lk.Err())
		default:
		}
		next := redislock.New(c)
		w := make(chan *dlock.Lock, 1)
		go func() {
			nl, err := next.Acquire(ctx, lk.Key(), dlock.WithTTL(time.Second))
			if err != nil {
				t.Error(err)
			}
			w <- nl
		}()
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		nl := <-w
		if nl == nil {
			t.FailNow()
		}
		if nl.Token() <= lk.Token() {
			t.Errorf("%s: token %d after %d", lk.Key(), nl.Token(), lk.Token())
		}
		if err := nl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p, _, err := l.Protocol(ctx); p != redislock.ProtocolTair || err != nil {
		t.Errorf("Protocol() = %v, %v; want tair", p, err)
	}
}

// Symptom: a caller that found the question "does the server offer CAS
// and CAD" in flight waited for it past its own deadline (the question
// ran under a lock the others took without a context). It returns by its
// deadline while the question is still unanswered.
func TestProtocol_QuestionInFlight_OthersReturnByTheirDeadline(t *testing.T) {
	// Not parallel: the hook is the package's.
	srv := startTair(t)
	c := noScriptsClient(t, srv.Addr())
	asking, answer := make(chan struct{}), make(chan struct{})
	var once sync.Once
	redislock.SetOfferHook(t, func() {
		once.Do(func() { close(asking); <-answer })
	})
	first := make(chan error, 1)
	go func() {
		_, err := redislock.New(c).TryAcquire(dlocktest.Context(t), dlocktest.Key(t))
		first <- err
	}()
	<-asking // the first caller's script was refused; its question is parked
	ctx, cancel := context.WithTimeout(dlocktest.Context(t), 200*time.Millisecond)
	defer cancel()
	_, err := redislock.New(c).TryAcquire(ctx, dlocktest.Key(t))
	select {
	case <-first:
		t.Fatal("the first caller's question was answered before the second returned")
	default:
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second TryAcquire: %v, want its deadline", err)
	}
	close(answer)
	if err := <-first; err != nil {
		t.Errorf("first TryAcquire, once answered: %v", err)
	}
}

// Symptom: a user that may run neither scripts nor COMMAND was sent a
// script on every call and never used CAS/CAD. The commands themselves
// tell: one script is refused, then every call goes the Lua-free way.
func TestNew_CommandAlsoDenied_TairFoundByTheCommands(t *testing.T) {
	t.Parallel()
	srv := startTair(t)
	if _, err := srv.Do("ACL", "SETUSER", "nocmd", "on", ">pw", "~*", "&*", "+@all", "-@scripting", "-command"); err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, srv)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nocmd", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	ctx := dlocktest.Context(t)
	for i := range 3 {
		lk, err := redislock.New(c).TryAcquire(ctx, dlocktest.Key(t))
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := scriptStat(t, admin, "rejected_calls"); n != 1 {
		t.Errorf("%d scripts refused, want 1", n)
	}
}

// Symptom: a shared request on the Lua-free protocol, refused as
// unsupported, was then undone by a release script (sent to a server that
// refuses scripts, or under ProtocolTair). Nothing is sent for it.
func TestTryAcquire_GroupModeOnTair_SendsNoScript(t *testing.T) {
	t.Parallel()
	srv := startTair(t)
	admin := newClient(t, srv)
	ctx := dlocktest.Context(t)
	auto := redislock.New(noScriptsClient(t, srv.Addr()))
	if _, _, err := auto.Protocol(ctx); err != nil { // learns: one refused script
		t.Fatal(err)
	}
	for _, l := range []*redislock.Locker{auto, redislock.New(newClient(t, srv), redislock.WithProtocol(redislock.ProtocolTair))} {
		for range 3 {
			key := dlocktest.Key(t)
			if _, err := l.TryAcquire(ctx, key, dlock.WithShared()); !errors.Is(err, dlock.ErrUnsupported) {
				t.Fatalf("shared TryAcquire: %v, want ErrUnsupported", err)
			}
			// The core's undoing of the refused attempt (it runs it in
			// the background too).
			if err := redislock.AbortShared(ctx, l, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := scriptStat(t, admin, "calls"); n != 0 {
		t.Errorf("%d scripts ran", n)
	}
	if n := scriptStat(t, admin, "rejected_calls"); n != 1 {
		t.Errorf("%d scripts refused, want the 1 that taught", n)
	}
}

// Symptom: ProtocolTair on a server without CAS wrote its hold, then
// failed, and the hold kept the key for its whole TTL. The server is asked
// first: the attempt fails with ErrUnsupported and leaves nothing.
func TestTryAcquire_ForcedTairWithoutCAS_UnsupportedLeavesNothing(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	l := redislock.New(newClient(t, srv), redislock.WithProtocol(redislock.ProtocolTair))
	key := dlocktest.Key(t)
	if _, err := l.TryAcquire(dlocktest.Context(t), key); !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), "CAS") {
		t.Fatalf("TryAcquire: %v, want ErrUnsupported naming CAS", err)
	}
	if n, err := admin.Exists(dlocktest.Context(t), l.LockKey(key)).Result(); n != 0 || err != nil {
		t.Errorf("the key exists (%d, %v)", n, err)
	}
}
