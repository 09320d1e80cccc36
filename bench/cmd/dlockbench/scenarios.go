package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

var keySeq atomic.Int64

func uniqueKey(prefix string) string {
	return fmt.Sprintf("bench:%s:%d:%d", prefix, time.Now().UnixNano(), keySeq.Add(1))
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p * float64(len(s)-1))
	return s[i]
}

// uncontendedResult is scenario 2.
type uncontendedResult struct {
	p50, p99 time.Duration
	opsPerS  float64
	n        int
	err      error
}

// uncontendedAll measures every library with one goroutine on distinct
// keys, for d each, interleaved in rounds so that drift in the machine's
// speed during the run affects every library alike.
func uncontendedAll(libs []lib, d time.Duration, rounds int) map[string]uncontendedResult {
	ctx := context.Background()
	out := map[string]uncontendedResult{}
	lockers := map[string]locker{}
	lat := map[string][]time.Duration{}
	spent := map[string]time.Duration{}
	for _, l := range libs {
		lk, err := l.newLocker()
		if err != nil {
			out[l.name] = uncontendedResult{err: err}
			continue
		}
		defer lk.close()
		lockers[l.name] = lk
		for i := 0; i < 50; i++ { // warm up connections and script caches
			un, err := lk.lock(ctx, uniqueKey("warm"))
			if err != nil {
				out[l.name] = uncontendedResult{err: err}
				delete(lockers, l.name)
				break
			}
			un(ctx)
		}
	}
	for r := 0; r < rounds; r++ {
		for _, l := range libs {
			lk, ok := lockers[l.name]
			if !ok {
				continue
			}
			start := time.Now()
			for time.Since(start) < d/time.Duration(rounds) {
				t := time.Now()
				un, err := lk.lock(ctx, uniqueKey("u"))
				if err == nil {
					err = un(ctx)
				}
				if err != nil {
					out[l.name] = uncontendedResult{err: err}
					delete(lockers, l.name)
					break
				}
				lat[l.name] = append(lat[l.name], time.Since(t))
			}
			spent[l.name] += time.Since(start)
		}
	}
	for name, ls := range lat {
		if _, failed := out[name]; failed {
			continue
		}
		out[name] = uncontendedResult{p50: pct(ls, 0.5), p99: pct(ls, 0.99), opsPerS: float64(len(ls)) / spent[name].Seconds(), n: len(ls)}
	}
	return out
}

// throughput: g goroutines sharing one locker (one client, as a service
// would), distinct keys, for d. Returns ops/s.
func throughput(l lib, g int, d time.Duration) (float64, error) {
	lk, err := l.newLocker()
	if err != nil {
		return 0, err
	}
	defer lk.close()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	var ops atomic.Int64
	var firstErr error
	var once sync.Once
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				un, err := lk.lock(ctx, uniqueKey("t"))
				if err == nil {
					err = un(ctx)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				ops.Add(1)
			}
		}()
	}
	start := time.Now()
	wg.Wait()
	return float64(ops.Load()) / time.Since(start).Seconds(), firstErr
}

// contendedResult is scenario 4.
type contendedResult struct {
	acquisitions  int64
	handoffs      int64 // acquisitions by a contender other than the last holder
	handoffsPerS  float64
	handoffP50    time.Duration
	handoffP99    time.Duration
	meanWait      time.Duration
	maxWait       time.Duration
	failures      int64 // blocking acquisitions that gave up (library error)
	lostUpdates   int64
	contenders    int
	duration      time.Duration
	firstErrorMsg string
}

