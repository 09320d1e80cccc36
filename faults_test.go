package dlock_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// hangFileKey takes the flock every filelock operation on key in dir
// needs, from a descriptor of the test's own: until the returned function
// runs, every acquire, refresh and release of key hangs (a hung server).
func hangFileKey(t *testing.T, dir, key string) func() {
	t.Helper()
	sum := sha256.Sum256([]byte(key))
	path := filepath.Join(dir, hex.EncodeToString(sum[:16])+".flock")
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	heal := func() { once.Do(func() { syscall.Close(fd) }) }
	t.Cleanup(heal)
	return heal
}

// Acquire and TryAcquire against a hung server return by their context's
// deadline with ErrUnavailable, and the grants that arrive late are undone.
// Symptom: Acquire overran its context by seconds and reported the outage as ErrNotAcquired.
func TestAcquireReturnsByDeadlineAgainstHungBackend(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	resume := c.hang("try")
	defer resume()
	for _, try := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		var err error
		if try {
			_, err = l.TryAcquire(ctx, "k", dlock.WithTTL(time.Minute))
		} else {
			_, err = l.Acquire(ctx, "k", dlock.WithTTL(time.Minute))
		}
		overrun := time.Since(start) - 200*time.Millisecond
		cancel()
		t.Logf("try=%v: returned %v after the deadline: %v", try, overrun, err)
		if overrun > overrunBound {
			t.Fatalf("try=%v: returned %v after its deadline", try, overrun)
		}
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("try=%v: err = %v, want ErrUnavailable and DeadlineExceeded, not ErrNotAcquired", try, err)
		}
	}
	// The abandoned attempts complete once the server answers; the leases
	// they were granted are released at once, not left to their minute.
	resume()
	waitFor(t, "the abandoned grants to be undone", func() bool {
		return c.count("try") >= 2 && st.holder("k") == ""
	})
}

// An outage that starts while Acquire waits for a holder is reported as
// an outage, not as "held".
func TestOutageDuringWaitIsNotNotAcquired(t *testing.T) {
	st := newStore()
	other := dlock.NewEngine(newSlowClient(st))
	held, err := other.Acquire(ctxT(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctxT(t), "k", dlock.WithWait(time.Second))
		errc <- err
	}()
	waitFor(t, "the waiter's first attempt", func() bool { return c.count("try") >= 1 })
	resume := c.hang("try")
	defer resume()
	err = <-errc
	if errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable, not ErrNotAcquired", err)
	}
	t.Log(err)
}

// Release against a hung server returns by its context; the request goes
// on, and a later Release reports its success.
func TestReleaseReturnsByDeadlineAgainstHungBackend(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	l := dlock.NewEngine(c)
	lk, err := l.Acquire(ctxT(t), "k", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	resume := c.hang("release")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = lk.Release(ctx)
	if d := time.Since(start) - 200*time.Millisecond; d > overrunBound {
		t.Fatalf("Release returned %v after its deadline", d)
	}
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release = %v, want ErrUnavailable", err)
	}
	if !closed(lk.Lost()) || !errors.Is(lk.Err(), dlock.ErrReleased) {
		t.Fatalf("after Release: Lost closed %v, Err %v", closed(lk.Lost()), lk.Err())
	}
	// Refresh is bounded the same way.
	resumeR := c.hang("refresh")
	lk2, err := l.Acquire(ctxT(t), "k2", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer rcancel()
	if err := lk2.Refresh(rctx); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Refresh against a hung server = %v, want ErrUnavailable", err)
	}
	resumeR()
	resume()
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	if st.holder("k") != "" {
		t.Fatal("key still held")
	}
	if err := lk2.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// deadlineNoDone is a context whose Done() is nil but that has a deadline
// (a hand-written Context).
type deadlineNoDone struct{ context.Context }

func (deadlineNoDone) Done() <-chan struct{} { return nil }

// A call with a context that has a deadline but a nil Done() returns by
// that deadline against a hung server, with ErrUnavailable.
// Symptom: such a call ran on the caller's goroutine and ignored the deadline.
func TestTryAcquire_ReturnsByDeadlineWhenDoneIsNil(t *testing.T) {
	st := newStore()
	c := newSlowClient(st)
	a := dlock.NewEngine(c)
	resume := c.hang("try")
	defer resume()
	inner, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := a.TryAcquire(deadlineNoDone{inner}, "k"); done <- err }()
	select {
	case err := <-done:
		t.Logf("returned: %v", err)
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("err = %v, want ErrUnavailable", err)
		}
	case <-time.After(time.Second):
		t.Errorf("TryAcquire with a 100ms Deadline() but nil Done() still blocked after 1s (runs on the caller's goroutine)")
		resume()
		<-done
	}
}
