// Package dlocktest is the conformance suite every dlock backend runs. It
// checks the semantics of DESIGN §3 against a real server: mutual exclusion
// under contention, strictly increasing fencing tokens, owner-checked
// release and refresh, context handling, renewal, loss signalling, input
// validation and misuse (nil handles, concurrent releases, panics, odd and
// hierarchical keys, extreme TTLs), and, for network backends, a fault
// section: stalled links, a paused server, lost replies and refused or
// reset connections (ErrUnavailable, never a bare network error), where the
// promises are asserted as orderings ("the holder's Lost() closed before
// another client's successful attempt was sent") and outcomes, not
// latencies. A slow machine makes it slower, not red: every wait is
// bounded by HangTimeout and fails the test as a hang, and a call may
// overrun its context by OverrunBound before it counts as one.
package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// HangTimeout bounds every wait in the suite; exceeding it is reported as a
// hang, not as slowness.
const HangTimeout = 30 * time.Second

// Harness describes the backend under test.
type Harness struct {
	// New returns a Locker on the backend under test. Lockers from separate
	// calls must exclude each other and should use separate connections,
	// as separate processes would.
	New func(t testing.TB) dlock.Locker
	// TTL is the short lease used by the expiry and renewal tests. Zero
	// means 1s: the suite's tests run in parallel beside other packages'
	// tests, and a lease much shorter than that leaves a renewal under
	// -race on a loaded 2-core machine too little time.
	TTL time.Duration
	// Expire deletes key's lease on the server behind its holder's back,
	// as an expiry or an operator's DEL would.
	Expire func(t testing.TB, key string)
	// Contenders is the number of goroutines in the mutual-exclusion test.
	// Zero means 16.
	Contenders int
	// ShortTTL is the lease ShortTTLContention hands out under contention
	// (zero: 300ms). A backend whose waiting entries hold leases of that
	// length too (etcd) sets one a loaded machine renews in time: a
	// waiter whose lease expires queues again at the back.
	ShortTTL time.Duration
	// NoticesDeletion says the backend watches its leases on the server
	// (session backends) and closes Lost() when one is deleted, without
	// waiting for the next renewal; the suite then checks that it does.
	NoticesDeletion bool
	// TellsBroken says a dlock.Break reaches the broken holder's Lock at
	// once (a notice from the server, or a shared process's own state):
	// its Lost() closes within a few round trips, not at its next
	// renewal. The suite then checks that it does (Break/TellsHolder), as
	// it does for a backend that NoticesDeletion; for the others (no way
	// to learn of a break but to ask at the next renewal) that case is
	// skipped.
	TellsBroken bool
	// FIFO says the backend serves the waiters of a key in the order they
	// began waiting; the suite then checks that it does.
	FIFO bool
	// Faults wires the fault section (stalled links, a paused server, lost
	// replies, refused and reset connections). Every network backend must
	// provide it.
	Faults *Faults
	// NewExiting returns a Locker on a client of its own and a function
	// that ends that client the way its process's clean exit does: it
	// closes the client's connections (a ZooKeeper connection, and so its
	// session) without releasing the Locker's locks. A backend whose
	// leases end with their client's connection or session must set it.
	// Nil: a Locker from New stands for the exiting process, abandoned
	// with its locks, which is all a clean exit does to leases that live
	// on the server until they expire.
	NewExiting func(t testing.TB) (l dlock.Locker, exit func())
}

var keySeq atomic.Int64

// Key returns a key unique to this test run.
func Key(t testing.TB) string {
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return fmt.Sprintf("dlocktest.%s.%d.%d", name, time.Now().UnixNano(), keySeq.Add(1))
}

// Context returns a context for one test step: it ends after HangTimeout
// (so a hang fails as a hang, not as a test binary timeout) or when the
// test ends. Backend tests use it instead of a helper of their own.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), HangTimeout)
	t.Cleanup(cancel)
	return ctx
}

func ctxT(t testing.TB) context.Context { return Context(t) }

// holder is the first holder a NotAcquiredError names (zero if none).
func holder(na *dlock.NotAcquiredError) dlock.Holder {
	if len(na.Holders) == 0 {
		return dlock.Holder{}
	}
	return na.Holders[0]
}

