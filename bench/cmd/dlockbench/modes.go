package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/redislock"
)

// semLimit is the number of permits of the semaphore scenario.
const semLimit = 4

// modeLib is a backend measured in the shared (read lock) and limited
// (semaphore) modes, next to its exclusive lock in the contended scenario.
type modeLib struct {
	name  string // "dlock redislock"
	group string
	// exclusive names the library whose contended handoffs/s the read
	// lock is compared with (the same backend, exclusive).
	exclusive string
	// newLocker makes a contender with its own client connections.
	newLocker func() (locker, error)
	// semFloor, if set, makes a contender of the owner-less semaphore
	// the dlock semaphore is compared with.
	semFloor func() (locker, error)
}

func modeLibraries(e *env) []modeLib {
	one := e.redis[0]
	return []modeLib{
		{name: nDRedis, group: "redis", exclusive: nDRedis,
			newLocker: func() (locker, error) {
				c := redisClient(one)
				return &modeLocker{l: redislock.New(c), close_: func() { c.Close() }}, nil
			},
			semFloor: func() (locker, error) { return &counterSem{c: redisClient(one), limit: semLimit}, nil }},
		{name: nDEtcd, group: "etcd", exclusive: nDEtcd,
			newLocker: func() (locker, error) {
				c, err := clientv3.New(clientv3.Config{Endpoints: e.etcdEPs, DialTimeout: 5 * time.Second})
				if err != nil {
					return nil, err
				}
				return &modeLocker{l: etcdlock.New(c), close_: func() { c.Close() }}, nil
			}},
	}
}

// modeLocker is a dlock Locker taking the key in the mode its lock call
// asks for: modeLocker.opts are added to every Acquire.
type modeLocker struct {
	l      dlock.Locker
	opts   []dlock.Option
	close_ func()
}

func (m *modeLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	lk, err := m.l.Acquire(ctx, key, append([]dlock.Option{dlock.WithTTL(benchTTL)}, m.opts...)...)
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}
func (m *modeLocker) close() { m.close_() }

// withMode returns a constructor of mk's lockers that take keys with opts
// (mk must make *modeLocker).
func withMode(mk func() (locker, error), opts ...dlock.Option) func() (locker, error) {
	return func() (locker, error) {
		lk, err := mk()
		if err != nil {
			return nil, err
		}
		if m, ok := lk.(*modeLocker); ok {
			m.opts = opts
		}
		return lk, nil
	}
}

// counterSem is the floor of a Redis semaphore: an owner-less counter of
// permits in a Lua script (take one if fewer than limit are taken; give
// one back with DECR), as Redisson's RSemaphore keeps permits. A refused
// attempt is retried at once (no backoff, no wake-up): the fastest a
// counter can hand permits over. It records no holder, so a holder that
// dies never gives its permit back (the permit leaks for good), and it
// has no TTL, no owner check on release and no fencing token.
type counterSem struct {
	c     *redis.Client
	limit int
}

var semTake = redis.NewScript(`local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n < tonumber(ARGV[1]) then redis.call('INCR', KEYS[1]) return 1 end
return 0`)

