package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// supports reports whether the backend offers mode, skipping the test if it
// refuses it (with an error naming the mode, which testModes checks).
func supports(t *testing.T, h Harness, opt dlock.Option) bool {
	t.Helper()
	lk, err := h.New(t).TryAcquire(ctxT(t), Key(t), opt)
	if errors.Is(err, dlock.ErrUnsupported) {
		t.Skipf("the backend refuses the mode: %v", err)
		return false
	}
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	release(t, lk)
	return true
}

// ReadWrite: readers overlap, a writer excludes everyone, and a writer's
// token is above every token granted before it.
func testReadWrite(t *testing.T, h Harness) {
	if !supports(t, h, dlock.WithShared()) {
		return
	}
	key := Key(t)
	const readers, writers, rounds = 4, 2, 6
	var (
		mu                  sync.Mutex
		inR, inW, maxR      int
		maxToken            uint64
		violations          []string
		wg                  sync.WaitGroup
		errMu               sync.Mutex
		firstErr            error
		sawReadersOverlap   atomic.Bool
		readerRound, wRound atomic.Int32
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	enter := func(lk *dlock.Lock, writer bool) {
		mu.Lock()
		defer mu.Unlock()
		if writer {
			if inR > 0 || inW > 0 {
				violations = append(violations, fmt.Sprintf("writer %d entered with %d readers and %d writers inside", lk.Token(), inR, inW))
			}
			if lk.Token() <= maxToken {
				violations = append(violations, fmt.Sprintf("writer token %d not above an earlier grant's %d", lk.Token(), maxToken))
			}
			inW++
		} else {
			if inW > 0 {
				violations = append(violations, fmt.Sprintf("reader %d entered with a writer inside", lk.Token()))
			}
			inR++
			maxR = max(maxR, inR)
			if inR > 1 {
				sawReadersOverlap.Store(true)
			}
		}
		maxToken = max(maxToken, lk.Token())
	}
	leave := func(writer bool) {
		mu.Lock()
		if writer {
			inW--
		} else {
			inR--
		}
		mu.Unlock()
	}
	run := func(writer bool, counter *atomic.Int32) {
		defer wg.Done()
		l := h.New(t)
		var opts []dlock.Option
		if !writer {
			opts = append(opts, dlock.WithShared())
		}
		for range rounds {
			lk, err := l.Acquire(ctxT(t), key, opts...)
			if err != nil {
				fail(fmt.Errorf("Acquire (writer %v): %w", writer, err))
				return
			}
			enter(lk, writer)
			time.Sleep(5 * time.Millisecond)
			leave(writer)
			if err := lk.Release(context.Background()); err != nil {
				fail(fmt.Errorf("Release (writer %v): %w", writer, err))
				return
			}
			counter.Add(1)
		}
	}
	// Readers first, holding long enough together to overlap.
	hold := make([]*dlock.Lock, readers)
	for i := range hold {
		hold[i] = mustAcquire(t, h.New(t), key, dlock.WithShared())
		enter(hold[i], false)
	}
	if !sawReadersOverlap.Load() {
		t.Fatal("shared holders did not overlap")
	}
	for _, lk := range hold {
		leave(false)
		release(t, lk)
	}
	for range readers {
		wg.Add(1)
		go run(false, &readerRound)
	}
	for range writers {
		wg.Add(1)
		go run(true, &wRound)
	}
	waitGroup(t, &wg, "readers and writers")
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	for _, v := range violations {
		t.Error(v)
	}
	if n := readerRound.Load() + wRound.Load(); n != (readers+writers)*rounds {
		t.Errorf("%d rounds completed, want %d", n, (readers+writers)*rounds)
	}
}

// waitGroup waits for wg, failing as a hang after HangTimeout.
func waitGroup(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	waitClosed(t, done, what+" to finish")
}

// writerWaiting blocks until a fresh shared TryAcquire on key is refused
// although no writer holds it: a writer is registered as waiting. Readers
// it gets meanwhile are released at once.
func writerWaiting(t *testing.T, l dlock.Locker, key string) {
	t.Helper()
	deadline := time.Now().Add(HangTimeout)
	for time.Now().Before(deadline) {
		lk, err := l.TryAcquire(ctxT(t), key, dlock.WithShared())
		if errors.Is(err, dlock.ErrNotAcquired) {
			return
		}
		if err != nil {
			t.Fatalf("shared TryAcquire: %v", err)
		}
		release(t, lk)
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("hang: a waiting writer never kept new readers out of %q within %v", key, HangTimeout)
}

type acquired struct {
	lk  *dlock.Lock
	err error
}

func acquireAsync(ctx context.Context, l dlock.Locker, key string, opts ...dlock.Option) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, opts...)
		ch <- acquired{lk, err}
	}()
	return ch
}

