package dlocktest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// OverrunBound is how far past its context's deadline a call may return
// before the fault section calls it a hang. The promise is "by the
// deadline" (the core abandons a call still running then, within
// microseconds, or 100ms for a queue wait); the bound is generous so that
// a slow machine never fails the suite, and it is still far below the
// seconds that a client's own timeouts and retries take (the defect it
// catches). The time the test process was stalled (see StallMeter) is not
// counted against it.
const OverrunBound = 2 * time.Second

// Link is the network between a client and its server(s), with faults a
// test can switch on. internal/testserver's Proxy and Proxies implement it.
type Link interface {
	// Stall holds bytes in both directions; connections stay open, so the
	// server looks hung (as under SIGSTOP or a stalled network).
	Stall()
	// Cut resets every connection and refuses new ones (a dead server).
	Cut()
	// LoseNextReply lets the next request through and drops its reply,
	// resetting that connection: the request took effect, the client does
	// not know.
	LoseNextReply()
	// Heal ends every fault; held bytes are delivered.
	Heal()
}

// Faults wires the fault section of the suite: a hung server is not a dead
// one, and the promises must hold against both. Lockers from Harness.New
// keep a healthy link; they play "another client" that polls the server
// directly.
type Faults struct {
	// New returns a Locker whose every connection to the server(s) passes
	// through the returned Link. Every network backend provides it; only a
	// backend without a network (filelock) leaves it nil, and the link
	// tests (stalled link, lost replies, outage during a wait) then do not
	// apply.
	New func(t testing.TB) (dlock.Locker, Link)
	// Pause hangs the server(s) holding keys until the returned function
	// resumes them: SIGSTOP, so connections stay open and requests hang;
	// for a quorum backend a majority of nodes; for filelock, a stopped
	// process holding the keys' record locks. Required.
	Pause func(t testing.TB, keys ...string) (resume func())
	// Down returns a Locker like New's and a function that takes its
	// server(s) down for the rest of the test: its open connections are
	// reset and new ones refused, for nothing listens at the addresses it
	// dials any more (a proxy stopped). Called before the Locker's first
	// call, that is a Locker pointed at a port where nothing listens. A
	// client that must connect before it returns a Locker (a session)
	// connects first. Every network backend should provide it; without
	// it the Unreachable case checks reset connections only (Link.Cut).
	Down func(t testing.TB) (l dlock.Locker, down func())
	// NewMinority, for quorum backends, returns a Locker in which only a
	// minority of the servers is reached through the returned Link.
	NewMinority func(t testing.TB) (dlock.Locker, Link)
	// TTL is the lease used by the fault tests. Zero means 1s.
	TTL time.Duration
}

func testFaults(t *testing.T, h Harness) {
	f := h.Faults
	if f.Pause == nil {
		t.Fatal("Harness.Faults needs Pause")
	}
	if f.TTL == 0 {
		f.TTL = time.Second
	}
	t.Run("PausedServerLosesFirst", func(t *testing.T) { testPausedServer(t, h, f) })
	if f.New != nil {
		t.Run("StalledHolderLosesFirst", func(t *testing.T) { testStalledHolder(t, h, f) })
		t.Run("DeadlinesAgainstStalledLink", func(t *testing.T) { testStalledDeadlines(t, h, f) })
		t.Run("LostReplyOnAcquire", func(t *testing.T) { testLostAcquireReply(t, h, f) })
		t.Run("LostReplyOnRelease", func(t *testing.T) { testLostReleaseReply(t, h, f) })
		t.Run("OutageDuringWait", func(t *testing.T) { testOutageDuringWait(t, h, f) })
		t.Run("Modes", func(t *testing.T) { testModeFaults(t, h, f) })
	}
	if f.NewMinority != nil {
		t.Run("MinorityStalled", func(t *testing.T) { testMinorityStalled(t, h, f) })
	}
}