func mustAcquire(t testing.TB, l dlock.Locker, key string, opts ...dlock.Option) *dlock.Lock {
	t.Helper()
	lk, err := l.Acquire(ctxT(t), key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return lk
}

func release(t testing.TB, lk *dlock.Lock) {
	t.Helper()
	if err := lk.Release(context.Background()); err != nil {
		t.Errorf("Release(%q): %v", lk.Key(), err)
	}
}

// waitClosed fails the test if ch is not closed within HangTimeout.
func waitClosed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(HangTimeout):
		t.Fatalf("hang: %s did not happen within %v", what, HangTimeout)
	}
}

// assertHeld checks that key is held by someone (a fresh TryAcquire fails).
func assertHeld(t testing.TB, l dlock.Locker, key string) {
	t.Helper()
	lk, err := l.TryAcquire(ctxT(t), key)
	if err == nil {
		lk.Release(context.Background())
		t.Fatalf("key %q was free, want it held", key)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) = %v, want ErrNotAcquired", key, err)
	}
}

// TestLocker runs the conformance suite. Its tests use keys of their own
// (Key), so they run in parallel with each other (t.Parallel, in the
// subtest group "Parallel"), except those that pause the server every
// Locker of the harness shares (Faults.Pause) or stall links to test an
// ordering at the holder's deadline: those run first, one at a time.
// TestLocker returns once every test has.
func TestLocker(t *testing.T, h Harness) {
	if h.TTL == 0 {
		h.TTL = time.Second
	}
	if h.Contenders == 0 {
		h.Contenders = 16
	}
	tests := []suiteTest{
		{"BadInput", testBadInput, false},
		{"TryAcquireHeld", testTryAcquireHeld, false},
		{"MutualExclusion", testMutualExclusion, false},
		{"TokensIncrease", testTokensIncrease, false},
		{"AcquireDeadline", testAcquireDeadline, false},
		{"AcquireCancel", testAcquireCancel, false},
		{"WithWait", testWithWait, false},
		{"WaiterWokenByRelease", testWaiterWoken, false},
		{"ReleaseTwice", testReleaseTwice, false},
		{"CancelledContextStillReleases", testCancelledRelease, false},
		{"HeldPast3TTL", testHeldPast3TTL, false},
		{"NoAutoRefreshLosesAtDeadline", testNoAutoRefresh, false},
		{"ManualRefresh", testManualRefresh, false},
		{"MaxHold", testMaxHold, false},
		{"LostWhenExpiredBehindBack", testLostOnExpire, false},
		{"ReleaseOfLostLockKeepsNewHolder", testReleaseLostKeepsNewHolder, false},
		{"Do", testDo, false},
		{"DoReportsLoss", testDoLoss, false},
		{"ConcurrentRelease", testConcurrentRelease, false},
		{"DoReleasesOnPanic", testDoPanics, false},
		{"NilArguments", testNilArgs, false},
		{"OddKeys", testOddKeys, false},
		{"HierarchicalKeys", testHierarchicalKeys, false},
		{"LongTTL", testLongTTL, false},
		{"ShortTTLContention", testShortTTLContention, false},
		{"Modes", testModes, false},
		{"ReadWrite", testReadWrite, false},
		{"WriterPreference", testWriterPreference, false},
		{"ConcurrentSharedTry", testConcurrentSharedTry, false},
		{"Semaphore", testSemaphore, false},
		{"AcquireAll", testAcquireAll, false},
		{"RunOnce", testRunOnce, false},
		{"RunOnceBounds", testRunOnceBounds, false},
		{"List", testList, false},
		{"Break", testBreak, false},
	}
	if h.NoticesDeletion {
		tests = append(tests, suiteTest{"DeletionNoticed", testDeletionNoticed, false})
	}
	if h.FIFO {
		tests = append(tests, suiteTest{"FIFO", testFIFO, false})
	}
	if h.Faults != nil {
		tests = append(tests, suiteTest{"Faults", testFaults, true})
		if h.Faults.Pause != nil {
			tests = append(tests, suiteTest{"BreakAgainstPausedServer", testBreakPaused, true})
		}
		if h.Faults.New != nil {
			tests = append(tests, suiteTest{"Unreachable", testUnreachable, false})
		}
	}
	for _, tc := range tests {
		if tc.exclusive {
			t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
		}
	}
	// The group returns once its parallel tests have: TestLocker returns
	// with every test done, so a harness may stop its servers with defer.
	t.Run("Parallel", func(t *testing.T) {
		for _, tc := range tests {
			if !tc.exclusive {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.fn(t, h)
				})
			}
		}
	})
}

