package redislock_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// A fence key that does not hold a fence the guard wrote ("<token>|<owner>"
// with a canonical decimal token > 0), for example after someone SET
// garbage there, is reported as an error by Highest and by every fenced
// call alike, and left as it is. The script used to compare the garbage as
// a token: "|x" or " |x" admitted any fence and overwrote the key while
// Highest reported it corrupt, and "007|o" refused token 8 as older than
// the highest token 7. (Red-team reproducer.)
func TestRegressGuardCorruptFenceKey(t *testing.T) {
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
