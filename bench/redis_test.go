package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

var seq atomic.Int64

func benchKey() string { return fmt.Sprintf("bench.%d", seq.Add(1)) }

func redisClient(b *testing.B) *redis.Client {
	srv := testserver.StartRedis(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { c.Close() })
	return c
}

var cad = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkRedisFloor is the physical limit of a Redis lock: SET NX PX and
// a compare-and-delete script, two round trips, nothing else.
func BenchmarkRedisFloor(b *testing.B) {
	c := redisClient(b)
	ctx := context.Background()
	owner := dlock.NewOwner()
	b.ResetTimer()
	for b.Loop() {
		k := benchKey()
		ok, err := c.SetNX(ctx, k, owner, 30e9).Result()
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		if err := cad.Run(ctx, c, []string{k}, owner).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRedislock is dlock's uncontended acquire+release on distinct
// keys (fencing token, metadata, watchdog registration included).
func BenchmarkRedislock(b *testing.B) {
	c := redisClient(b)
	l := redislock.New(c)
	benchLocker(b, l)
}

// BenchmarkRedislockDeadline is BenchmarkRedislock with a context that
// has a deadline, as a request handler's has: the core then runs each
// backend call on a goroutine so that it can return by the deadline even
// if the client ignores it. The difference to BenchmarkRedislock is the
// price of that promise.
func BenchmarkRedislockDeadline(b *testing.B) {
	c := redisClient(b)
	l := redislock.New(c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchLockerCtx(b, ctx, l)
}

func benchRedlock(b *testing.B, n int) {
	var clients []redis.UniversalClient
	for i := 0; i < n; i++ {
		clients = append(clients, redisClient(b))
	}
	l := redlock.New(clients)
	benchLocker(b, l)
}

// BenchmarkRedlock1 is Redlock's acquire+release on one node (grant with
// the token, release: two round trips; the Locker's first attempt
// commits too).
func BenchmarkRedlock1(b *testing.B) { benchRedlock(b, 1) }

// BenchmarkRedlock5 is Redlock on five independent masters.
func BenchmarkRedlock5(b *testing.B) { benchRedlock(b, 5) }

// benchLocker measures uncontended Acquire+Release on distinct keys.
func benchLocker(b *testing.B, l dlock.Locker) { benchLockerCtx(b, context.Background(), l) }

func benchLockerCtx(b *testing.B, ctx context.Context, l dlock.Locker) {
	b.ResetTimer()
	for b.Loop() {
		lk, err := l.Acquire(ctx, benchKey())
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