// suiteTest is one test of the suite; an exclusive one runs while no
// other test of the suite does.
type suiteTest struct {
	name      string
	fn        func(*testing.T, Harness)
	exclusive bool
}

func testBadInput(t *testing.T, h Harness) {
	l := h.New(t)
	ctx := ctxT(t)
	cases := []struct {
		name string
		key  string
		opts []dlock.Option
		want error
	}{
		{"empty key", "", nil, dlock.ErrInvalidKey},
		{"oversized key", strings.Repeat("k", dlock.MaxKeyLen+1), nil, dlock.ErrInvalidKey},
		{"invalid utf-8", "bad\xff", nil, dlock.ErrInvalidKey},
		{"zero ttl", Key(t), []dlock.Option{dlock.WithTTL(0)}, dlock.ErrInvalidTTL},
		{"negative ttl", Key(t), []dlock.Option{dlock.WithTTL(-time.Second)}, dlock.ErrInvalidTTL},
		{"ttl below minimum", Key(t), []dlock.Option{dlock.WithTTL(time.Millisecond)}, dlock.ErrInvalidTTL},
		{"negative wait", Key(t), []dlock.Option{dlock.WithWait(-1)}, dlock.ErrInvalidOption},
		{"negative max hold", Key(t), []dlock.Option{dlock.WithMaxHold(-1)}, dlock.ErrInvalidOption},
		{"oversized metadata", Key(t), []dlock.Option{dlock.WithMetadata("m", strings.Repeat("x", dlock.MaxMetadataLen+1))}, dlock.ErrInvalidOption},
	}
	for _, c := range cases {
		for _, try := range []bool{false, true} {
			var err error
			if try {
				_, err = l.TryAcquire(ctx, c.key, c.opts...)
			} else {
				_, err = l.Acquire(ctx, c.key, c.opts...)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("%s (try=%v): err = %v, want %v", c.name, try, err, c.want)
			}
		}
	}
	// The documented limits themselves are accepted. The key ends in the
	// test's unique key, and the lease is the default one: a 500ms lease
	// ran out on a loaded machine between Acquire and Release.
	base := Key(t)
	lk := mustAcquire(t, l, strings.Repeat("k", dlock.MaxKeyLen-len(base))+base)
	release(t, lk)
}

func testTryAcquireHeld(t *testing.T, h Harness) {
	a, b := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, a, key, dlock.WithMetadata("job", "nightly"))
	defer release(t, lk)
	if lk.Key() != key || lk.Token() == 0 || len(lk.Owner()) != 32 {
		t.Fatalf("lock = key %q token %d owner %q", lk.Key(), lk.Token(), lk.Owner())
	}
	_, err := b.TryAcquire(ctxT(t), key)
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on held key: %v, want ErrNotAcquired", err)
	}
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) || na.Key != key {
		t.Fatalf("error %v is not a *NotAcquiredError for %q", err, key)
	}
	if h := holder(na); h.Owner != "" && h.Owner != lk.Owner() {
		t.Errorf("NotAcquiredError holder = %q, want %q", h.Owner, lk.Owner())
	}
	select {
	case <-lk.Lost():
		t.Fatal("Lost closed while held")
	default:
	}
	if lk.Err() != nil {
		t.Fatalf("Err() = %v while held", lk.Err())
	}
}

