package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redlock"
)

func TestMain(m *testing.M) { testserver.Main(m) }

type cluster struct {
	srvs  []*testserver.Redis
	admin []*redis.Client
}

func startNodes(t *testing.T, n int) *cluster {
	c := &cluster{}
	for i := 0; i < n; i++ {
		s := testserver.StartRedis(t)
		c.srvs = append(c.srvs, s)
		c.admin = append(c.admin, c.client(t, s))
	}
	return c
}

func (c *cluster) client(t testing.TB, s *testserver.Redis) *redis.Client {
	// A default client: no promise may depend on the client's settings
	// (go-redis retries and waits out its read timeout on a stalled link).
	cl := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { cl.Close() })
	return cl
}

func (c *cluster) locker(t testing.TB, opts ...redlock.Option) *redlock.Locker {
	var cls []redis.UniversalClient
	for _, s := range c.srvs {
		cls = append(cls, c.client(t, s))
	}
	return redlock.New(cls, opts...)
}

func lockKey(key string) string { return "dlock:{" + key + "}" }

// heldOnAll waits (bounded) until every node holds lk's lease: Acquire
// returns once a majority granted, and the last nodes' phase-one grants
// may land after it; a test that stalls, releases or breaks on every
// node waits for them first. The key must have been free on every node
// when lk's attempt began (a fresh key): a node still holding an earlier
// lease that is being released refuses lk's grant for good.
func heldOnAll(t *testing.T, c *cluster, key string, lk *dlock.Lock) {
	t.Helper()
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for {
		n := 0
		for _, v := range c.holders(t, key) {
			if strings.HasPrefix(v, lk.Owner()) {
				n++
			}
		}
		if n == len(c.srvs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease not on every node: %q", c.holders(t, key))
		}
		time.Sleep(time.Millisecond)
	}
}

// holders returns, per node, the lease value of key ("" if none).
func (c *cluster) holders(t testing.TB, key string) []string {
	out := make([]string, len(c.admin))
	for i, a := range c.admin {
		v, err := a.Get(context.Background(), lockKey(key)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		out[i] = v
	}
	return out
}

// conformanceNodeTimeout is the node timeout of the conformance suite's
// Lockers. The default (TTL/20, at least 50ms) is a budget for a node's
// answer that a race-enabled test process, beside other packages' tests
// on 2 cores, can miss; the suite is about semantics, and the node
// timeout's own tests use the default.
const conformanceNodeTimeout = time.Second

// conformanceTTL is the suite's short lease (Harness.TTL): twice its
// default, so that a holder starved of CPU for a moment (several modules'
// race-enabled tests at once on 2 cores) still renews in time; a renewal
// is due every TTL/3 and a lock is lost when none succeeded within the
// TTL. Symptom: HeldPast3TTL lost its 1s lease at the deadline while
// make test-long ran beside make test.
const conformanceTTL = 2 * time.Second

// conformanceGrace makes Release wait for every node's answer (each
// bounded by the node timeout) instead of a grace of a few times what the
// majority took, which a loaded machine can miss: the suite's "a break
// right after Release removes nothing" is about what Release settles, not
// how long the grace is (tested on its own in this package).
func conformanceGrace(t *testing.T) { redlock.SetEndlessGrace(t) }

func TestConformance(t *testing.T) {
	conformanceGrace(t)
	c := startNodes(t, 5)
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL:         conformanceTTL,
		TellsBroken: true, // each node publishes the break
		New:         func(t testing.TB) dlock.Locker { return c.locker(t, redlock.WithNodeTimeout(conformanceNodeTimeout)) },
		Expire: func(t testing.TB, key string) {
			for _, a := range c.admin {
				if err := a.Del(context.Background(), lockKey(key)).Err(); err != nil {
					t.Fatal(err)
				}
			}
		},
	})
}