// faulty returns a Locker behind a Link, healed at cleanup (before the
// servers stop).
func faulty(t *testing.T, f *Faults) (dlock.Locker, Link) {
	l, link := f.New(t)
	t.Cleanup(link.Heal)
	return l, link
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// AcquireWhenFree polls l.TryAcquire on key until it succeeds (failing as a
// hang after HangTimeout) and fails the test unless holder's Lost() had
// closed before the successful attempt was sent: the promise "a held lock
// tells you it is lost before anyone else can hold it", checked as an
// ordering, not a latency. It logs the margin between the holder's local
// deadline and that attempt.
//
// opts are passed to TryAcquire (dlock.WithLimit: the attempt is for a
// permit the holder's loss frees).
func AcquireWhenFree(t testing.TB, l dlock.Locker, key string, holder *dlock.Lock, opts ...dlock.Option) *dlock.Lock {
	t.Helper()
	end := time.Now().Add(HangTimeout)
	for attempts := 0; time.Now().Before(end); attempts++ {
		lostBefore := isClosed(holder.Lost())
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), HangTimeout)
		lk, err := l.TryAcquire(ctx, key, opts...)
		cancel()
		if err == nil {
			// Lost() closed while the attempt was in flight, and before the
			// server could expire the lease by itself (its expiry is at
			// least the drift allowance after the holder's local
			// deadline): the watchdog lost the lock (early: it may, by up
			// to a quarter of the TTL, when many locks come due; or a
			// little late on a loaded machine) and its cleanup released
			// the key, which the attempt then found free. That is the
			// holder letting go, not two holders.
			gaveUp := !lostBefore && isClosed(holder.Lost()) && sent.Before(holder.Deadline().Add(driftAllowance(holder)))
			if gaveUp {
				t.Logf("the holder lost the lock (deadline %v after the attempt was sent) and released it while the other client's attempt was in flight", holder.Deadline().Sub(sent).Round(10*time.Microsecond))
				return lk
			}
			if !lostBefore {
				lk.Release(context.Background())
				t.Fatalf("two holders: another client acquired %q (attempt %d) while the holder's Lost() was open; holder deadline %v after that attempt was sent", key, attempts, holder.Deadline().Sub(sent))
			}
			t.Logf("margin: the holder's local deadline passed %v before the other client's successful attempt was sent", sent.Sub(holder.Deadline()).Round(10*time.Microsecond))
			return lk
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("hang: %q did not become free within %v", key, HangTimeout)
	return nil
}

// driftAllowance is the default drift allowance of lk's TTL: the least
// time between its local deadline and the server's expiry of its lease.
func driftAllowance(lk *dlock.Lock) time.Duration {
	return time.Duration(float64(lk.TTL())*dlock.DefaultDriftFactor) + dlock.DefaultDriftMin
}

// bounded runs fn with a context of timeout d and fails the test if fn
// returns more than OverrunBound after the deadline, not counting the time
// this process was stalled after it (see StallMeter). It logs the overrun.
func bounded(t *testing.T, what string, d time.Duration, fn func(ctx context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	deadline, _ := ctx.Deadline()
	m := StartStallMeter(deadline)
	defer m.Stop() // also when fn fails the test
	err := fn(ctx)
	end := time.Now()
	stalled := m.StopAt(end)
	over := Overrun(deadline, end, stalled)
	t.Logf("%s: returned %v after its %v deadline (the process stalled %v of it): %v",
		what, end.Sub(deadline).Round(10*time.Microsecond), d, stalled.Round(time.Millisecond), err)
	if over > OverrunBound {
		t.Fatalf("%s overran its %v context by %v while the process ran", what, d, over)
	}
	return err
}

// wantUnavailable checks that an attempt that met a hung or dead server
// did not report the key as held.
func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded against a hung server", what)
	}
	if errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("%s: an outage reported as a held key: %v", what, err)
	}
}