func recv(t *testing.T, ch <-chan acquired, what string) *dlock.Lock {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a.lk
	case <-time.After(HangTimeout):
		t.Fatalf("hang: %s did not return within %v", what, HangTimeout)
	}
	return nil
}

// WriterPreference: a waiting writer keeps new readers out, gets the key
// when the readers it waits for leave, before any reader that came after
// it; readers that keep overlapping cannot starve it; a writer that gives
// up stops keeping readers out.
func testWriterPreference(t *testing.T, h Harness) {
	if !supports(t, h, dlock.WithShared()) {
		return
	}
	t.Run("WaitingWriterFirst", func(t *testing.T) {
		key := Key(t)
		r1 := mustAcquire(t, h.New(t), key, dlock.WithShared())
		wch := acquireAsync(ctxT(t), h.New(t), key)
		probe := h.New(t)
		writerWaiting(t, probe, key)
		r2ch := acquireAsync(ctxT(t), probe, key, dlock.WithShared())
		release(t, r1)
		w := recv(t, wch, "the waiting writer's Acquire")
		select {
		case a := <-r2ch:
			t.Fatalf("a reader that came after the waiting writer got the key while the writer held it (err %v)", a.err)
		default:
		}
		if w.Token() <= r1.Token() {
			t.Errorf("writer token %d not above the reader's %d", w.Token(), r1.Token())
		}
		release(t, w)
		r2 := recv(t, r2ch, "the later reader's Acquire")
		if r2.Token() <= w.Token() {
			t.Errorf("reader token %d not above the writer's %d before it", r2.Token(), w.Token())
		}
		release(t, r2)
	})
	t.Run("NotStarved", func(t *testing.T) {
		// Readers keep overlapping (each takes the key again while the
		// others hold it): the writer still gets in, while they have
		// rounds left.
		key := Key(t)
		const readers, rounds = 3, 400
		stop := make(chan struct{})
		var (
			wg   sync.WaitGroup
			done atomic.Int32
			errs = make(chan error, readers)
		)
		for range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := h.New(t)
				for range rounds {
					select {
					case <-stop:
						return
					default:
					}
					lk, err := l.Acquire(ctxT(t), key, dlock.WithShared())
					if err != nil {
						errs <- err
						return
					}
					time.Sleep(2 * time.Millisecond)
					if err := lk.Release(context.Background()); err != nil {
						errs <- err
						return
					}
				}
				done.Add(1)
			}()
		}
		w := mustAcquire(t, h.New(t), key)
		finished := done.Load()
		release(t, w)
		close(stop)
		waitGroup(t, &wg, "readers")
		close(errs)
		for err := range errs {
			t.Errorf("reader: %v", err)
		}
		if finished == readers {
			t.Errorf("the writer got the key only after all %d readers finished their %d rounds: starved", readers, rounds)
		}
	})
	t.Run("WriterGivesUp", func(t *testing.T) {
		key := Key(t)
		r1 := mustAcquire(t, h.New(t), key, dlock.WithShared())
		defer release(t, r1)
		ctx, cancel := context.WithCancel(ctxT(t))
		wch := acquireAsync(ctx, h.New(t), key)
		probe := h.New(t)
		writerWaiting(t, probe, key)
		cancel()
		if a := <-wch; a.err == nil {
			a.lk.Release(context.Background())
			t.Fatal("the cancelled writer got the key while a reader held it")
		}
		// Its registration is withdrawn (or expires): readers are admitted
		// again while r1 still holds.
		r2 := mustAcquire(t, probe, key, dlock.WithShared(), dlock.WithWait(HangTimeout))
		release(t, r2)
	})
}