// TestFaults runs the suite, fault section included, on three nodes.
func TestFaults(t *testing.T) {
	conformanceGrace(t)
	c := startNodes(t, 3)
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL:         conformanceTTL,
		TellsBroken: true, // each node publishes the break
		New:         func(t testing.TB) dlock.Locker { return c.locker(t, redlock.WithNodeTimeout(conformanceNodeTimeout)) },
		Expire: func(t testing.TB, key string) {
			for _, a := range c.admin {
				if err := a.Del(context.Background(), lockKey(key)).Err(); err != nil {
					t.Fatal(err)
				}
			}
		},
		Faults: &dlocktest.Faults{
			// Every node through a proxy of its own.
			New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(conformanceNodeTimeout))
				return l, link
			},
			// The same, every proxy stopped by down.
			Down: func(t testing.TB) (dlock.Locker, func()) {
				l, link := c.lockerVia(t, []int{0, 1, 2}, redlock.WithNodeTimeout(conformanceNodeTimeout))
				return l, func() {
					for _, p := range link {
						p.Stop()
					}
				}
			},
			Pause: func(t testing.TB, keys ...string) func() {
				for _, s := range c.srvs[:2] { // a majority
					s.Pause()
				}
				return func() {
					for _, s := range c.srvs[:2] {
						s.Resume()
					}
				}
			},
			// One node of three through a proxy.
			NewMinority: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(conformanceNodeTimeout))
				return l, link
			},
		},
	})
}

// lockerVia returns a Locker on default clients, the nodes via reached
// through a fault proxy each, and the proxies.
func (c *cluster) lockerVia(t testing.TB, via []int, opts ...redlock.Option) (*redlock.Locker, testserver.Proxies) {
	var (
		cls  []redis.UniversalClient
		link testserver.Proxies
	)
	for i, s := range c.srvs {
		addr := s.Addr()
		if slices.Contains(via, i) {
			p := testserver.StartProxy(t, addr)
			link = append(link, p)
			addr = p.Addr()
		}
		cl := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { cl.Close() })
		cls = append(cls, cl)
	}
	return redlock.New(cls, opts...), link
}

func TestNodesDown(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	c.srvs[0].Stop()
	c.srvs[3].Stop()
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatalf("2 of 5 down: %v", err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("release with 2 of 5 down: %v", err)
	}

	c.srvs[4].Stop() // 3 of 5 down
	start := time.Now()
	_, err = l.TryAcquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(30*time.Second))
	elapsed := time.Since(start)
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("3 of 5 down: %v, want a QuorumError", err)
	}
	if !strings.Contains(err.Error(), "majority is impossible") || !strings.Contains(err.Error(), c.srvs[4].Addr()) {
		t.Fatalf("quorum error does not say what happened: %v", err)
	}
	t.Logf("3 of 5 down: %v after %v", err, elapsed.Round(time.Millisecond))
	// "Quickly": the answer comes from the per-node timeout (1s here),
	// not from the TTL.
	if elapsed > 15*time.Second {
		t.Fatalf("quorum error took %v with a 30s TTL", elapsed)
	}
	// A default client takes longer than the node timeout to give up
	// dialling a dead node, so dead nodes look silent: Acquire keeps
	// trying until its deadline (they may come back), then says so.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = l.Acquire(ctx, dlocktest.Key(t), dlock.WithTTL(30*time.Second))
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with 3 of 5 down: %v, want an outage joined with the deadline", err)
	}
}

func TestSlowNodeDoesNotDelay(t *testing.T) {
	c := startNodes(t, 5)
	const nodeTimeout = 5 * time.Second
	l := c.locker(t, redlock.WithNodeTimeout(nodeTimeout))
	c.srvs[2].Pause()
	defer c.srvs[2].Resume()
	start := time.Now()
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	acquired := time.Since(start)
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	released := time.Since(start) - acquired
	t.Logf("with one node paused: acquire %v, release %v", acquired.Round(time.Millisecond), released.Round(time.Millisecond))
	// Waiting for the paused node would take the whole node timeout.
	if acquired >= nodeTimeout || released >= nodeTimeout {
		t.Fatalf("a paused node delayed acquire (%v) or release (%v) to its %v timeout", acquired, released, nodeTimeout)
	}
}