// The holder's link stalls past its TTL while another client polls the
// server directly: the holder's Lost() must close before the other client
// gets the key.
func testStalledHolder(t *testing.T, h Harness, f *Faults) {
	l, link := faulty(t, f)
	key := Key(t)
	holder := mustAcquire(t, l, key, dlock.WithTTL(f.TTL))
	link.Stall()
	lk := AcquireWhenFree(t, h.New(t), key, holder)
	defer release(t, lk)
	if !errors.Is(holder.Err(), dlock.ErrLockLost) {
		t.Fatalf("holder Err() = %v, want ErrLockLost", holder.Err())
	}
	if lk.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", lk.Token(), holder.Token())
	}
}

// The server hangs (SIGSTOP) past the holder's TTL: the holder's Lost()
// closes while it is stopped (before anyone could take the key), and every
// call made meanwhile returns by its context's deadline.
func testPausedServer(t *testing.T, h Harness, f *Faults) {
	key, key2 := Key(t), Key(t)
	l := h.New(t)
	holder := mustAcquire(t, l, key, dlock.WithTTL(f.TTL))
	second := mustAcquire(t, l, key2, dlock.WithTTL(time.Minute))
	resume := f.Pause(t, key, key2)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	l2 := h.New(t)
	err := bounded(t, "TryAcquire against a paused server", 500*time.Millisecond, func(ctx context.Context) error {
		_, err := l2.TryAcquire(ctx, key)
		return err
	})
	if err == nil {
		t.Fatal("TryAcquire of a held key succeeded against a paused server")
	}
	err = bounded(t, "Acquire against a paused server", 500*time.Millisecond, func(ctx context.Context) error {
		_, err := l2.Acquire(ctx, key)
		return err
	})
	if err == nil {
		t.Fatal("Acquire of a held key succeeded against a paused server")
	}
	bounded(t, "Refresh against a paused server", 500*time.Millisecond, second.Refresh)
	err = bounded(t, "Release against a paused server", 500*time.Millisecond, second.Release)
	// A lease that ends with the session (ZooKeeper's, whatever WithTTL
	// asked) can pass its local deadline while the servers are paused, if
	// the process stalled meanwhile: no renewal can succeed then, and the
	// loss at the deadline is the promise kept. A loss the server reported
	// is the defect this checks for.
	secondLapsed := lapsed(second)
	if errors.Is(err, dlock.ErrLockLost) && !secondLapsed {
		t.Fatalf("Release of a healthy lock against a paused server reported a loss: %v", err)
	}
	if secondLapsed {
		t.Logf("the second lock passed its local deadline while the servers were paused: %v", second.Err())
	}
	waitClosed(t, holder.Lost(), "the holder's Lost() while the server is paused")
	resume()
	resumed = true
	lk := AcquireWhenFree(t, h.New(t), key, holder)
	release(t, lk)
	if lk.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", lk.Token(), holder.Token())
	}
	if err := second.Release(ctxT(t)); err != nil && !(secondLapsed && errors.Is(err, dlock.ErrLockLost)) {
		t.Fatalf("Release retried after the server resumed: %v", err)
	}
	lk2 := mustAcquire(t, h.New(t), key2)
	release(t, lk2)
}

// Every call returns by its context's deadline on a stalled link, and an
// abandoned attempt that took effect later is undone, not left to its TTL.
func testStalledDeadlines(t *testing.T, h Harness, f *Faults) {
	l, link := faulty(t, f)
	key, held := Key(t), Key(t)
	lk := mustAcquire(t, l, held, dlock.WithTTL(time.Minute))
	link.Stall()
	for _, try := range []bool{true, false} {
		what := "Acquire"
		if try {
			what = "TryAcquire"
		}
		err := bounded(t, what+" on a stalled link", 500*time.Millisecond, func(ctx context.Context) error {
			var err error
			if try {
				_, err = l.TryAcquire(ctx, key, dlock.WithTTL(time.Minute))
			} else {
				_, err = l.Acquire(ctx, key, dlock.WithTTL(time.Minute))
			}
			return err
		})
		wantUnavailable(t, what, err)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v, want the context's error joined", what, err)
		}
	}
	err := bounded(t, "Refresh on a stalled link", 500*time.Millisecond, lk.Refresh)
	if err == nil {
		t.Fatal("Refresh on a stalled link succeeded")
	}
	err = bounded(t, "Release on a stalled link", 500*time.Millisecond, lk.Release)
	if errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release on a stalled link reported a loss: %v", err)
	}
	link.Heal()
	// The attempts' requests reach the server now and may be granted; the
	// core undoes them. A one-minute lease left behind would outlast this
	// Acquire's HangTimeout.
	lk2 := mustAcquire(t, h.New(t), key)
	release(t, lk2)
	// The release that was abandoned completes, or a retry does.
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatalf("Release retried after heal: %v", err)
	}
	lk3 := mustAcquire(t, h.New(t), held)
	release(t, lk3)
}

