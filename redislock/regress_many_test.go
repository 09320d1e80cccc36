package redislock_test

import (
	"context"
	"fmt"
	"os"
	"slices"
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

// Regression test from the red-team review (issue 9): thousands of locks
// on one Locker, then the link stalls: another client polling a sample of
// the keys directly must never get one while its holder's Lost() is open.
// Under -race with 6000 locks it did, 31-120ms after the holder's deadline
// (a scan of every lock per watchdog pass, a goroutine per lost lock). The
// pollers sleep 5ms between attempts: polling every millisecond from 20
// goroutines saturates both cores under -race, and a starved process is a
// paused process (its timers wait for the scheduler), which only fencing
// covers.
func TestManyLocksStalledLink(t *testing.T) {
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c)
	n := 6000
	if v, err := strconv.Atoi(os.Getenv("RT_N")); err == nil {
		n = v
	}
	ttl := time.Second
	base := dlocktest.Key(t)
	locks := make([]*dlock.Lock, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 16 {
				lk, err := l.Acquire(dlocktest.Context(t), fmt.Sprintf("%s.%d", base, i), dlock.WithTTL(ttl))
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				locks[i] = lk
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	time.Sleep(500 * time.Millisecond)
	other := redislock.New(newClient(t, srv))
	// Record, for the sampled locks, when Lost() closed relative to the
	// holder's deadline (negative: early), for the log.
	var late []time.Duration
	lostBefore := 0
	for k := 0; k < n; k += n / 20 {
		holder := locks[k]
		select {
		case <-holder.Lost():
			lostBefore++ // a starved setup phase; no claim about these
			continue
		default:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-holder.Lost():
				d := time.Since(holder.Deadline())
				mu.Lock()
				late = append(late, d.Round(100*time.Microsecond))
				mu.Unlock()
			case <-time.After(5 * time.Second):
			}
		}()
	}
	p.Stall()
	defer p.Heal()
	// Another client polls a sample of the keys directly and checks, before
	// each attempt that succeeds, that the holder's Lost() had closed.
	var violations, taken int
	for k := 0; k < n; k += n / 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, holder := fmt.Sprintf("%s.%d", base, k), locks[k]
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				lost := false
				select {
				case <-holder.Lost():
					lost = true
				default:
				}
				sent := time.Now()
				lk, err := other.TryAcquire(context.Background(), key)
				if err != nil {
					continue
				}
				mu.Lock()
				taken++
				if !lost {
					violations++
					t.Errorf("two holders: %s acquired by another client while the holder's Lost() was open (holder deadline %v before the attempt)", key, sent.Sub(holder.Deadline()).Round(time.Millisecond))
				}
				mu.Unlock()
				lk.Release(context.Background())
				return
			}
		}()
	}
	wg.Wait()
	slices.Sort(late)
	t.Logf("%d locks; %d sampled keys taken over, %d while their holder's Lost() was open; %d lost before the stall; the others' Lost() closed at deadline%+v", n, taken, violations, lostBefore, late)
	p.Heal()
	for _, lk := range locks {
		lk.Release(context.Background())
	}
}