// Semaphore: never more than N permit holders at once, a mismatching
// limit is ErrLimitMismatch, and a holder that stopped renewing (crashed)
// frees its permit at its lease's expiry.
func testSemaphore(t *testing.T, h Harness) {
	if !supports(t, h, dlock.WithLimit(2)) {
		return
	}
	t.Run("AtMostN", func(t *testing.T) {
		t.Parallel()
		key := Key(t)
		const n, contenders, rounds = 3, 8, 4
		var (
			inside, most atomic.Int32
			wg           sync.WaitGroup
			errs         = make(chan error, contenders)
			tokens       sync.Map
		)
		for range contenders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := h.New(t)
				for range rounds {
					lk, err := l.Acquire(ctxT(t), key, dlock.WithLimit(n))
					if err != nil {
						errs <- err
						return
					}
					if _, dup := tokens.LoadOrStore(lk.Token(), true); dup {
						errs <- fmt.Errorf("token %d granted twice", lk.Token())
					}
					in := inside.Add(1)
					for {
						m := most.Load()
						if in <= m || most.CompareAndSwap(m, in) {
							break
						}
					}
					time.Sleep(5 * time.Millisecond)
					inside.Add(-1)
					if err := lk.Release(context.Background()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		waitGroup(t, &wg, "permit holders")
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if m := most.Load(); m > n {
			t.Fatalf("%d permit holders at once, limit %d", m, n)
		}
	})
	t.Run("LimitMismatch", func(t *testing.T) {
		t.Parallel()
		key := Key(t)
		p := mustAcquire(t, h.New(t), key, dlock.WithLimit(2))
		defer release(t, p)
		for _, try := range []bool{true, false} {
			var err error
			if try {
				_, err = h.New(t).TryAcquire(ctxT(t), key, dlock.WithLimit(5))
			} else {
				_, err = h.New(t).Acquire(ctxT(t), key, dlock.WithLimit(5))
			}
			if !errors.Is(err, dlock.ErrLimitMismatch) || !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("WithLimit(5) on a semaphore of 2 (try %v): %v, want ErrLimitMismatch", try, err)
			}
		}
	})
	t.Run("CrashedHolderFreed", func(t *testing.T) {
		t.Parallel()
		key := Key(t)
		live := mustAcquire(t, h.New(t), key, dlock.WithLimit(2))
		defer release(t, live)
		// The probe's connections are warmed first: its refusal must come
		// within the crashed holder's short lease.
		probe := h.New(t)
		warm := mustAcquire(t, probe, Key(t))
		release(t, warm)
		// A holder that stops renewing, as a crashed one would. (The core
		// releases a lease it lost, at its local deadline; a process that
		// died leaves it to expire on the server: the backends' own tests
		// cover that.)
		crashed := mustAcquire(t, h.New(t), key, dlock.WithLimit(2), dlock.WithTTL(h.TTL), dlock.WithAutoRefresh(false))
		third, err := probe.TryAcquire(ctxT(t), key, dlock.WithLimit(2))
		switch {
		case err == nil && isClosed(crashed.Lost()):
			// The machine was slower than the crashed holder's lease: it
			// was already gone, so the permit was free.
			release(t, third)
		case err == nil:
			release(t, third)
			t.Fatal("a third permit of 2 was granted while both holders held")
		case !errors.Is(err, dlock.ErrNotAcquired):
			t.Fatalf("third permit of 2: %v, want ErrNotAcquired", err)
		}
		p := mustAcquire(t, h.New(t), key, dlock.WithLimit(2), dlock.WithWait(HangTimeout))
		defer release(t, p)
		select {
		case <-crashed.Lost():
		default:
			t.Fatal("a permit was granted while the holder that stopped renewing had not seen its loss")
		}
		if p.Token() <= crashed.Token() {
			t.Errorf("new permit token %d not above the crashed holder's %d", p.Token(), crashed.Token())
		}
	})
}

// FIFO: waiters get the key in the order they started waiting.
func testFIFO(t *testing.T, h Harness) {
	l := h.New(t)
	ls, ok := l.(dlock.Lister)
	if !ok {
		t.Skip("FIFO is checked through dlock.Lister's waiter count")
	}
	if _, err := ls.List(ctxT(t), ""); errors.Is(err, dlock.ErrUnsupported) {
		t.Skipf("FIFO is checked through dlock.Lister's waiter count; the Locker cannot list: %v", err)
	}
	key := Key(t)
	holder := mustAcquire(t, l, key)
	const n = 5
	chs := make([]<-chan acquired, n)
	for i := range n {
		chs[i] = acquireAsync(ctxT(t), h.New(t), key)
		deadline := time.Now().Add(HangTimeout)
		for {
			infos, err := ls.List(ctxT(t), key)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if len(infos) == 1 && infos[0].Key == key && infos[0].Waiters >= i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("hang: waiter %d never showed in List", i+1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	release(t, holder)
	last := holder.Token()
	for i, ch := range chs {
		lk := recv(t, ch, fmt.Sprintf("waiter %d", i+1))
		for j := i + 1; j < n; j++ {
			select {
			case a := <-chs[j]:
				t.Fatalf("waiter %d got the key while waiter %d, queued before it, held it (err %v)", j+1, i+1, a.err)
			default:
			}
		}
		if lk.Token() <= last {
			t.Errorf("waiter %d token %d not above %d", i+1, lk.Token(), last)
		}
		last = lk.Token()
		release(t, lk)
	}
}

// AcquireAll: all or nothing, one Lost() for the set, and no deadlock
// between callers taking overlapping sets in different orders.
func testAcquireAll(t *testing.T, h Harness) {
	t.Run("AllOrNothing", func(t *testing.T) {
		t.Parallel()
		base := Key(t)
		a, b, c := base+"/a", base+"/b", base+"/c"
		other := mustAcquire(t, h.New(t), b)
		l := h.New(t)
		if _, err := dlock.TryAcquireAll(ctxT(t), l, []string{c, b, a}); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquireAll with %q held: %v, want ErrNotAcquired", b, err)
		}
		ctx, cancel := context.WithTimeout(ctxT(t), 3*h.TTL)
		_, err := dlock.AcquireAll(ctx, l, []string{c, b, a})
		cancel()
		wantWaitEnded(t, fmt.Sprintf("AcquireAll with %q held until its deadline", b), err, context.DeadlineExceeded)
		for _, k := range []string{a, c} {
			lk, err := h.New(t).TryAcquire(ctxT(t), k)
			if err != nil {
				t.Fatalf("%q after a failed AcquireAll: %v, want it free", k, err)
			}
			release(t, lk)
		}
		release(t, other)
		s, err := dlock.AcquireAll(ctxT(t), l, []string{c, b, a, b})
		if err != nil {
			t.Fatalf("AcquireAll: %v", err)
		}
		locks := s.Locks()
		if len(locks) != 3 || locks[0].Key() != a || locks[1].Key() != b || locks[2].Key() != c {
			t.Fatalf("set locks %v, want a, b, c in order", locks)
		}
		if s.Lock(b) != locks[1] || s.Lock(base) != nil {
			t.Error("Set.Lock does not find its keys")
		}
		for _, k := range []string{a, b, c} {
			assertHeld(t, h.New(t), k)
		}
		if err := s.Release(ctxT(t)); err != nil {
			t.Fatalf("Set.Release: %v", err)
		}
		select {
		case <-s.Lost():
		default:
			t.Error("Set.Lost() open after Release")
		}
		for _, k := range []string{a, b, c} {
			lk, err := h.New(t).TryAcquire(ctxT(t), k)
			if err != nil {
				t.Fatalf("%q after Set.Release: %v", k, err)
			}
			release(t, lk)
		}
	})
	t.Run("NoDeadlock", func(t *testing.T) {
		t.Parallel()
		base := Key(t)
		keys := []string{base + "/x", base + "/y", base + "/z"}
		orders := [][]string{{keys[0], keys[1], keys[2]}, {keys[2], keys[1], keys[0]}, {keys[1], keys[2], keys[0]}}
		const rounds = 8
		var (
			wg     sync.WaitGroup
			inside atomic.Int32
			errs   = make(chan error, len(orders))
		)
		for _, order := range orders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := h.New(t)
				for range rounds {
					s, err := dlock.AcquireAll(ctxT(t), l, order)
					if err != nil {
						errs <- err
						return
					}
					if inside.Add(1) != 1 {
						errs <- errors.New("two sets with the same keys held at once")
					}
					inside.Add(-1)
					if err := s.Release(context.Background()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		waitGroup(t, &wg, "AcquireAll callers with keys in different orders (a deadlock?)")
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	if h.Expire != nil {
		t.Run("OneLost", func(t *testing.T) {
			base := Key(t)
			s, err := dlock.AcquireAll(ctxT(t), h.New(t), []string{base + "/1", base + "/2"}, dlock.WithTTL(h.TTL))
			if err != nil {
				t.Fatalf("AcquireAll: %v", err)
			}
			h.Expire(t, base+"/2")
			waitClosed(t, s.Lost(), "Set.Lost() after one of its keys expired")
			if err := s.Err(); !errors.Is(err, dlock.ErrLockLost) {
				t.Fatalf("Set.Err() = %v, want ErrLockLost", err)
			}
			if err := s.Release(ctxT(t)); !errors.Is(err, dlock.ErrLockLost) {
				t.Fatalf("Set.Release after a loss = %v, want ErrLockLost", err)
			}
			lk, err := h.New(t).TryAcquire(ctxT(t), base+"/1")
			if err != nil {
				t.Fatalf("the set's other key after Release: %v, want it free", err)
			}
			release(t, lk)
		})
	}
	t.Run("BadInput", func(t *testing.T) {
		l := h.New(t)
		for _, keys := range [][]string{nil, {}, {"ok", ""}, make([]string, dlock.MaxSetKeys+1)} {
			if _, err := dlock.AcquireAll(ctxT(t), l, keys); !errors.Is(err, dlock.ErrInvalidKey) {
				t.Errorf("AcquireAll(%d keys): %v, want ErrInvalidKey", len(keys), err)
			}
		}
		if _, err := dlock.AcquireAll(nil, l, []string{"k"}); !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck // nil context on purpose
			t.Errorf("AcquireAll(nil ctx): %v", err)
		}
	})
}

// RunOnce: replicas firing together run the job once per period; a quick
// job keeps the key for atLeastFor; a job past atMostFor is cancelled.
func testRunOnce(t *testing.T, h Harness) {
	t.Run("OncePerPeriod", func(t *testing.T) {
		t.Parallel()
		key := Key(t)
		const replicas, periods = 4, 2
		atLeast := 2 * h.TTL
		atMost := 4 * h.TTL
		if refusesAtLeastFor(t, h, atMost, atLeast) {
			// The backend cannot keep the key for atLeastFor; the
			// replicas still fire together, and the job lasts until
			// every other replica has returned.
			atLeast = 0
		}
		ls := make([]dlock.Locker, replicas)
		for i := range ls {
			// Replicas that have used their Locker before: a cold first
			// request may fail transiently (redlock counts a dial against
			// its per-node timeout), which RunOnce retries only a little;
			// this test is about one run per period.
			ls[i] = h.New(t)
			warm := mustAcquire(t, ls[i], Key(t))
			release(t, warm)
		}
		for p := range periods {
			var (
				runs, skipped atomic.Int32
				wg            sync.WaitGroup
				errs          = make(chan error, replicas)
				allIn         = make(chan struct{})
				allInOnce     sync.Once
			)
			// allIn closes once every replica either returned without
			// running the job or is running it: the job waits for it,
			// so no replica fires after the run ended.
			settled := func() {
				if runs.Load()+skipped.Load() == replicas {
					allInOnce.Do(func() { close(allIn) })
				}
			}
			start := make(chan struct{})
			for _, l := range ls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ran, err := dlock.RunOnce(ctxT(t), l, key, atMost, atLeast, func(ctx context.Context) error {
						runs.Add(1)
						settled()
						select {
						case <-allIn:
							return nil
						case <-ctx.Done():
							return context.Cause(ctx)
						}
					}, dlock.WithTTL(max(atLeast, h.TTL)))
					if err != nil {
						errs <- err
					}
					if !ran {
						skipped.Add(1)
						settled()
					}
				}()
			}
			close(start)
			waitGroup(t, &wg, "replicas")
			close(errs)
			for err := range errs {
				t.Errorf("period %d: %v", p, err)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("period %d: the job ran %d times, want once", p, n)
			}
			if atLeast > 0 {
				// A late replica, after the run: the key is still held
				// (atLeastFor), so it skips.
				ran, err := dlock.RunOnce(ctxT(t), h.New(t), key, atMost, atLeast, func(ctx context.Context) error { return nil }, dlock.WithTTL(atLeast))
				if err != nil || ran {
					t.Fatalf("period %d: a late replica ran=%v err=%v; want it skipped while atLeastFor lasts", p, ran, err)
				}
			}
			// The next period begins once the key is free.
			lk := mustAcquire(t, h.New(t), key, dlock.WithWait(HangTimeout))
			release(t, lk)
		}
	})
	// Symptom: with atMostFor equal to atLeastFor, the lock's cap (and
	// local deadline), which the drift allowance puts before atLeastFor,
	// released the key when it fired, and a late replica ran the job
	// again within atLeastFor. The key stays taken for atLeastFor.
	t.Run("AtLeastForOutlivesALoss", func(t *testing.T) {
		t.Parallel()
		key := Key(t)
		atLeast := 2 * h.TTL
		if refusesAtLeastFor(t, h, atLeast, atLeast) {
			t.Skip("the backend cannot keep the key for atLeastFor")
		}
		// A drift allowance of 40% of the TTL: the lock is lost at 60% of
		// atLeastFor, and the late replica fires at 80% of it.
		start := time.Now()
		ran, err := dlock.RunOnce(ctxT(t), h.New(t), key, atLeast, atLeast, func(context.Context) error { return nil },
			dlock.WithTTL(atLeast), dlock.WithDrift(0.4, time.Millisecond))
		if !ran || err != nil {
			t.Fatalf("RunOnce on a free key: ran=%v err=%v", ran, err)
		}
		time.Sleep(time.Until(start.Add(atLeast * 4 / 5)))
		ran, err = dlock.RunOnce(ctxT(t), h.New(t), key, atLeast, atLeast, func(context.Context) error { return nil }, dlock.WithTTL(atLeast))
		if err != nil || ran {
			t.Fatalf("a late replica within atLeastFor, after the first lock was lost at its cap: ran=%v err=%v; want it skipped", ran, err)
		}
	})
	t.Run("AtMostFor", func(t *testing.T) {
		t.Parallel()
		key := Key(t)
		atMost := 3 * h.TTL
		ran, err := dlock.RunOnce(ctxT(t), h.New(t), key, atMost, 0, func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(HangTimeout):
				return errors.New("hang: the job's context was not cancelled at atMostFor")
			}
		}, dlock.WithTTL(h.TTL))
		if !ran || !errors.Is(err, dlock.ErrHoldCapReached) || !errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("a job past atMostFor: ran=%v err=%v, want ran and ErrHoldCapReached", ran, err)
		}
		lk := mustAcquire(t, h.New(t), key, dlock.WithWait(HangTimeout))
		release(t, lk)
	})
	t.Run("BadInput", func(t *testing.T) {
		l := h.New(t)
		job := func(context.Context) error { return nil }
		cases := []struct {
			name            string
			atMost, atLeast time.Duration
			fn              func(context.Context) error
			opts            []dlock.Option
		}{
			{"zero atMostFor", 0, 0, job, nil},
			{"negative atLeastFor", time.Second, -1, job, nil},
			{"atLeastFor above atMostFor", time.Second, 2 * time.Second, job, nil},
			{"huge atMostFor", dlock.MaxTTL + 1, 0, job, nil},
			{"nil job", time.Second, 0, nil, nil},
			{"TTL below atLeastFor", 10 * time.Second, 5 * time.Second, job, []dlock.Option{dlock.WithTTL(time.Second)}},
			{"shared", time.Minute, 0, job, []dlock.Option{dlock.WithShared()}},
			{"limit 2", time.Minute, 0, job, []dlock.Option{dlock.WithLimit(2)}},
			{"max hold below atLeastFor", time.Minute, 10 * time.Second, job, []dlock.Option{dlock.WithMaxHold(time.Second)}},
		}
		for _, c := range cases {
			ran, err := dlock.RunOnce(ctxT(t), l, Key(t), c.atMost, c.atLeast, c.fn, c.opts...)
			if ran || !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("%s: ran=%v err=%v, want ErrInvalidOption", c.name, ran, err)
			}
		}
	})
}