func (s *counterSem) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	for {
		ok, err := semTake.Run(ctx, s.c, []string{key}, s.limit).Int()
		if err != nil {
			return nil, err
		}
		if ok == 1 {
			return func(ctx context.Context) error { return s.c.Decr(ctx, key).Err() }, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}
func (s *counterSem) close() { s.c.Close() }

// modeResult is one run of the shared-mode scenario: n contenders, each
// with its own connections, loop acquire → release on one key for d.
type modeResult struct {
	acquisitions int64
	perS         float64
	contenders   int
	limit        int   // the most holders allowed at once (0: any number)
	maxInside    int64 // the most holders seen inside at once
	overLimit    int64 // entries that found limit holders already inside
	failures     int64
	firstErr     string
	unsupported  bool // the backend refused the mode (ErrUnsupported)
}

// modeRun runs the scenario: each of the n contenders loops lock → count
// itself inside → leave → unlock on one key for d. limit > 0 checks that
// at most limit are inside at once (the count of entries beyond it must
// stay 0).
// insideHook, when set (by tests), runs while a contender of modeRun is
// inside its section, between the counts of entries and exits.
var insideHook func()

func modeRun(mk func() (locker, error), n, limit int, d time.Duration) (modeResult, error) {
	r := modeResult{contenders: n, limit: limit}
	lockers := make([]locker, n)
	for i := range lockers {
		lk, err := mk()
		if err != nil {
			return r, err
		}
		defer lk.close()
		lockers[i] = lk
	}
	key := uniqueKey("mode")
	ctx, cancel := context.WithTimeout(context.Background(), d+60*time.Second)
	defer cancel()
	// One attempt first: a backend that does not offer the mode refuses
	// it at once.
	un, err := lockers[0].lock(ctx, key)
	if errors.Is(err, dlock.ErrUnsupported) {
		r.unsupported = true
		return r, nil
	}
	if err != nil {
		return r, err
	}
	if err := un(ctx); err != nil {
		return r, err
	}
	var (
		acq, failures atomic.Int64
		inside        atomic.Int64
		maxInside     atomic.Int64
		over          atomic.Int64
		mu            sync.Mutex
		firstErr      string
	)
	note := func(err error) {
		mu.Lock()
		if firstErr == "" {
			firstErr = err.Error()
		}
		mu.Unlock()
	}
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for _, lk := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				actx, acancel := context.WithDeadline(ctx, stop.Add(10*time.Second))
				un, err := lk.lock(actx, key)
				acancel()
				if err != nil {
					failures.Add(1)
					note(err)
					continue
				}
				in := inside.Add(1)
				if limit > 0 && in > int64(limit) {
					over.Add(1)
				}
				for m := maxInside.Load(); in > m && !maxInside.CompareAndSwap(m, in); m = maxInside.Load() {
				}
				if insideHook != nil {
					insideHook()
				}
				acq.Add(1)
				inside.Add(-1)
				if err := un(ctx); err != nil {
					note(fmt.Errorf("release: %w", err))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	r.acquisitions, r.failures, r.firstErr = acq.Load(), failures.Load(), firstErr
	r.maxInside, r.overLimit = maxInside.Load(), over.Load()
	r.perS = float64(r.acquisitions) / elapsed.Seconds()
	return r, nil
}

// modeResults are the shared-mode scenario's results of one library.
type modeResults struct {
	lib   modeLib
	read  modeResult // dlock.WithShared()
	sem   modeResult // dlock.WithLimit(semLimit)
	floor modeResult // the owner-less counter (if the library has one)
	errs  []string
}

// modesAll measures every mode library of the run's groups: n readers
// with WithShared, then n contenders for WithLimit(semLimit), then the
// counter floor, d each.
func modesAll(e *env, groups map[string]bool, n int, d time.Duration) []modeResults {
	var out []modeResults
	for _, ml := range modeLibraries(e) {
		if !groups[ml.group] {
			continue
		}
		res := modeResults{lib: ml}
		run := func(what string, dst *modeResult, mk func() (locker, error), limit int) {
			progress("modes        %-26s %s (%d contenders, %v)", ml.name, what, n, d)
			r, err := modeRun(mk, n, limit, d)
			if err != nil {
				res.errs = append(res.errs, fmt.Sprintf("%s %s: %v", ml.name, what, err))
			}
			*dst = r
		}
		run("read lock", &res.read, withMode(ml.newLocker, dlock.WithShared()), 0)
		run(fmt.Sprintf("semaphore (limit %d)", semLimit), &res.sem, withMode(ml.newLocker, dlock.WithLimit(semLimit)), semLimit)
		if ml.semFloor != nil {
			run(fmt.Sprintf("counter floor (limit %d)", semLimit), &res.floor, ml.semFloor, semLimit)
		}
		out = append(out, res)
	}
	return out
}