// The reply to an acquisition is lost (the request took effect): the
// client either gets the lock (its retry recognised its own lease) or an
// error that is not ErrNotAcquired; never its own lease reported as
// another holder, and never a lease left behind to its TTL.
func testLostAcquireReply(t *testing.T, h Harness, f *Faults) {
	l, link := faulty(t, f)
	key := Key(t)
	// Warm the connections first: the reply lost must be the
	// acquisition's, not a connection handshake's.
	// The same TTL as below, so that a backend sharing leases per TTL
	// (etcd) already has one and the reply lost is the entry's creation.
	warm := mustAcquire(t, l, Key(t), dlock.WithTTL(time.Minute))
	release(t, warm)
	link.LoseNextReply()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.Acquire(ctx, key, dlock.WithTTL(time.Minute))
	link.Heal()
	if err == nil {
		t.Logf("acquired despite the lost reply (token %d)", lk.Token())
		assertHeld(t, h.New(t), key)
		release(t, lk)
	} else {
		t.Logf("acquire with a lost reply: %v", err)
		if errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("a lost reply reported as a held key (the client's own lease?): %v", err)
		}
	}
	lk2 := mustAcquire(t, h.New(t), key) // a minute-long leftover would hang
	release(t, lk2)
}

// The reply to a release is lost: Release (retried once if it reports an
// error) ends with nil, not a loss, and the key is free.
func testLostReleaseReply(t *testing.T, h Harness, f *Faults) {
	l, link := faulty(t, f)
	key := Key(t)
	lk := mustAcquire(t, l, key, dlock.WithTTL(time.Minute))
	link.LoseNextReply()
	err := lk.Release(ctxT(t))
	link.Heal()
	if err != nil {
		t.Logf("first Release: %v", err)
		if errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("a lost release reply reported as a lost lock: %v", err)
		}
		err = lk.Release(ctxT(t))
	}
	if err != nil {
		t.Fatalf("Release after a lost reply: %v", err)
	}
	if !errors.Is(lk.Err(), dlock.ErrReleased) {
		t.Fatalf("Err() = %v, want ErrReleased", lk.Err())
	}
	lk2 := mustAcquire(t, h.New(t), key)
	release(t, lk2)
}