// refusesAtLeastFor reports whether RunOnce on this backend refuses
// atLeastFor (with atMostFor) before running the job, trying it once on
// a key of its own.
func refusesAtLeastFor(t *testing.T, h Harness, atMost, atLeast time.Duration) bool {
	t.Helper()
	var runs atomic.Int32
	ran, err := dlock.RunOnce(ctxT(t), h.New(t), Key(t), atMost, atLeast, func(context.Context) error {
		runs.Add(1)
		return nil
	}, dlock.WithTTL(atLeast))
	if refusedBounds(t, "RunOnce", ran, err, &runs) {
		return true
	}
	if !ran || err != nil {
		t.Fatalf("RunOnce on a free key: ran=%v err=%v", ran, err)
	}
	return false
}

// refusedBounds reports whether a RunOnce call refused its bounds: an
// error wrapping ErrInvalidOption, and the job not run. A refusal after
// the job ran fails the test.
func refusedBounds(t *testing.T, what string, ran bool, err error, runs *atomic.Int32) bool {
	t.Helper()
	if !errors.Is(err, dlock.ErrInvalidOption) {
		return false
	}
	if ran || runs.Load() != 0 {
		t.Fatalf("%s refused its bounds after running the job (ran=%v, %d runs): %v", what, ran, runs.Load(), err)
	}
	t.Logf("%s refused its bounds before running the job: %v", what, err)
	return true
}