func testMutualExclusion(t *testing.T, h Harness) {
	key := Key(t)
	const rounds = 4
	lockers := make([]dlock.Locker, h.Contenders)
	for i := range lockers {
		lockers[i] = h.New(t)
	}
	var (
		inside     atomic.Int32
		violations atomic.Int32
		// counter and lastToken are read-modify-written under the lock
		// only. They are atomics so the race detector, which cannot see
		// the backend's synchronization, stays quiet; a lost update still
		// shows because the read and the write are separate.
		counter   atomic.Int64
		lastToken atomic.Uint64
		tokenErrs atomic.Int32
		wg        sync.WaitGroup
		errs      = make(chan error, h.Contenders)
	)
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				lk, err := l.Acquire(ctxT(t), key, dlock.WithMetadata("worker", fmt.Sprint(i)))
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", i, err)
					return
				}
				if inside.Add(1) != 1 {
					violations.Add(1)
				}
				if lk.Token() <= lastToken.Load() {
					tokenErrs.Add(1)
				}
				lastToken.Store(lk.Token())
				c := counter.Load()
				time.Sleep(time.Millisecond) // widen the race window
				counter.Store(c + 1)
				inside.Add(-1)
				if err := lk.Release(context.Background()); err != nil {
					errs <- fmt.Errorf("worker %d release: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if v := violations.Load(); v != 0 {
		t.Errorf("%d mutual-exclusion violations", v)
	}
	if n := tokenErrs.Load(); n != 0 {
		t.Errorf("%d tokens did not increase", n)
	}
	if want := int64(h.Contenders * rounds); counter.Load() != want {
		t.Errorf("counter = %d, want %d (lost updates)", counter.Load(), want)
	}
}

func testTokensIncrease(t *testing.T, h Harness) {
	ls := []dlock.Locker{h.New(t), h.New(t)}
	key := Key(t)
	var last uint64
	for i := 0; i < 20; i++ {
		lk := mustAcquire(t, ls[i%2], key)
		if lk.Token() <= last {
			t.Fatalf("acquisition %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		release(t, lk)
	}
	// Tokens of different keys are independent but never zero.
	lk := mustAcquire(t, ls[0], Key(t))
	defer release(t, lk)
	if lk.Token() == 0 {
		t.Fatal("token 0")
	}
}

func holdKey(t *testing.T, h Harness) (string, *dlock.Lock) {
	key := Key(t)
	lk := mustAcquire(t, h.New(t), key)
	t.Cleanup(func() { lk.Release(context.Background()) })
	return key, lk
}

func testAcquireDeadline(t *testing.T, h Harness) {
	key, _ := holdKey(t, h)
	l := warmWaiter(t, h, key)
	// Long enough for a loaded server to answer the wait's first request
	// (a queue entry, a lease): a wait that ends before any answer is
	// rightly an outage (ErrUnavailable), not a held key.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, key)
		done <- err
	}()
	select {
	case err := <-done:
		wantWaitEnded(t, "Acquire past deadline", err, context.DeadlineExceeded)
	case <-time.After(HangTimeout):
		t.Fatal("hang: Acquire ignored its context deadline")
	}
}

// wantWaitEnded checks the error of a blocking Acquire whose wait for a
// held key ended by cause: ErrNotAcquired (a holder was seen); or, when
// the core abandoned an attempt still unanswered a grace after the end
// (a loaded machine), ErrUnavailable saying so. An error the backend
// itself returned at the end (a reset connection, say) is neither. The
// core's own tests make each case happen on a clock they control.
func wantWaitEnded(t testing.TB, what string, err, cause error) {
	t.Helper()
	if !errors.Is(err, cause) {
		t.Fatalf("%s: %v, want it to wrap %v", what, err, cause)
	}
	switch {
	case errors.Is(err, dlock.ErrNotAcquired):
	case errors.Is(err, dlock.ErrUnavailable) && strings.Contains(err.Error(), abandonedAttempt):
		t.Logf("%s: the last attempt was unanswered at the end: %v", what, err)
	default:
		t.Fatalf("%s: %v, want ErrNotAcquired (or ErrUnavailable for an attempt the core abandoned unanswered)", what, err)
	}
}

// abandonedAttempt is how the core's error says it abandoned an attempt
// that had not answered when the wait ended.
const abandonedAttempt = "no answer before the context ended"

// warmWaiter returns a Locker that has seen key's holder once: a fresh
// Locker's first attempt (connecting, a first-use migration) may still be
// unanswered when a short wait ends on a loaded machine, and a wait that
// ends before any answer is rightly an outage (ErrUnavailable), not a
// held key.
func warmWaiter(t *testing.T, h Harness, key string) dlock.Locker {
	t.Helper()
	l := h.New(t)
	if _, err := l.TryAcquire(Context(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
	}
	return l
}

func testAcquireCancel(t *testing.T, h Harness) {
	key, _ := holdKey(t, h)
	l := warmWaiter(t, h, key)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, key)
		done <- err
	}()
	time.Sleep(time.Second) // the wait is under way (its first request answered, most likely)
	cancel()
	select {
	case err := <-done:
		wantWaitEnded(t, "cancelled Acquire", err, context.Canceled)
	case <-time.After(HangTimeout):
		t.Fatal("hang: Acquire ignored cancellation")
	}
}

