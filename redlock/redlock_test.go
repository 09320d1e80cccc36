package redlock_test

import (
	"context"
	"errors"
	"slices"
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

// nodesHolding returns the nodes among idx still holding owner's lease on
// key.
func nodesHolding(t *testing.T, c *cluster, key, owner string, idx ...int) []int {
	t.Helper()
	h := c.holders(t, key)
	var out []int
	for _, i := range idx {
		if strings.HasPrefix(h[i], owner) {
			out = append(out, i)
		}
	}
	return out
}
