package etcdlock_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// Many readers TryAcquire a key that only readers hold, all at once, from
// separate clients: with no writer anywhere, every one of them must get
// it (a shared request is refused only by an exclusive holder or a
// waiting writer).
func TestRedTeam14_ConcurrentSharedTryAllGranted(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	const n = 16
	ls := make([]*etcdlock.Locker, n)
	for i := range ls {
		ls[i] = etcdlock.New(newClient(t, c.Endpoints()))
	}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, n)
		lks := make([]*dlock.Lock, n)
		for i := range ls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				lks[i], errs[i] = ls[i].TryAcquire(ctx, key, dlock.WithShared())
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d reader %d refused while only readers hold: %v", round, i, err)
			}
		}
		for _, lk := range lks {
			if lk != nil {
				rel(t, lk)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// The same for permits: n TryAcquire of a semaphore of n at once, from
// separate clients, on a free key: all are granted, and an n+1th is not.
func TestRedTeam14_ConcurrentLimitedTryFillsExactly(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	const n = 8
	ls := make([]*etcdlock.Locker, n+4)
	for i := range ls {
		ls[i] = etcdlock.New(newClient(t, c.Endpoints()))
	}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	var wg sync.WaitGroup
	start := make(chan struct{})
	var okN, refused atomic.Int32
	lks := make([]*dlock.Lock, len(ls))
	errs := make([]error, len(ls))
	for i := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			lks[i], errs[i] = ls[i].TryAcquire(ctx, key, dlock.WithLimit(n))
			if errs[i] == nil {
				okN.Add(1)
			} else if errors.Is(errs[i], dlock.ErrNotAcquired) {
				refused.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if okN.Load() > n {
		t.Fatalf("%d permits of %d granted", okN.Load(), n)
	}
	if okN.Load() != n {
		t.Errorf("only %d of %d permits granted to %d concurrent TryAcquire on a free key: %v", okN.Load(), n, len(ls), errs)
	}
	for _, lk := range lks {
		if lk != nil {
			rel(t, lk)
		}
	}
}

// A reader's Release whose reply is lost: the release is retried (or
// settled) and a writer waiting behind the reader gets the key long before
// the reader's lease (1 min) would expire.
func TestRedTeam14_SharedLostReleaseReply(t *testing.T) {
	t.Parallel()
	c, l, lossy := lossyLocker(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	ttl := dlock.WithTTL(time.Minute)
	r, err := l.Acquire(dlocktest.Context(t), key, dlock.WithShared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := other.Acquire(dlocktest.Context(t), key, dlock.WithShared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	wch := acquireBG(t, nil, other, key, ttl)
	awaitQueueLen(t, newClient(t, c.Endpoints()), other, key, 3)
	lost := lossy.arm(txnDeleteUnder(l.QueuePrefix(key)))
	err = r.Release(dlocktest.Context(t))
	mustHaveLost(t, lost, "the reader's Release")
	t.Logf("release with a lost reply: %v", err)
	if err == nil || errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release whose reply was lost = %v, want an error that is not ErrNotHeld", err)
	}
	// Retried by the caller, as the README tells.
	if err := r.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("retried release: %v", err)
	}
	rel(t, r2)
	select {
	case a := <-wch:
		if a.err != nil {
			t.Fatalf("writer: %v", a.err)
		}
		if a.lk.Token() <= r2.Token() {
			t.Fatalf("writer token %d not above reader's %d", a.lk.Token(), r2.Token())
		}
		rel(t, a.lk)
	case <-time.After(15 * time.Second):
		t.Fatal("the writer still waits: the reader's entry survived its lost release")
	}
}

// A semaphore of 1 is exclusive among permits, and a holder of another
// limit, a reader or a writer cannot join it; the permit's token is below
// the next writer's.
func TestRedTeam14_LimitOne(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	l2 := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	p, err := l.TryAcquire(ctx, key, dlock.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l2.TryAcquire(ctx, key, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second permit of 1: %v", err)
	}
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second permit of 1 on the same Locker: %v", err)
	}
	if _, err := l2.TryAcquire(ctx, key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("permit of 2 on a semaphore of 1: %v", err)
	}
	if _, err := l2.TryAcquire(ctx, key, dlock.WithLimit(dlock.MaxLimit)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("permit of MaxLimit on a semaphore of 1: %v", err)
	}
	for _, o := range []dlock.Option{dlock.WithShared(), dlock.WithTTL(5 * time.Second)} {
		if _, err := l2.TryAcquire(ctx, key, o); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("other mode on a semaphore of 1: %v", err)
		}
	}
	wch := acquireBG(t, nil, l2, key)
	time.Sleep(300 * time.Millisecond)
	pending(t, wch, "writer behind a permit of 1")
	rel(t, p)
	w := got(t, wch, "writer")
	if w.Token() <= p.Token() {
		t.Fatalf("writer token %d <= permit's %d", w.Token(), p.Token())
	}
	rel(t, w)
	big, err := l.TryAcquire(ctx, key, dlock.WithLimit(dlock.MaxLimit))
	if err != nil {
		t.Fatalf("MaxLimit on a free key: %v", err)
	}
	rel(t, big)
}

// A permit whose holder died (its client gone, no release): a permit of
// another limit is refused with ErrLimitMismatch while that holder's lease
// lives, and granted, with a new limit, once it expired.
func TestRedTeam14_MismatchAgainstExpiredHolder(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	dead := newClient(t, c.Endpoints())
	ld := etcdlock.New(dead)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	if _, err := ld.Acquire(ctx, key, dlock.WithLimit(3), dlock.WithTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	dead.Close() // no release, no renewal
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(5)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("limit 5 against a live semaphore of 3: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var lk *dlock.Lock
	var err error
	for {
		lk, err = l.TryAcquire(actx, key, dlock.WithLimit(5))
		if err == nil || actx.Err() != nil {
			break
		}
		if !errors.Is(err, dlock.ErrLimitMismatch) && !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("unexpected: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the dead semaphore of 3 still blocks a semaphore of 5: %v", err)
	}
	rel(t, lk)
}

// Hierarchical names are separate locks in every mode: a writer of "a/b"
// while readers hold "a", a writer of "a" while permits hold "a/b".
func TestRedTeam14_HierarchicalKeysAcrossModes(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	l2 := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	a := dlocktest.Key(t)
	ab := a + "/b"
	r, err := l.TryAcquire(ctx, a, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	w, err := l2.TryAcquire(ctx, ab)
	if err != nil {
		t.Fatalf("writer of %q while readers hold %q: %v", ab, a, err)
	}
	rel(t, w)
	rel(t, r)
	p, err := l.TryAcquire(ctx, ab, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	w, err = l2.TryAcquire(ctx, a)
	if err != nil {
		t.Fatalf("writer of %q while a permit holds %q: %v", a, ab, err)
	}
	if _, err := l2.TryAcquire(ctx, ab, dlock.WithLimit(3)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("limit 3 on %q (semaphore of 2): %v", ab, err)
	}
	if _, err := l2.TryAcquire(ctx, a, dlock.WithShared()); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader of %q while a writer holds it: %v", a, err)
	}
	infos, err := l.List(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Key != a || infos[0].Mode != dlock.Exclusive || infos[1].Key != ab || infos[1].Mode != dlock.Limited || infos[1].Limit != 2 || len(infos[1].Holders) != 1 {
		t.Fatalf("List: %+v", infos)
	}
	rel(t, w)
	rel(t, p)
}

// Shared and limited attempts on a stalled link return by their context,
// TryAcquire and Acquire alike, and leave nothing holding the key.
func TestRedTeam14_StalledSharedAttemptsHonourContext(t *testing.T) {
	t.Parallel()
	c, l, p := proxied(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	r, err := other.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	// Warm l's connection and lease.
	warm, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release(context.Background())
	p.Stall()
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)} {
		for _, try := range []bool{true, false} {
			ctx, cancel := ctxFor(time.Second)
			done := make(chan error, 1)
			go func() {
				var err error
				if try {
					_, err = l.TryAcquire(ctx, key, opt)
				} else {
					_, err = l.Acquire(ctx, key, opt)
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("granted over a stalled link")
				}
			case <-time.After(dlocktest.HangTimeout):
				t.Fatalf("try=%v: hang past its context on a stalled link", try)
			}
			cancel()
		}
	}
	p.Heal()
	rel(t, r)
	ctx, cancel := ctxFor(15 * time.Second)
	defer cancel()
	w, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("writer after the stalled attempts: %v", err)
	}
	rel(t, w)
}

// TryAcquire (which may join the queue and leave again) and Acquire of
// readers, permits and writers from several clients on one key: never a
// writer with anyone else, never more permits than the limit, never
// readers with permits; every TryAcquire that found only compatible
// holders and no conflicting newcomer gets in.
func TestRedTeam14_MixedTryAcquireStress(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	const lockers, limit = 6, 3
	ls := make([]*etcdlock.Locker, lockers)
	for i := range ls {
		ls[i] = etcdlock.New(newClient(t, c.Endpoints()))
	}
	key := dlocktest.Key(t)
	var mu sync.Mutex
	var readers, permits, writers, grants int
	var bad []string
	check := func(dr, dp, dw int) {
		mu.Lock()
		defer mu.Unlock()
		readers, permits, writers = readers+dr, permits+dp, writers+dw
		if dr+dp+dw > 0 {
			grants++
		}
		if writers > 1 || (writers == 1 && readers+permits > 0) || permits > limit || (readers > 0 && permits > 0) {
			bad = append(bad, "readers "+itoa(readers)+" permits "+itoa(permits)+" writers "+itoa(writers))
		}
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := 0; g < 12; g++ {
		wg.Go(func() {
			l := ls[g%lockers]
			for time.Now().Before(deadline) {
				var opt dlock.Option = dlock.WithTTL(5 * time.Second)
				dr, dp, dw := 0, 0, 0
				switch g % 4 {
				case 0, 1:
					opt, dp = dlock.WithLimit(limit), 1
				case 2:
					opt, dr = dlock.WithShared(), 1
				default:
					dw = 1
				}
				var lk *dlock.Lock
				var err error
				ctx, cancel := ctxFor(2 * time.Second)
				if g < 6 {
					lk, err = l.TryAcquire(ctx, key, opt)
				} else {
					lk, err = l.Acquire(ctx, key, opt)
				}
				cancel()
				if err != nil {
					// ErrUnavailable: a request timed out on a loaded machine.
					if !errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, dlock.ErrUnavailable) {
						t.Errorf("attempt: %v", err)
						return
					}
					time.Sleep(5 * time.Millisecond)
					continue
				}
				check(dr, dp, dw)
				time.Sleep(10 * time.Millisecond)
				check(-dr, -dp, -dw)
				if err := lk.Release(dlocktest.Context(t)); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), bad[0])
	}
	if grants == 0 {
		t.Fatal("no grants")
	}
	t.Logf("%d grants", grants)
	// Nothing left behind: a writer gets the key at once.
	w, err := ls[0].TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		time.Sleep(time.Second) // background removal of refused joins
		if w, err = ls[0].TryAcquire(dlocktest.Context(t), key); err != nil {
			t.Fatalf("key still held after the stress: %v", err)
		}
	}
	rel(t, w)
}

func itoa(n int) string { return strconv.Itoa(n) }

// concurrency.Mutex TryLock and Lock race with dlock readers that
// TryAcquire (and so may join the queue and leave it again) and Acquire:
// a Mutex never holds together with a dlock reader.
func TestRedTeam14_MutexRacesSharedJoins(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	key := dlocktest.Key(t)
	var mu sync.Mutex
	var readers, mutexes int
	var bad []string
	check := func(dr, dm int) {
		mu.Lock()
		defer mu.Unlock()
		readers, mutexes = readers+dr, mutexes+dm
		if mutexes > 1 || (mutexes == 1 && readers > 0) {
			bad = append(bad, "readers "+itoa(readers)+" mutexes "+itoa(mutexes))
		}
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		cli := newClient(t, c.Endpoints())
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		wg.Go(func() {
			for time.Now().Before(deadline) {
				m := concurrency.NewMutex(s, key)
				ctx, cancel := ctxFor(2 * time.Second)
				var err error
				if g == 0 {
					err = m.TryLock(ctx)
				} else {
					err = m.Lock(ctx)
				}
				if err == nil {
					check(0, 1)
					time.Sleep(5 * time.Millisecond)
					check(0, -1)
					_ = m.Unlock(context.Background())
				} else if !errors.Is(err, concurrency.ErrLocked) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("mutex: %v", err)
				}
				cancel()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	for g := 0; g < 6; g++ {
		l := etcdlock.New(newClient(t, c.Endpoints()))
		wg.Go(func() {
			for time.Now().Before(deadline) {
				ctx, cancel := ctxFor(2 * time.Second)
				var lk *dlock.Lock
				var err error
				if g < 4 {
					lk, err = l.TryAcquire(ctx, key, dlock.WithShared())
				} else {
					lk, err = l.Acquire(ctx, key, dlock.WithShared())
				}
				cancel()
				if err != nil {
					if !errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("reader: %v", err)
					}
					time.Sleep(2 * time.Millisecond)
					continue
				}
				check(1, 0)
				time.Sleep(5 * time.Millisecond)
				check(-1, 0)
				_ = lk.Release(context.Background())
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), bad[0])
	}
}