func testWithWait(t *testing.T, h Harness) {
	key, _ := holdKey(t, h)
	_, err := warmWaiter(t, h, key).Acquire(ctxT(t), key, dlock.WithWait(2*time.Second))
	wantWaitEnded(t, "Acquire WithWait", err, context.DeadlineExceeded)
}

func testWaiterWoken(t *testing.T, h Harness) {
	key := Key(t)
	holder := mustAcquire(t, h.New(t), key)
	got := make(chan *dlock.Lock, 1)
	errc := make(chan error, 1)
	go func() {
		lk, err := h.New(t).Acquire(ctxT(t), key)
		if err != nil {
			errc <- err
			return
		}
		got <- lk
	}()
	time.Sleep(50 * time.Millisecond)
	tok := holder.Token()
	release(t, holder)
	select {
	case lk := <-got:
		if lk.Token() <= tok {
			t.Errorf("waiter token %d <= previous %d", lk.Token(), tok)
		}
		release(t, lk)
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(HangTimeout):
		t.Fatal("hang: waiter not woken after release")
	}
}

func testReleaseTwice(t *testing.T, h Harness) {
	l := h.New(t)
	key := Key(t)
	lk := mustAcquire(t, l, key)
	release(t, lk)
	release(t, lk)
	if !errors.Is(lk.Err(), dlock.ErrReleased) {
		t.Fatalf("Err() after release = %v, want ErrReleased", lk.Err())
	}
	waitClosed(t, lk.Lost(), "Lost() closing on release")
	if err := lk.Refresh(ctxT(t)); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("Refresh after release = %v, want ErrReleased", err)
	}
	lk2, err := h.New(t).TryAcquire(ctxT(t), key)
	if err != nil {
		t.Fatalf("key not free after release: %v", err)
	}
	release(t, lk2)
}

func testCancelledRelease(t *testing.T, h Harness) {
	key := Key(t)
	ctx, cancel := context.WithCancel(context.Background())
	lk, err := h.New(t).Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release with cancelled context: %v", err)
	}
	lk2, err := h.New(t).TryAcquire(ctxT(t), key)
	if err != nil {
		t.Fatalf("key still held after release with cancelled context: %v", err)
	}
	release(t, lk2)
}

func testHeldPast3TTL(t *testing.T, h Harness) {
	key := Key(t)
	lk := mustAcquire(t, h.New(t), key, dlock.WithTTL(h.TTL))
	t.Cleanup(func() { lk.Release(context.Background()) }) // a no-op after the release below
	holdFor(t, lk, 3*h.TTL+h.TTL/2, h.TTL)
	assertHeld(t, h.New(t), key)
	release(t, lk)
}

// holdFor sleeps d while lk, acquired with the given ttl and renewed by
// its watchdog, is held, and reports whether it still is. A holder that
// does not run cannot renew: a lock lost at its local deadline after this
// process stalled (StallMeter) half the ttl or more at once, before that
// deadline, is the promise kept, not broken. The test is then skipped:
// its premise, a holder that runs, is gone. Against servers that answer,
// a watchdog that renews every third of the ttl lets a lock lapse only
// after such a stall; any other loss, or a stall that came only after the
// deadline, fails the test.
func holdFor(t *testing.T, lk *dlock.Lock, d, ttl time.Duration) bool {
	t.Helper()
	m := StartStallMeter(time.Now())
	select {
	case <-lk.Lost():
	case <-time.After(d):
		m.Stop()
		return true
	}
	// Deadline is the one that passed: stalls after it did not cause it.
	m.StopAt(lk.Deadline())
	err := lk.Err()
	if lapsed(lk) && m.Longest() >= ttl/2 {
		t.Skipf("lost at its local deadline after this process stalled %v at once (TTL %v): %v", m.Longest().Round(time.Millisecond), ttl, err)
	}
	t.Fatalf("lock lost despite auto-refresh (before its deadline the process stalled at most %v at once): %v", m.Longest().Round(time.Millisecond), err)
	return false
}

