package redislock_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// expireAfterGet deletes key, through admin, right after the client it
// hooks reads it: the lease ends between List's read of the holder and
// its read of the time left.
type expireAfterGet struct {
	admin *redis.Client
	key   string
}

func (h *expireAfterGet) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *expireAfterGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "get" && len(cmd.Args()) > 1 && cmd.Args()[1] == h.key {
			h.admin.Del(ctx, h.key)
		}
		return err
	}
}
func (h *expireAfterGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// List never reports a holder with a negative TTL: a lease that ended
// between the read of its holder and the read of its time left (PTTL -2,
// "no such key") was listed as held, with a TTL of -2ns. (Red-team
// reproducer.)
func TestRegressListLeaseEndingMeanwhile(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	c := newClient(t, srv)
	l := redislock.New(c)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	c.AddHook(&expireAfterGet{admin: admin, key: l.LockKey(key)})
	infos, err := l.List(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		for _, h := range in.Holders {
			if h.TTL <= 0 {
				t.Errorf("List = %+v: holder with TTL %v", in, h.TTL)
			}
		}
	}
}
