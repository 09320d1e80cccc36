package redislock_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestCluster runs the conformance suite on a three-master Redis Cluster:
// lock and counter keys share a slot (hash tag), renewals of locks on
// different masters are pipelined per node, List scans every master.
func TestCluster(t *testing.T) {
	nodes := testserver.StartRedisCluster(t, 3)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr())
	}
	newCluster := func(t testing.TB) *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { c.Close() })
		return c
	}
	admin := newCluster(t)
	t.Run("Conformance", func(t *testing.T) {
		dlocktest.TestLocker(t, dlocktest.Harness{
			New: func(t testing.TB) dlock.Locker { return redislock.New(newCluster(t)) },
			Expire: func(t testing.TB, key string) {
				if err := admin.Del(context.Background(), redislock.New(admin).LockKey(key)).Err(); err != nil {
					t.Fatal(err)
				}
			},
		})
	})
	t.Run("ListAcrossMasters", func(t *testing.T) {
		l := redislock.New(newCluster(t))
		ctx := ctxT(t)
		held := map[string]bool{}
		for i := 0; i < 12; i++ { // keys spread over the three masters
			key := dlocktest.Key(t)
			if i%4 == 0 {
				key = "}" + key // an encoded hash tag
			}
			lk, err := l.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Release(ctx)
			held[key] = true
		}
		infos, err := l.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			delete(held, in.Key)
		}
		if len(held) != 0 {
			t.Fatalf("List missed %d held keys: %v", len(held), held)
		}
	})
}