// RunOnceBounds: RunOnce either honours atLeastFor after its runner exits
// cleanly and after it crashes, and atMostFor for a runner that died, or
// refuses the bounds before running the job (ErrInvalidOption). Each
// violation is an ordering, not a latency: another replica ran the job
// from an attempt sent before atLeastFor had passed since the runner's
// attempt was sent; another replica found the key held by an attempt sent
// more than atMostFor after the runner died (plus half of it for an
// in-flight renewal the server handles late). A crash is a runner whose
// link is cut in its job (Faults.New); a clean exit closes the runner's
// client (NewExiting) or abandons it.
func testRunOnceBounds(t *testing.T, h Harness) {
	t.Run("AtLeastForAfterCleanExit", func(t *testing.T) {
		t.Parallel()
		key := Key(t)
		atLeast := 3 * h.TTL
		atMost := 2 * atLeast
		l, exit := h.New(t), func() {}
		if h.NewExiting != nil {
			l, exit = h.NewExiting(t)
		}
		var runs atomic.Int32
		job := func(context.Context) error {
			runs.Add(1)
			return nil
		}
		began := time.Now()
		ran, err := dlock.RunOnce(ctxT(t), l, key, atMost, atLeast, job, dlock.WithTTL(atLeast))
		if refusedBounds(t, "the runner's RunOnce", ran, err, &runs) {
			return
		}
		if !ran || err != nil {
			t.Fatalf("the runner's RunOnce on a free key: ran=%v err=%v", ran, err)
		}
		exit()
		sent := time.Now()
		ran, err = dlock.RunOnce(ctxT(t), h.New(t), key, atMost, atLeast, job, dlock.WithTTL(atLeast))
		switch {
		case err != nil:
			t.Fatalf("another replica's RunOnce: %v", err)
		case ran && sent.Before(began.Add(atLeast)):
			t.Fatalf("after the runner's clean exit another replica ran the job again from an attempt sent %v after the runner's, within atLeastFor %v", sent.Sub(began), atLeast)
		case ran:
			t.Logf("inconclusive: the other replica's attempt was sent %v after the runner's, past atLeastFor %v", sent.Sub(began), atLeast)
		}
	})
	t.Run("AtLeastForAfterCrash", func(t *testing.T) {
		t.Parallel()
		atLeast := 3 * h.TTL
		crashed(t, h, 2*atLeast, atLeast, func(key string, began, died time.Time, other dlock.Locker) {
			var runs atomic.Int32
			for {
				sent := time.Now()
				if !sent.Before(began.Add(atLeast)) {
					return
				}
				ran, err := dlock.RunOnce(ctxT(t), other, key, 2*atLeast, atLeast, func(context.Context) error {
					runs.Add(1)
					return nil
				}, dlock.WithTTL(atLeast))
				switch {
				case err != nil:
					t.Fatalf("another replica's RunOnce: %v", err)
				case ran:
					t.Fatalf("after the runner crashed another replica ran the job again from an attempt sent %v after the runner's, within atLeastFor %v", sent.Sub(began), atLeast)
				}
				time.Sleep(h.TTL / 10)
			}
		})
	})
	for _, atMost := range []time.Duration{h.TTL / 2, 2 * h.TTL} {
		t.Run(fmt.Sprintf("AtMostForDeadRunner/%v", atMost), func(t *testing.T) {
			t.Parallel()
			crashed(t, h, atMost, 0, func(key string, began, died time.Time, other dlock.Locker) {
				for {
					sent := time.Now()
					ran, err := dlock.RunOnce(ctxT(t), other, key, atMost, 0, func(context.Context) error { return nil })
					switch {
					case err != nil:
						t.Fatalf("another replica's RunOnce: %v", err)
					case ran:
						t.Logf("the dead runner's key was free for an attempt sent %v after it died (atMostFor %v)", sent.Sub(died), atMost)
						return
					case sent.After(died.Add(atMost + atMost/2)):
						t.Fatalf("a dead runner kept the key past atMostFor %v: held for an attempt sent %v after it died", atMost, sent.Sub(died))
					}
					time.Sleep(atMost / 20)
				}
			})
		})
	}
}

