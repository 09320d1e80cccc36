package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// answerAtDeadline is a backend on which the key is always held. Its Try
// ends the caller's wait (cancel) while the attempt is in flight and then
// answers (hang false), or hangs until release is closed (hang true).
type answerAtDeadline struct {
	cancel  context.CancelFunc
	hang    bool
	release chan struct{}
}

func (b *answerAtDeadline) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.cancel()
	if b.hang {
		<-b.release
	}
	return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: "other", Token: 7}}}
}

func (*answerAtDeadline) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// graceBackend: the key is always held. Try ends the caller's wait, then
// answers only once the engine has started a timer on the fake clock (the
// attempt's grace): an answer that can only be read within the grace.
type graceBackend struct {
	fc     *fakeClock
	cancel context.CancelFunc
}

func (b *graceBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.cancel()
	waitPending(b.fc, 5*time.Second)
	return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: "other", Token: 7}}}
}

func (*graceBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// waitPending waits (bounded, in real time) until fc has an active timer.
func waitPending(fc *fakeClock, bound time.Duration) bool {
	for end := time.Now().Add(bound); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if _, ok := fc.pending(); ok {
			return true
		}
	}
	return false
}

// A wait that ends while an attempt is in flight against a healthy backend
// reports what the backend answered within the attempt's grace, the key
// held (ErrNotAcquired), not an outage. The backend here answers only once
// the grace has started, so without the grace the error is ErrUnavailable
// every run.
// Symptom: a wait whose attempt was answered just after the deadline was reported as ErrUnavailable.
func TestAcquire_WaitEndingMidAttemptReportsHolder(t *testing.T) {
	for _, wait := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		b := &graceBackend{cancel: cancel}
		e, fc := fakeEngine(b)
		b.fc = fc
		var err error
		if wait {
			_, err = e.Acquire(ctx, "k")
		} else {
			_, err = e.TryAcquire(ctx, "k")
		}
		var na *NotAcquiredError
		if !errors.As(err, &na) || errors.Is(err, ErrUnavailable) || holder0(na) != "other" {
			t.Errorf("wait=%v: %v, want ErrNotAcquired naming the holder (answered within the grace)", wait, err)
		}
	}
	if !background.Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
}

func holder0(na *NotAcquiredError) string {
	if na == nil || len(na.Holders) == 0 {
		return ""
	}
	return na.Holders[0].Owner
}

// An attempt still unanswered when its grace after the wait's end runs
// out is abandoned: the backend did not answer, so the error is
// ErrUnavailable, not a claim that the key is held.
func TestAcquire_AttemptUnansweredPastGraceIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	b := &answerAtDeadline{cancel: cancel, hang: true, release: make(chan struct{})}
	e, fc := fakeEngine(b)
	defer close(b.release)
	errc := make(chan error, 1)
	go func() {
		_, err := e.TryAcquire(ctx, "k")
		errc <- err
	}()
	// The attempt's grace is the one timer the engine sets.
	if !waitPending(fc, 30*time.Second) {
		t.Fatal("hang: no grace timer after the wait ended")
	}
	fc.Advance(maxAttemptGrace)
	select {
	case err := <-errc:
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("TryAcquire with the attempt unanswered past its grace: %v, want ErrUnavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("hang: TryAcquire did not return once the grace ran out")
	}
}

// abortRecorder: the key is held; the second attempt waits for its
// context to end and returns its error (a request that may have been
// sent), and every Abort is recorded.
type abortRecorder struct {
	mu       sync.Mutex
	tries    []string // owners of the attempts
	aborted  []string
	inSecond chan struct{}
}

func (b *abortRecorder) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	b.tries = append(b.tries, req.Owner)
	n := len(b.tries)
	b.mu.Unlock()
	if n == 2 {
		close(b.inSecond)
		<-ctx.Done()
		return driver.Grant{}, ctx.Err()
	}
	return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: "other", Token: 7}}}
}

func (b *abortRecorder) Abort(ctx context.Context, req *driver.Request) error {
	b.mu.Lock()
	b.aborted = append(b.aborted, req.Owner)
	b.mu.Unlock()
	return nil
}