// An outage during a wait for a held key is reported as an outage, not as
// "held": the link stalls while waiting, or is dead from the start.
//
// The link stalls once the waiter has heard the holder named: at its
// first backoff step (a polling backend), or, failing that, a second
// after its first request (a queue, which waits in one request). The wait
// is cancelled once the request it is in has gone unanswered for longer
// than the second after which dlock calls a silent server an outage.
func testOutageDuringWait(t *testing.T, h Harness, f *Faults) {
	key := Key(t)
	holder := mustAcquire(t, h.New(t), key)
	defer release(t, holder)

	l, link := faulty(t, f)
	var (
		once      sync.Once
		stalled   = make(chan struct{})
		byBackoff bool // the stall came at a backoff step, before an attempt
		firstSent = make(chan time.Time, 1)
		sentAfter = make(chan time.Time, 1) // the first attempt on the stalled link
	)
	stall := func(backoff bool) {
		once.Do(func() {
			byBackoff = backoff
			link.Stall()
			close(stalled)
		})
	}
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind != dlock.EventAttempt {
			return
		}
		select {
		case <-stalled:
			select {
			case sentAfter <- time.Now():
			default:
			}
		default:
			select {
			case firstSent <- time.Now():
			default:
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, key, dlock.WithCallObserver(obs),
			dlock.WithBackoff(stallingBackoff{delay: 20 * time.Millisecond, at: func() { stall(true) }}))
		errc <- err
	}()
	select {
	case <-firstSent:
	case err := <-errc:
		t.Fatalf("Acquire of a held key returned before the stall: %v", err)
	case <-time.After(HangTimeout):
		t.Fatal("hang: no attempt")
	}
	select {
	case <-stalled:
	case <-time.After(time.Second):
		stall(false)
	}
	quiet := time.Now() // the request in flight has had no answer since
	if byBackoff {
		select {
		case quiet = <-sentAfter:
		case <-time.After(HangTimeout):
			t.Fatal("hang: no attempt after the backoff step")
		}
	}
	time.Sleep(time.Until(quiet.Add(unanswered)))
	cancelled := time.Now()
	m := StartStallMeter(cancelled)
	cancel()
	select {
	case err := <-errc:
		end := time.Now()
		stalled := m.StopAt(end)
		t.Logf("stalled during the wait: returned %v after the cancel (the process stalled %v of it): %v",
			end.Sub(cancelled).Round(10*time.Microsecond), stalled.Round(time.Millisecond), err)
		if over := Overrun(cancelled, end, stalled); over > OverrunBound {
			t.Fatalf("Acquire overran its cancelled context by %v while the process ran", over)
		}
		wantUnavailable(t, "Acquire stalled during its wait", err)
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire stalled during its wait: %v, want ErrUnavailable joined with the cancel", err)
		}
	case <-time.After(HangTimeout):
		m.Stop()
		t.Fatal("hang: Acquire ignored its cancelled context on a stalled link")
	}
	link.Heal()

	l2, link2 := faulty(t, f)
	link2.Cut()
	err := bounded(t, "Acquire on a dead link", time.Second, func(ctx context.Context) error {
		_, err := l2.Acquire(ctx, key)
		return err
	})
	wantUnavailable(t, "Acquire on a dead link", err)
}

// A quorum backend keeps its locks while a minority of its servers hangs,
// renews them, takes new ones and releases them.
func testMinorityStalled(t *testing.T, h Harness, f *Faults) {
	l, link := f.NewMinority(t)
	t.Cleanup(link.Heal)
	key, key2 := Key(t), Key(t)
	lk := mustAcquire(t, l, key, dlock.WithTTL(f.TTL))
	link.Stall()
	lk2 := mustAcquire(t, l, key2, dlock.WithTTL(f.TTL))
	time.Sleep(4 * f.TTL)
	for _, x := range []*dlock.Lock{lk, lk2} {
		if err := x.Err(); err != nil {
			t.Fatalf("lock %q lost while only a minority was stalled: %v", x.Key(), err)
		}
		assertHeld(t, h.New(t), x.Key())
	}
	release(t, lk)
	release(t, lk2)
	for _, k := range []string{key, key2} {
		x, err := h.New(t).TryAcquire(ctxT(t), k)
		if err != nil {
			t.Fatalf("%q not free after release with a minority stalled: %v", k, err)
		}
		release(t, x)
	}
}

// unanswered is how long the outage tests leave a request unanswered
// before the wait ends: longer than the second after which dlock (the
// engine, and the backends that wait in one request) reports a silent
// server as unavailable rather than the holder it saw before.
const unanswered = 1500 * time.Millisecond

// stallingBackoff calls at before each backoff step.
type stallingBackoff struct {
	delay time.Duration
	at    func()
}

func (b stallingBackoff) Next(int) time.Duration {
	b.at()
	return b.delay
}