// crashed starts a runner's RunOnce(atMost, atLeast) on a fresh key
// through a Faults link and cuts the link once the job runs: the runner
// dies in its job. check then plays the other replicas, with the key, the
// time before the runner's attempt was sent, the time after it died and
// a Locker of its own. A refusal of the bounds ends the test before
// check; so does a harness without Faults.New (no way to kill a runner).
func crashed(t *testing.T, h Harness, atMost, atLeast time.Duration, check func(key string, began, died time.Time, other dlock.Locker)) {
	t.Helper()
	if h.Faults == nil || h.Faults.New == nil {
		t.Skip("the harness has no Faults.New: no runner to crash")
	}
	key := Key(t)
	l, link := faulty(t, h.Faults)
	other := h.New(t)
	var runs atomic.Int32
	started, done := make(chan struct{}), make(chan struct{})
	var (
		ran bool
		err error
	)
	ctx, cancel := context.WithTimeout(context.Background(), HangTimeout)
	defer cancel()
	began := time.Now()
	go func() {
		defer close(done)
		ran, err = dlock.RunOnce(ctx, l, key, atMost, atLeast, func(ctx context.Context) error {
			runs.Add(1)
			close(started)
			<-ctx.Done() // the runner dies in its job
			return nil
		}, dlock.WithTTL(max(atLeast, min(h.TTL, atMost))))
	}()
	select {
	case <-started:
	case <-done:
		if refusedBounds(t, "the runner's RunOnce", ran, err, &runs) {
			return
		}
		t.Fatalf("the runner's RunOnce on a free key: ran=%v err=%v", ran, err)
	case <-time.After(HangTimeout):
		t.Fatal("hang: the runner's job did not start")
	}
	link.Cut()
	died := time.Now()
	check(key, began, died, other)
	cancel() // the dead runner's RunOnce returns; its release meets the cut link
	waitClosed(t, done, "the dead runner's RunOnce returning")
}

