package redislock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// A Guard's data keys are unambiguous: resource "a" name "b:c" and
// resource "a:b" name "c" are two keys (the v1 layout
// "P:data:{R}:<name>" made such pairs depend on the resource's braces),
// and each is the fence key, a NUL byte and the name.
func TestRegressGuardDataKeys(t *testing.T) {
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

// The admission rule runs in the script, for token 0 and shared fences
// too: token 0 is refused by the server (not only by a check in Go that a
// caller of the script could bypass), and a shared fence is admitted at
// or above the highest token without being recorded.
func TestRegressGuardRuleInScript(t *testing.T) {
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