func (*abortRecorder) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// An attempt cut off by the end of its wait, after the key was seen held,
// is undone (Abort) in the background: its request may have been sent and
// take effect late. Only the wait's result (ErrNotAcquired) was reported,
// and a statement a loaded PostgreSQL ran after its client left granted
// the key to an owner nobody held, for a whole TTL.
func TestAcquire_AttemptEndedByWaitIsUndone(t *testing.T) {
	b := &abortRecorder{inSecond: make(chan struct{})}
	// On the fake clock: the attempt is cut off at once by its clock, not
	// after however long the test goroutine took to cancel.
	e, fc := fakeEngine(b)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, "k", WithBackoff(ConstBackoff{Delay: time.Millisecond}))
		errc <- err
	}()
	if !waitPending(fc, 30*time.Second) { // the backoff after the first attempt
		t.Fatal("hang: no backoff timer after the first attempt")
	}
	fc.Advance(time.Millisecond)
	select {
	case <-b.inSecond:
	case <-time.After(30 * time.Second):
		t.Fatal("hang: no second attempt")
	}
	cancel()
	if err := <-errc; !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("Acquire ended by its context: %v, want ErrNotAcquired", err)
	}
	if !background.Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.aborted) != 1 || b.aborted[0] != b.tries[1] {
		t.Fatalf("aborted %q, want the cut-off attempt's owner %q only", b.aborted, b.tries[1])
	}
}

// cutOffBackend: the key is held; the second attempt waits for its
// context to end and returns the context's error, as a client honouring
// its context does on a hung server.
type cutOffBackend struct {
	mu       sync.Mutex
	tries    int
	inSecond chan struct{}
}

func (b *cutOffBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	b.tries++
	n := b.tries
	b.mu.Unlock()
	if n == 2 {
		close(b.inSecond)
		<-ctx.Done()
		return driver.Grant{}, ctx.Err()
	}
	return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: "other", Token: 7}}}
}

func (*cutOffBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// A wait that ends while its attempt has gone unanswered for answerRecency
// is an outage (ErrUnavailable), even when the driver reports only the
// context's end; one sent just before the end reports the holder seen.
// A Redis Cluster stalled during a wait was reported as the key held.
func TestAcquire_AttemptUnansweredForASecondIsUnavailable(t *testing.T) {
	for _, c := range []struct {
		outstanding time.Duration
		unavailable bool
	}{
		{answerRecency - time.Millisecond, false},
		{answerRecency, true},
	} {
		b := &cutOffBackend{inSecond: make(chan struct{})}
		e, fc := fakeEngine(b)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := e.Acquire(ctx, "k", WithBackoff(ConstBackoff{Delay: time.Millisecond}))
			errc <- err
		}()
		if !waitPending(fc, 30*time.Second) { // the backoff after the first attempt
			t.Fatal("hang: no backoff timer after the first attempt")
		}
		fc.Advance(time.Millisecond)
		select {
		case <-b.inSecond:
		case <-time.After(30 * time.Second):
			t.Fatal("hang: no second attempt")
		}
		fc.Advance(c.outstanding)
		cancel()
		err := <-errc
		if got := errors.Is(err, ErrUnavailable); got != c.unavailable || errors.Is(err, ErrNotAcquired) == c.unavailable {
			t.Errorf("attempt unanswered for %v when the wait ended: %v, want ErrUnavailable %v", c.outstanding, err, c.unavailable)
		}
		if c.unavailable && !strings.Contains(err.Error(), "no answer before the context ended") {
			t.Errorf("attempt unanswered for %v: %q does not say the service did not answer", c.outstanding, err)
		}
	}
	if !background.Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
}

// ctxEndBackend: the key is held; the second attempt waits for its
// context to end and returns what end(ctx) makes of it.
type ctxEndBackend struct {
	mu       sync.Mutex
	tries    int
	inSecond chan struct{}
	end      func(ctx context.Context) error
}

func (b *ctxEndBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	b.tries++
	n := b.tries
	b.mu.Unlock()
	if n == 2 {
		close(b.inSecond)
		<-ctx.Done()
		return driver.Grant{}, b.end(ctx)
	}
	return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: "other", Token: 7}}}
}