// ConcurrentSharedTry: readers that TryAcquire at the same moment on a key
// only readers hold all get in: only an exclusive holder or a waiting
// writer refuses a reader. The same for permits while fewer than the
// limit are held.
func testConcurrentSharedTry(t *testing.T, h Harness) {
	if !supports(t, h, dlock.WithShared()) {
		return
	}
	for _, m := range []struct {
		name string
		opt  dlock.Option
	}{{"Shared", dlock.WithShared()}, {"Limited", dlock.WithLimit(64)}} {
		t.Run(m.name, func(t *testing.T) {
			key := Key(t)
			first := mustAcquire(t, h.New(t), key, m.opt)
			defer release(t, first)
			const n = 8
			ls := make([]dlock.Locker, n)
			for i := range ls {
				ls[i] = h.New(t)
				warm := mustAcquire(t, ls[i], Key(t))
				release(t, warm)
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			locks := make([]*dlock.Lock, n)
			start := make(chan struct{})
			for i, l := range ls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					locks[i], errs[i] = l.TryAcquire(ctxT(t), key, m.opt)
				}()
			}
			close(start)
			waitGroup(t, &wg, "concurrent TryAcquires")
			for i, err := range errs {
				if err != nil {
					t.Errorf("TryAcquire %d of %d at once on a key only compatible holders hold: %v", i+1, n, err)
					continue
				}
				release(t, locks[i])
			}
		})
	}
}