// contended: n contenders, each with its own locker (connections), on one
// key for d. The critical section is a read-modify-write of a counter.
func contended(l lib, n int, d time.Duration) (contendedResult, error) {
	lockers := make([]locker, n)
	for i := range lockers {
		lk, err := l.newLocker()
		if err != nil {
			return contendedResult{}, err
		}
		defer lk.close()
		lockers[i] = lk
	}
	key := uniqueKey("contended")
	var (
		mu          sync.Mutex // guards the bookkeeping below, not the resource
		lastHolder  = -1
		lastRelease time.Time
		handoffLat  []time.Duration
		waits       []time.Duration
		handoffs    int64
		acq         int64
		failures    int64
		firstErr    string
		counter     atomic.Int64 // the "resource": RMW under the lock
		inside      atomic.Int32
		overlap     atomic.Int64
	)
	ctx, cancel := context.WithTimeout(context.Background(), d+60*time.Second)
	defer cancel()
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for id, lk := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				actx, acancel := context.WithDeadline(ctx, stop.Add(10*time.Second))
				t0 := time.Now()
				un, err := lk.lock(actx, key)
				acancel()
				got := time.Now()
				if err != nil {
					mu.Lock()
					failures++
					if firstErr == "" {
						firstErr = err.Error()
					}
					mu.Unlock()
					continue
				}
				if inside.Add(1) != 1 {
					overlap.Add(1)
				}
				mu.Lock()
				acq++
				waits = append(waits, got.Sub(t0))
				if lastHolder != -1 && lastHolder != id {
					handoffs++
					handoffLat = append(handoffLat, got.Sub(lastRelease))
				}
				mu.Unlock()
				c := counter.Load()
				counter.Store(c + 1)
				inside.Add(-1)
				mu.Lock()
				lastHolder, lastRelease = id, time.Now()
				mu.Unlock()
				if err := un(ctx); err != nil {
					mu.Lock()
					if firstErr == "" {
						firstErr = "release: " + err.Error()
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	r := contendedResult{acquisitions: acq, handoffs: handoffs, contenders: n, duration: d, failures: failures, firstErrorMsg: firstErr}
	r.handoffsPerS = float64(handoffs) / d.Seconds()
	r.handoffP50, r.handoffP99 = pct(handoffLat, 0.5), pct(handoffLat, 0.99)
	var sum time.Duration
	for _, w := range waits {
		sum += w
		r.maxWait = max(r.maxWait, w)
	}
	if len(waits) > 0 {
		r.meanWait = sum / time.Duration(len(waits))
	}
	r.lostUpdates = acq - counter.Load() + overlap.Load()
	return r, nil
}

// heldResult is scenario 5.
type heldResult struct {
	locks          int
	ttl            time.Duration
	duration       time.Duration
	acquireTime    time.Duration
	roundTrips     int64
	renewals       int64
	ticks          float64
	cpu            time.Duration
	bytesPerLock   float64 // heap per lock at the end of the hold (steady state)
	goroutinesHeld int     // goroutines added, at the end of the hold
	lost           int
}

// pipelineCounter counts pipelines (renewal round trips) and EVALSHAs.
type pipelineCounter struct{ pipes, cmds atomic.Int64 }

func (c *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (c *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.pipes.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// manyHeld: hold n locks with auto-refresh on one client for d, after
// acquiring them from 32 goroutines. Heap and goroutines are measured at
// the end of the hold, when every lock is renewed and listens for break
// notices (a lock does from 100 ms on), not right after acquiring.
func manyHeld(addr string, n int, ttl, d time.Duration) (heldResult, error) {
	c := redisClient(addr)
	defer c.Close()
	hook := &pipelineCounter{}
	c.AddHook(hook)
	l := redislock.New(c)
	ctx := context.Background()
	// The client's connections (the pool the 32 goroutines fill, with
	// their buffers) are the client's, not the locks': open them first.
	var warm sync.WaitGroup
	for w := 0; w < 32; w++ {
		warm.Add(1)
		go func() {
			defer warm.Done()
			for i := 0; i < 4; i++ {
				if lk, err := l.Acquire(ctx, uniqueKey("warm"), dlock.WithTTL(ttl)); err == nil {
					lk.Release(ctx)
				}
			}
		}()
	}
	warm.Wait()
	before := heapInUse()
	g0 := runtime.NumGoroutine()
	locks := make([]*dlock.Lock, n)
	t0 := time.Now()
	var (
		wg       sync.WaitGroup
		next     atomic.Int64
		firstErr error
		once     sync.Once
	)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				lk, err := l.Acquire(ctx, uniqueKey("held"), dlock.WithTTL(ttl))
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				locks[i] = lk
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, lk := range locks {
			if lk != nil {
				lk.Release(ctx)
			}
		}
	}()
	if firstErr != nil {
		return heldResult{}, firstErr
	}
	acquired := time.Since(t0)
	time.Sleep(time.Second) // every lock listens for break notices by now
	hook.pipes.Store(0)
	hook.cmds.Store(0)
	cpu0 := cpuTime()
	time.Sleep(d)
	r := heldResult{locks: n, ttl: ttl, duration: d, acquireTime: acquired, roundTrips: hook.pipes.Load(), renewals: hook.cmds.Load(),
		cpu: cpuTime() - cpu0}
	r.ticks = d.Seconds() / (ttl / 3).Seconds()
	r.goroutinesHeld = runtime.NumGoroutine() - g0
	r.bytesPerLock = float64(heapInUse()-before) / float64(n)
	for _, lk := range locks {
		if lk.Err() != nil {
			r.lost++
		}
	}
	return r, nil
}