func (*ctxEndBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// acquireCutOff runs an Acquire of a held key on b whose second attempt is
// outstanding for answerRecency when ctx (made by mk) is ended by end.
func acquireCutOff(t *testing.T, b *ctxEndBackend, mk func() (context.Context, func())) error {
	t.Helper()
	b.inSecond = make(chan struct{})
	e, fc := fakeEngine(b)
	ctx, end := mk()
	defer end()
	errc := make(chan error, 1)
	go func() {
		_, err := e.Acquire(ctx, "k", WithBackoff(ConstBackoff{Delay: time.Millisecond}))
		errc <- err
	}()
	if !waitPending(fc, 30*time.Second) {
		t.Fatal("hang: no backoff timer after the first attempt")
	}
	fc.Advance(time.Millisecond)
	select {
	case <-b.inSecond:
	case <-time.After(30 * time.Second):
		t.Fatal("hang: no second attempt")
	}
	fc.Advance(answerRecency)
	end()
	select {
	case err := <-errc:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("hang: Acquire did not return after its context ended")
		return nil
	}
}

// An outage at the end of a wait keeps the driver's own words on what
// went silent. Symptom: a driver's "no answer from ZooKeeper in the last
// 1.5s" became the bare "no answer before the context ended".
func TestAcquire_UnansweredWaitKeepsDriverExplanation(t *testing.T) {
	const why = "no answer from the service in the last 1.5s of the wait"
	b := &ctxEndBackend{end: func(ctx context.Context) error { return fmt.Errorf("%s: %w", why, ctx.Err()) }}
	err := acquireCutOff(t, b, func() (context.Context, func()) { return context.WithCancel(context.Background()) })
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v, want ErrUnavailable and context.Canceled", err)
	}
	if !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "no answer before the context ended") {
		t.Fatalf("Acquire: %q, want the driver's explanation and that the attempt was unanswered", err)
	}
	if !background.Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
}

// A wait ended by a context with a cause of its own wraps both the cause
// and the context's error. Symptom: with WithCancelCause, errors.Is(err,
// context.Canceled) was false.
func TestAcquire_WaitEndedWithCustomCauseWrapsContextError(t *testing.T) {
	myErr := errors.New("shutting down")
	for name, end := range map[string]func(ctx context.Context) error{
		"bare":    func(ctx context.Context) error { return ctx.Err() },
		"wrapped": func(ctx context.Context) error { return fmt.Errorf("driver: %w", ctx.Err()) },
		"cause":   func(ctx context.Context) error { return context.Cause(ctx) },
	} {
		b := &ctxEndBackend{end: end}
		err := acquireCutOff(t, b, func() (context.Context, func()) {
			ctx, cancel := context.WithCancelCause(context.Background())
			return ctx, func() { cancel(myErr) }
		})
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.Canceled) || !errors.Is(err, myErr) {
			t.Errorf("%s: Acquire: %v, want ErrUnavailable wrapping context.Canceled and the cause", name, err)
		}
	}
	if !background.Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
}

// A transient failure that is the context's end (a quorum of nodes left
// unanswered) ends the wait as an outage. Symptom: a stalled Redlock
// ended its wait with ErrTransient, not ErrUnavailable.
func TestAcquire_TransientFailureAtContextEndIsUnavailable(t *testing.T) {
	b := &ctxEndBackend{end: func(ctx context.Context) error {
		return fmt.Errorf("%w: 0 of 3 nodes granted: node a: no answer: %w", ErrTransient, ctx.Err())
	}}
	err := acquireCutOff(t, b, func() (context.Context, func()) { return context.WithCancel(context.Background()) })
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotAcquired) {
		t.Fatalf("Acquire: %v, want ErrUnavailable joined with the cancel", err)
	}
	if !strings.Contains(err.Error(), "0 of 3 nodes granted") {
		t.Errorf("Acquire: %q, want the driver's explanation kept", err)
	}
	if !background.Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
}

// failingBackend fails every attempt at once with err.
type failingBackend struct{ err error }

func (b failingBackend) Try(context.Context, *driver.Request) (driver.Grant, error) {
	return driver.Grant{}, b.err
}

func (failingBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// A wait that ends between attempts carries the last failure's own
// verdict in one line: contention stays contention, an outage stays an
// outage. Symptom: a split vote at the deadline was reported as
// ErrUnavailable, as if the service were down.
func TestAcquire_WaitEndedBetweenFailedAttemptsKeepsTheirVerdict(t *testing.T) {
	for _, c := range []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"split vote", fmt.Errorf("%w: 1 of 3 nodes granted, 1 refused, 1 split", ErrTransient), false},
		{"outage", fmt.Errorf("%w: %w: 0 of 2 replicas connected", ErrTransient, ErrUnavailable), true},
	} {
		e, fc := fakeEngine(failingBackend{err: c.err})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := e.Acquire(ctx, "k", WithBackoff(ConstBackoff{Delay: time.Hour}))
			errc <- err
		}()
		if !waitPending(fc, 30*time.Second) { // the backoff after the first attempt
			t.Fatalf("%s: hang: no backoff timer after the first attempt", c.name)
		}
		cancel()
		var err error
		select {
		case err = <-errc:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: hang: Acquire did not return after its context ended", c.name)
		}
		if errors.Is(err, ErrUnavailable) != c.unavailable || !errors.Is(err, ErrTransient) || !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotAcquired) {
			t.Errorf("%s: Acquire = %v, want ErrTransient and context.Canceled, ErrUnavailable %v", c.name, err, c.unavailable)
		}
		if !strings.Contains(err.Error(), c.err.Error()) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: Acquire = %q, want the failure's explanation in one line", c.name, err)
		}
	}
	if !background.Wait(10 * time.Second) {
		t.Fatal("background work did not end")
	}
}

