package redislock_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Red team (issue 9): a renewal batch that meets NOSCRIPT (the refresh
// script is not in the server's cache: the first renewal ever on a fresh
// server, or after a restart, failover or SCRIPT FLUSH) fell back to one
// sequential round trip per lock. With a healthy server and a 1ms one-way
// delay, a batch of a few hundred locks outlived its locks' deadlines
// (49-129 of 500 lost, 3 of 3 runs). Now the batch is resent as EVAL in
// one pipeline.
func TestRegressNoScriptRenewalKeepsLocks(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	admin := newClient(t, srv)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password(), PoolSize: 32})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c)
	n := 500
	if v, err := strconv.Atoi(os.Getenv("RT3_N")); err == nil {
		n = v
	}
	ttl := time.Second
	p.Delay(time.Millisecond) // ~2ms round trip: a LAN, another AZ
	phase := func(name string, flush bool) int {
		base := dlocktest.Key(t) + name
		locks := make([]*dlock.Lock, n)
		var wg sync.WaitGroup
		start := time.Now()
		for g := 0; g < 16; g++ {
			wg.Go(func() {
				for i := g; i < n; i += 16 {
					lk, err := l.Acquire(dlocktest.Context(t), fmt.Sprintf("%s.%d", base, i), dlock.WithTTL(ttl))
					if err != nil {
						t.Error(err)
						return
					}
					locks[i] = lk
				}
			})
		}
		wg.Wait()
		acq := time.Since(start)
		if flush {
			admin.ScriptFlush(context.Background()) // a restart / failover loses the script cache
		}
		time.Sleep(1500 * time.Millisecond)
		lost := 0
		var why error
		for _, lk := range locks {
			if lk != nil && lk.Err() != nil {
				lost++
				why = lk.Err()
			}
		}
		t.Logf("%s: %d locks acquired in %v; after 1.5s (healthy server) %d lost (%v)", name, n, acq.Round(time.Millisecond), lost, why)
		for _, lk := range locks {
			if lk != nil {
				lk.Release(context.Background())
			}
		}
		return lost
	}
	a := phase("fresh-server", false)
	b := phase("script-cached", false)
	cc := phase("after-script-flush", true)
	if a > 0 || cc > 0 {
		t.Errorf("locks lost on a healthy server: %d (first renewal ever), %d (script cached), %d (after SCRIPT FLUSH)", a, b, cc)
	}
}