func TestMinorityAndMajorityHeld(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	other := `0123456789abcdef0123456789abcdef|7|{"host":"elsewhere","pid":"99"}`
	for _, i := range []int{1, 4} {
		c.admin[i].Set(ctx, lockKey(key), other, time.Minute)
	}
	lk, err := l.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("minority held by another owner: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The other owner's minority leases are untouched by our release.
	if h := c.holders(t, key); h[1] != other || h[4] != other {
		t.Fatalf("release touched another owner's leases: %q", h)
	}
	c.admin[2].Set(ctx, lockKey(key), other, time.Minute)
	_, err = l.TryAcquire(ctx, key)
	var na *dlock.NotAcquiredError
	var qe *redlock.QuorumError
	if !errors.As(err, &na) || !errors.As(err, &qe) {
		t.Fatalf("majority held: %v", err)
	}
	if len(na.Holders) != 1 || na.Holders[0].Owner != "0123456789abcdef0123456789abcdef" || na.Holders[0].Metadata["host"] != "elsewhere" {
		t.Fatalf("holders = %+v, want the one owner holding the majority", na.Holders)
	}
	if !strings.Contains(err.Error(), "held by owner 0123456789ab (host=elsewhere pid=99)") {
		t.Fatalf("message: %v", err)
	}
	// The failed attempt left nothing behind (cleanup runs in the
	// background; wait for it, bounded).
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for {
		h := c.holders(t, key)
		if h[0] == "" && h[3] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("failed attempt left leases: %q", h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTokensAcross200Acquisitions(t *testing.T) {
	c := startNodes(t, 5)
	ls := []*redlock.Locker{c.locker(t), c.locker(t)}
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 200; i++ {
		lk, err := ls[i%2].Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("acquisition %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A node that restarts empty (no persistence) does not break monotonicity
// while the majority keeps its counters: the commit phase put the last
// token on a majority, and every majority overlaps it.
func TestRestartedNodeKeepsTokensIncreasing(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 30; i++ {
		if i%10 == 5 {
			c.srvs[i%5].Restart()
		}
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("acquisition %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		lk.Release(dlocktest.Context(t))
	}
}

// The committed token is what the nodes record, and it is above every
// node's counter: push one node's counter far ahead, and the next token
// follows it.
func TestQuorumCounterWins(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	key := dlocktest.Key(t)
	ahead := uint64(time.Now().Add(24*time.Hour).UnixMicro()) + 12345
	for _, a := range c.admin {
		a.Set(context.Background(), lockKey(key)+":fence", ahead, time.Hour)
	}
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if lk.Token() != ahead+1 {
		t.Fatalf("token %d, want counter+1 = %d", lk.Token(), ahead+1)
	}
	committed := 0 // the token is recorded on the granting majority
	for _, v := range c.holders(t, key) {
		if strings.HasPrefix(v, fmt.Sprintf("%s|%d|", lk.Owner(), lk.Token())) {
			committed++
		}
	}
	if committed < l.Quorum() {
		t.Fatalf("token committed on %d nodes: %q", committed, c.holders(t, key))
	}
	// List reports only keys a majority holds for one owner (the count of
	// nodes holding it is checked above, from the nodes themselves).
	infos, err := l.List(dlocktest.Context(t), key)
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Token != lk.Token() || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	lk.Release(dlocktest.Context(t))
}

func TestReleaseCleansEveryNode(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if h := c.holders(t, key); strings.Count(strings.Join(h, ","), lk.Owner()) < 3 {
		t.Fatalf("held on fewer than a majority: %q", h)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Release returns after a majority; the rest follow promptly. Each
	// node keeps only the release marker "|<token>".
	marker := "|" + strconv.FormatUint(lk.Token(), 10)
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for h := c.holders(t, key); strings.Join(h, ",") != strings.Repeat(marker+",", len(h)-1)+marker; h = c.holders(t, key) {
		if time.Now().After(deadline) {
			t.Fatalf("leases left after release: %q, want %q on every node", h, marker)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLostWhenMajorityLosesLease(t *testing.T) {
	c := startNodes(t, 5)
	l := c.locker(t)
	key := dlocktest.Key(t)
	// A TTL that a loaded machine's renewals keep up with (300ms lost the
	// lock by its local deadline when the test process was starved): the
	// sleep outlives one TTL, so the lock is held by renewals alone.
	const ttl = 2 * time.Second
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} { // a minority: still held
		c.admin[i].Del(context.Background(), lockKey(key))
	}
	time.Sleep(ttl + ttl/4)
	if lk.Err() != nil {
		t.Fatalf("lost after a minority dropped it: %v", lk.Err())
	}
	c.admin[2].Del(context.Background(), lockKey(key))
	c.admin[3].Del(context.Background(), lockKey(key))
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Lost() not closed after a majority dropped the lease")
	}
	if !errors.Is(lk.Err(), dlock.ErrLockLost) || !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Fatalf("Err() = %v", lk.Err())
	}
}

func TestBadInput(t *testing.T) {
	c := startNodes(t, 3)
	ctx := dlocktest.Context(t)
	a := c.client(t, c.srvs[0])
	cases := []struct {
		l    *redlock.Locker
		want error
	}{
		{redlock.New(nil), dlock.ErrNilClient},
		{redlock.New([]redis.UniversalClient{a, nil}), dlock.ErrNilClient},
		{redlock.New([]redis.UniversalClient{a, (*redis.Client)(nil)}), dlock.ErrNilClient},
		{redlock.New([]redis.UniversalClient{a, a}), dlock.ErrInvalidOption},
		{redlock.New([]redis.UniversalClient{a}, redlock.WithNodeTimeout(-1)), dlock.ErrInvalidOption},
	}
	for i, tc := range cases {
		if _, err := tc.l.Acquire(ctx, "k"); !errors.Is(err, tc.want) {
			t.Errorf("case %d Acquire: %v, want %v", i, err, tc.want)
		}
		if _, err := tc.l.List(ctx, ""); !errors.Is(err, tc.want) {
			t.Errorf("case %d List: %v, want %v", i, err, tc.want)
		}
	}
}

// A node that does not answer counts as failed once the per-node timeout
// passes, even though a default client ignores the per-node context on a
// stalled link (it would wait for its 5s read timeout and retry): the
// attempt is decided by the timer, with a context that never ends.
func TestSilentNodeCountsAsFailed(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{2}, redlock.WithNodeTimeout(200*time.Millisecond))
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	other := `0123456789abcdef0123456789abcdef|7|{"host":"elsewhere","pid":"99"}`
	if err := c.admin[1].Set(context.Background(), lockKey(key), other, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	link.Stall()
	done := make(chan error, 1)
	go func() {
		_, err := l.TryAcquire(context.Background(), key)
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("TryAcquire: %v", err)
		var qe *redlock.QuorumError
		if !errors.As(err, &qe) || !strings.Contains(err.Error(), "no answer within 200ms") {
			t.Fatalf("TryAcquire with one node held and one silent: %v, want the silent node timed out", err)
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("a holder was seen: %v, want ErrNotAcquired", err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: TryAcquire waited for a stalled node")
	}
}

// denyFenceWrites makes node i refuse SET on fence counters (a Redis ACL
// user that may SET lock keys only, checked inside scripts too): grants
// succeed there, commits fail.
func (c *cluster) denyFenceWrites(t *testing.T, i int) *redis.Client {
	if _, err := c.srvs[i].Do("ACL", "SETUSER", "nocommit", "on", ">any", "allchannels", "~*", "+@all", "-set",
		"(+set ~dlock:{*})"); err != nil {
		t.Fatal(err)
	}
	cl := redis.NewClient(&redis.Options{Addr: c.srvs[i].Addr(), Username: "nocommit", Password: "any"})
	t.Cleanup(func() { cl.Close() })
	return cl
}

// A majority grants but the commit cannot reach a majority: the attempt is
// cleaned up and reported as transient (Acquire tries again), saying what
// happened on each node, never "held by unknown holder".
func TestCommitFailureIsTransient(t *testing.T) {
	c := startNodes(t, 3)
	cls := []redis.UniversalClient{c.denyFenceWrites(t, 0), c.denyFenceWrites(t, 1), c.client(t, c.srvs[2])}
	l := redlock.New(cls)
	key := dlocktest.Key(t)
	_, err := l.TryAcquire(dlocktest.Context(t), key)
	t.Logf("TryAcquire: %v", err)
	var qe *redlock.QuorumError
	if !errors.Is(err, dlock.ErrTransient) || errors.Is(err, dlock.ErrNotAcquired) || !errors.As(err, &qe) || qe.Op != "commit" {
		t.Fatalf("commit on a minority: %v, want a transient commit QuorumError", err)
	}
	if msg := err.Error(); strings.Contains(msg, "unknown holder") || !strings.Contains(msg, "can't access") {
		t.Fatalf("message does not say what happened: %v", err)
	}
	// Acquire keeps trying until its deadline, then reports the outage.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = l.Acquire(ctx, key)
	if !errors.Is(err, dlock.ErrTransient) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("Acquire with failing commits: %v, want transient joined with the deadline", err)
	}
	// Every attempt was cleaned up: the key is free on every node.
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for h := c.holders(t, key); strings.Join(h, "") != ""; h = c.holders(t, key) {
		if time.Now().After(deadline) {
			t.Fatalf("failed attempts left leases: %q", h)
		}
		time.Sleep(10 * time.Millisecond)
	}
	lk, err := c.locker(t).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(dlocktest.Context(t))
}

// QuorumError names what happened on each node.
func TestQuorumErrorText(t *testing.T) {
	qe := &redlock.QuorumError{Op: "commit", Key: "k", Quorum: 2, Results: []redlock.NodeResult{
		{Node: "a", Outcome: redlock.OutcomeGranted},
		{Node: "b", Outcome: redlock.OutcomeGone},
		{Node: "c", Outcome: redlock.OutcomeNoAnswer, Err: errors.New("no answer within 50ms")},
	}}
	want := `dlock: redlock commit "k": 1/3 nodes confirmed, need 2; b: lease gone; c: no answer within 50ms`
	if got := qe.Error(); got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// Grants whose replies are lost on warm connections are sent again by
// go-redis; the repeats are granted without touching the lease, and the
// lock is taken once.
func TestLostGrantReplies(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1, 2})
	t.Cleanup(link.Heal)
	warm, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t)) // connections open, scripts loaded
	if err != nil {
		t.Fatal(err)
	}
	warm.Release(dlocktest.Context(t))
	key := dlocktest.Key(t)
	link.LoseNextReply()
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("TryAcquire with the grant replies lost: %v", err)
	}
	committed := 0
	for _, v := range c.holders(t, key) {
		if strings.HasPrefix(v, fmt.Sprintf("%s|%d|", lk.Owner(), lk.Token())) {
			committed++
		}
	}
	if committed < l.Quorum() {
		t.Fatalf("token committed on %d nodes: %q", committed, c.holders(t, key))
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// List returns by its context's deadline when nodes do not answer.
func TestListReturnsByDeadline(t *testing.T) {
	c := startNodes(t, 3)
	l, link := c.lockerVia(t, []int{0, 1})
	t.Cleanup(link.Heal)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	// Acquire returns once a majority granted: a grant to node 1 that
	// lands after the heal below would leave List, with node 0 stalled,
	// seeing the lease on node 2 alone and listing nothing.
	heldOnAll(t, c, key, lk)
	link.Stall() // a majority
	const d = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err = l.List(ctx, "")
	over := time.Since(start) - d
	t.Logf("List with a majority stalled: returned %v after its deadline: %v", over.Round(10*time.Microsecond), err)
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("List = %v, want ErrUnavailable and the deadline", err)
	}
	if over > dlocktest.OverrunBound {
		t.Fatalf("List overran its deadline by %v", over)
	}
	// A minority stalled: the majority answers. The stalled node never
	// will, so a List that waited for it would end in an error at this
	// deadline; it is generous so that a loaded machine's slow answers
	// are not mistaken for that (300ms can run out on one).
	link[1].Heal()
	ctx2, cancel2 := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel2()
	infos, err := l.List(ctx2, key)
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List with a minority stalled = %+v, %v", infos, err)
	}
}