// readyBackend is a backend on which the key is always held, whose
// Watcher has a subscription ready (ReadyWatcher) for waiter "ready-1".
// It records every attempt; Watch must not be needed.
type readyBackend struct {
	mu   sync.Mutex
	reqs []driver.Request
	sub  *readySub
}

type readySub struct{ ch chan struct{} }

func (s *readySub) C() <-chan struct{} { return s.ch }
func (s *readySub) Close()             {}
func (s *readySub) WaitID() string     { return "ready-1" }

func (b *readyBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	b.reqs = append(b.reqs, *req)
	b.mu.Unlock()
	return driver.Grant{}, &NotAcquiredError{Key: req.Key, Holders: []Holder{{Owner: "other", Token: 7, TTL: time.Hour}}}
}

func (b *readyBackend) Watch(context.Context, string) (driver.Subscription, error) {
	return nil, errors.New("readyBackend: Watch called although a subscription was ready")
}

func (b *readyBackend) Ready(string) driver.Subscription { return b.sub }

func (*readyBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

// A blocking Acquire takes a subscription its driver has ready before its
// first attempt: that attempt carries the WaitID (the driver queues it),
// and the waiter, queued and listening, polls no sooner than
// queuedPollMin under the default backoff.
// Symptom: every contended Acquire made an attempt, a SUBSCRIBE and a second attempt, and its waiters polled every few milliseconds.
func TestPoll_ReadySubscription_FirstAttemptQueued(t *testing.T) {
	w := startReadyWaiter(t)
	due, _ := w.fc.pending()
	w.b.mu.Lock()
	reqs := append([]driver.Request(nil), w.b.reqs...)
	w.b.mu.Unlock()
	if len(reqs) != 1 || reqs[0].WaitID != "ready-1" {
		t.Fatalf("attempts before the first sleep: %+v, want one with WaitID ready-1", reqs)
	}
	if d := due.Sub(w.start); d < queuedPollMin {
		t.Errorf("a queued, listening waiter polls after %v, want at least %v", d, queuedPollMin)
	}
	w.end(t)
}

// readyWaiter is a blocking Acquire on a readyBackend, asleep after its
// first attempt (startReadyWaiter).
type readyWaiter struct {
	fc     *fakeClock
	b      *readyBackend
	start  time.Time
	cancel context.CancelFunc
	got    chan error
}

// startReadyWaiter starts a blocking Acquire on a readyBackend's Engine
// with a fake clock and returns once it sleeps after its first attempt.
func startReadyWaiter(t *testing.T) *readyWaiter {
	t.Helper()
	w := &readyWaiter{fc: newFakeClock(), b: &readyBackend{sub: &readySub{ch: make(chan struct{}, 1)}}, got: make(chan error, 1)}
	e := NewEngine(w.b)
	e.wd.clk = w.fc
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.start, w.cancel = w.fc.Now(), cancel
	go func() {
		_, err := e.Acquire(ctx, "k")
		w.got <- err
	}()
	if !waitPending(w.fc, 5*time.Second) {
		t.Fatal("hang: the waiter never slept")
	}
	return w
}

// end ends the wait and checks that Acquire returned its context's error.
func (w *readyWaiter) end(t *testing.T) {
	t.Helper()
	w.cancel()
	if err := <-w.got; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v, want context.Canceled", err)
	}
}

// funcBackoff is a Backoff of a type that cannot be compared.
type funcBackoff func(int) time.Duration

func (f funcBackoff) Next(n int) time.Duration { return f(n) }

// A DefaultBackoff of a type that cannot be compared (a func) does not
// panic the wait of a queued waiter: whether the backoff is the default
// is recorded when the config is made, not found by comparing.
// Symptom: comparing the config's backoff with DefaultBackoff panicked ("comparing uncomparable type") on the first sleep.
func TestPoll_UncomparableDefaultBackoff_NoPanic(t *testing.T) {
	old := DefaultBackoff
	DefaultBackoff = funcBackoff(func(int) time.Duration { return time.Millisecond })
	t.Cleanup(func() { DefaultBackoff = old })
	startReadyWaiter(t).end(t)
}