func testNoAutoRefresh(t *testing.T, h Harness) {
	key := Key(t)
	start := time.Now()
	lk := mustAcquire(t, h.New(t), key, dlock.WithTTL(h.TTL), dlock.WithAutoRefresh(false))
	if d := lk.Deadline(); !d.Before(time.Now().Add(h.TTL)) || d.Before(start) {
		t.Fatalf("deadline %v not within (start, start+TTL)", d.Sub(start))
	}
	waitClosed(t, lk.Lost(), "Lost() at the local deadline")
	if !errors.Is(lk.Err(), dlock.ErrLockLost) {
		t.Fatalf("Err() = %v, want ErrLockLost", lk.Err())
	}
	// The key becomes free (released by the cleanup or expired).
	lk2 := mustAcquire(t, h.New(t), key)
	if lk2.Token() <= lk.Token() {
		t.Errorf("token %d after lost token %d", lk2.Token(), lk.Token())
	}
	release(t, lk2)
	if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release of lost lock = %v, want ErrLockLost", err)
	}
}

func testManualRefresh(t *testing.T, h Harness) {
	key := Key(t)
	lk := mustAcquire(t, h.New(t), key, dlock.WithTTL(h.TTL), dlock.WithAutoRefresh(false))
	checker := h.New(t)
	release(t, mustAcquire(t, checker, Key(t))) // its connections: the check must not wait for a dial
	for i := 0; i < 4; i++ {
		time.Sleep(h.TTL / 4)
		before := lk.Deadline()
		if err := lk.Refresh(ctxT(t)); err != nil {
			lk.Release(context.Background())
			if lapsed(lk) {
				// The local deadline passed before the refresh was
				// answered: this process woke too late (TTL/4 of
				// sleep), and a loss at the deadline is the promise.
				t.Skipf("Refresh %d: the local deadline passed first: %v", i, err)
			}
			t.Fatalf("Refresh %d: %v", i, err)
		}
		if !lk.Deadline().After(before) {
			lk.Release(context.Background())
			t.Fatalf("Refresh did not move the deadline")
		}
	}
	assertHeldUntil(t, checker, key, lk)
	// The check found the key held; the local deadline may have passed
	// since (on a loaded machine), and then the lock is lost.
	if err := lk.Release(context.Background()); err != nil && !(errors.Is(err, dlock.ErrLockLost) && lapsed(lk)) {
		t.Errorf("Release(%q): %v", key, err)
	}
}

// assertHeldUntil checks that key, held by lk, is held (a fresh
// TryAcquire of l fails). A check that finds the key free fails the test
// if it returned before lk's local deadline; one that returned after it
// (this process too slow to check within the lease: the premise is gone)
// skips the test, lk released.
func assertHeldUntil(t *testing.T, l dlock.Locker, key string, lk *dlock.Lock) {
	t.Helper()
	deadline := lk.Deadline()
	got, err := l.TryAcquire(ctxT(t), key)
	returned := time.Now()
	if err == nil {
		got.Release(context.Background())
		if returned.After(deadline) {
			lk.Release(context.Background())
			t.Skipf("the check of %q returned %v after the holder's local deadline: too late to tell", key, returned.Sub(deadline).Round(time.Millisecond))
		}
		t.Fatalf("key %q was free %v before the holder's local deadline, want it held", key, deadline.Sub(returned).Round(time.Millisecond))
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) = %v, want ErrNotAcquired", key, err)
	}
}

// A lock with a hold cap is lost at the cap, not before it (less the
// drift allowance), with ErrHoldCapReached, and the key becomes free. The
// cap is half the TTL: the local deadline is the cap's whatever becomes
// of the renewals due from TTL/3 on (clipped to the cap, which a backend
// must accept), so a starved renewal cannot lose the lock first. A core
// that ignores the cap fails (Lost() never closes); renewing a capped lock
// up to the cap is the fake-clock tests' (TestHoldCap_*).
func testMaxHold(t *testing.T, h Harness) {
	key := Key(t)
	start := time.Now()
	lk := mustAcquire(t, h.New(t), key, dlock.WithTTL(h.TTL), dlock.WithMaxHold(h.TTL/2))
	waitClosed(t, lk.Lost(), "Lost() at the hold cap")
	if err := lk.Err(); !errors.Is(err, dlock.ErrHoldCapReached) || !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Err() = %v, want ErrLockLost and ErrHoldCapReached", err)
	}
	if held, floor := time.Since(start), h.TTL/2-h.TTL/4; held < floor {
		t.Fatalf("lost at the cap after %v, before %v: the cap of %v came early", held, floor, h.TTL/2)
	}
	lk2 := mustAcquire(t, h.New(t), key)
	release(t, lk2)
}

