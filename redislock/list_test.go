package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

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

// Symptom: List with a prefix ending in '}' also listed the key before the brace.
// List(prefix) returns only keys starting with prefix, also for a prefix
// with '}', whose SCAN pattern "dlock:{a}*" also matches the lock key of
// "a" itself ("dlock:{a}").
func TestList_PrefixWithBrace_ListsOnlyKeysWithIt(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	base := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), base)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	with, err := l.Acquire(dlocktest.Context(t), base+"}x")
	if err != nil {
		t.Fatal(err)
	}
	defer with.Release(context.Background())
	infos, err := l.List(dlocktest.Context(t), base+"}")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Key != base+"}x" {
		t.Fatalf("List(%q) = %+v, want only %q", base+"}", infos, base+"}x")
	}
}

// List matches prefix byte for byte, like every Lister (memlock uses
// strings.HasPrefix): a prefix ending inside a multi-byte character (not
// valid UTF-8 on its own) still lists the keys it starts.
func TestList_PrefixMatchedByteForByte(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	ctx := dlocktest.Context(t)
	key := "é" + dlocktest.Key(t) // "\xc3\xa9..."
	lk, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	for _, prefix := range []string{"\xc3", "é"} {
		infos, err := l.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Key != key {
			t.Errorf("List(%q) = %+v, want only %q", prefix, infos, key)
		}
	}
}

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

// Symptom: a lease ending between List's GET and PTTL was listed as held with a TTL of -2ns.
// List never reports a holder with a TTL of 0 or less, also for a lease
// that ends between the read of its holder and the read of its time left
// (PTTL -2, "no such key").
func TestList_LeaseEndingMidList_NeverNegativeTTL(t *testing.T) {
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