func needExpire(t *testing.T, h Harness) {
	if h.Expire == nil {
		t.Fatal("Harness.Expire is required by this test")
	}
}

func testLostOnExpire(t *testing.T, h Harness) {
	needExpire(t, h)
	key := Key(t)
	lk := mustAcquire(t, h.New(t), key, dlock.WithTTL(h.TTL))
	h.Expire(t, key)
	// Someone else takes the key; the old holder must notice and must not
	// disturb the new one.
	lk2 := mustAcquire(t, h.New(t), key)
	defer release(t, lk2)
	waitClosed(t, lk.Lost(), "Lost() after the key was deleted behind the holder")
	if !errors.Is(lk.Err(), dlock.ErrLockLost) {
		t.Fatalf("Err() = %v, want ErrLockLost", lk.Err())
	}
	if err := lk2.Refresh(ctxT(t)); err != nil {
		t.Fatalf("new holder's refresh after old holder noticed loss: %v", err)
	}
	assertHeld(t, h.New(t), key)
}

func testReleaseLostKeepsNewHolder(t *testing.T, h Harness) {
	needExpire(t, h)
	key := Key(t)
	old := mustAcquire(t, h.New(t), key, dlock.WithAutoRefresh(false))
	h.Expire(t, key) // the old holder does not know
	lk2 := mustAcquire(t, h.New(t), key)
	defer release(t, lk2)
	for i := 0; i < 2; i++ { // a retried release is harmless too
		err := old.Release(context.Background())
		if errors.Is(err, dlock.ErrLockLost) && lapsed(old) && !time.Now().Before(old.Deadline()) {
			// A slow machine took the lock past its local deadline (it is
			// not renewed) before the release asked the server.
			t.Logf("the local deadline passed first: %v", err)
			continue
		}
		if !errors.Is(err, dlock.ErrLockLost) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Release of a lost lock = %v, want ErrLockLost wrapping ErrNotHeld", err)
		}
	}
	if err := old.Refresh(ctxT(t)); err == nil {
		t.Fatal("Refresh of a lost lock succeeded")
	}
	if err := lk2.Refresh(ctxT(t)); err != nil {
		t.Fatalf("new holder lost its lock to the old holder's release: %v", err)
	}
	assertHeld(t, h.New(t), key)
}

func testDo(t *testing.T, h Harness) {
	l := h.New(t)
	key := Key(t)
	ran := false
	err := dlock.Do(ctxT(t), l, key, func(ctx context.Context, lk *dlock.Lock) error {
		ran = true
		assertHeld(t, h.New(t), key)
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do = %v, ran = %v", err, ran)
	}
	boom := errors.New("boom")
	err = dlock.Do(ctxT(t), l, key, func(context.Context, *dlock.Lock) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	v, err := dlock.WithLock(ctxT(t), l, key, func(ctx context.Context, lk *dlock.Lock) (uint64, error) {
		return lk.Token(), nil
	})
	if err != nil || v == 0 {
		t.Fatalf("WithLock = %d, %v", v, err)
	}
	lk := mustAcquire(t, h.New(t), key) // free again
	release(t, lk)
}

func testDoLoss(t *testing.T, h Harness) {
	needExpire(t, h)
	key := Key(t)
	err := dlock.Do(ctxT(t), h.New(t), key, func(ctx context.Context, lk *dlock.Lock) error {
		h.Expire(t, key)
		select {
		case <-ctx.Done(): // fn's context ends when the lock is lost
			if !errors.Is(context.Cause(ctx), dlock.ErrLockLost) {
				return fmt.Errorf("cause = %v", context.Cause(ctx))
			}
			return nil
		case <-time.After(HangTimeout):
			return errors.New("hang: fn's context not cancelled on loss")
		}
	}, dlock.WithTTL(h.TTL))
	if !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Do after loss = %v, want ErrLockLost", err)
	}
}
