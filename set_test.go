package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/memlock"
)

func TestSetNilAndZero(t *testing.T) {
	var s *dlock.Set
	if s.Locks() != nil || s.Lock("k") != nil {
		t.Error("nil Set has locks")
	}
	<-s.Lost()
	if err := s.Err(); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("nil Set Err = %v", err)
	}
	if err := s.Release(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("nil Set Release = %v", err)
	}
	var z dlock.Set
	<-z.Lost()
	if err := z.Release(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("zero Set Release = %v", err)
	}
	ctx, cancel := s.Context(nil)
	defer cancel()
	<-ctx.Done()
	if _, err := dlock.AcquireAll(context.Background(), nil, []string{"k"}); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("AcquireAll(nil Locker) = %v", err)
	}
	var nl *memlock.Locker
	if _, err := dlock.TryAcquireAll(context.Background(), nl, []string{"k"}); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("TryAcquireAll(typed nil Locker) = %v", err)
	}
}

func TestSetReleaseTwiceAndContext(t *testing.T) {
	l := memlock.New()
	s, err := dlock.AcquireAll(context.Background(), l, []string{"b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := s.Context(context.Background())
	defer cancel()
	if s.Err() != nil || ctx.Err() != nil {
		t.Fatalf("held set: Err %v ctx %v", s.Err(), ctx.Err())
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(context.Background()); err != nil {
		t.Fatalf("second Release = %v", err)
	}
	<-ctx.Done()
	if !errors.Is(s.Err(), dlock.ErrReleased) || !errors.Is(context.Cause(ctx), dlock.ErrReleased) {
		t.Fatalf("after Release: Err %v cause %v", s.Err(), context.Cause(ctx))
	}
}

// A failed AcquireAll releases what it took also when the caller's
// context is what ended (the releases use their own).
func TestAcquireAllCancelledReleases(t *testing.T) {
	l := memlock.New()
	held, _ := l.Acquire(context.Background(), "b")
	defer held.Release(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := dlock.AcquireAll(ctx, l, []string{"a", "b"}); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireAll = %v", err)
	}
	lk, err := l.TryAcquire(context.Background(), "a")
	if err != nil {
		t.Fatalf("a after the failed AcquireAll: %v", err)
	}
	lk.Release(context.Background())
}

// A lock of a Set found lost only by the Set's Release (its lease was
// expired behind its back, the watchdog had not noticed yet) is a loss:
// the first Release reports it, and so must a second Release and Err
// (Set.Release: "A second Release returns the first's loss").
// Symptom: a second Release and Err reported success after the first found the loss.
func TestSet_SecondReleaseReturnsFirstsLoss(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	s, err := dlock.AcquireAll(ctx, l, []string{"set/a", "set/b"}, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("set/a")
	if err := s.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("first Release = %v, want the loss of set/a", err)
	}
	if err := s.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("second Release = %v, want the first's loss", err)
	}
	if err := s.Err(); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Err after a Release that found a loss = %v, want the loss", err)
	}
}

// An AcquireAll that fails after taking some keys gives them back within
// a bound when the service hangs, not a whole DefaultReleaseTimeout for
// each of them: its context has ended.
// Symptom: the releases went one after the other, 5s each.
func TestAcquireAll_UndoIsBoundedAgainstHungService(t *testing.T) {
	dir := t.TempDir()
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.TryAcquire(context.Background(), "set/z")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(context.Background())
	keys := []string{"set/a", "set/b", "set/c", "set/z"}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	type res struct {
		s   *dlock.Set
		err error
	}
	done := make(chan res, 1)
	go func() {
		s, err := dlock.AcquireAll(ctx, l, keys)
		done <- res{s, err}
	}()
	// Wait until the first three are held (by the AcquireAll), then hang them.
	deadline := time.Now().Add(400 * time.Millisecond)
	for {
		infos, _ := l.List(context.Background(), "set/")
		if len(infos) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("AcquireAll did not take the free keys: %v", infos)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var heals []func()
	for _, k := range keys[:3] {
		heals = append(heals, hangFileKey(t, dir, k))
	}
	start := time.Now()
	r := <-done
	took := time.Since(start)
	for _, h := range heals {
		h()
	}
	// Releases still running (their own bound ends a little after
	// AcquireAll's) go on once healed: let them finish before the
	// directory is removed; those that timed out left leases to expire.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if infos, _ := l.List(context.Background(), "set/"); len(infos) <= 1 {
			break
		}
	}
	if r.err == nil {
		r.s.Release(context.Background())
		t.Fatal("AcquireAll got a held key")
	}
	if took > dlock.DefaultReleaseTimeout+2*time.Second {
		t.Errorf("AcquireAll took %v to give up (3 hung releases at %v each)", took, dlock.DefaultReleaseTimeout)
	}
}

// Set.Release with a nil context releases like Lock.Release does.
// Symptom: Set.Release(nil) panicked in the bounded release path.
func TestSet_ReleaseWithNilContextReleases(t *testing.T) {
	l := memlock.New()
	s, err := dlock.AcquireAll(context.Background(), l, []string{"set/n1", "set/n2"})
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 a nil context is what is tested
	if err := s.Release(nil); err != nil { //nolint:staticcheck
		t.Fatalf("Release(nil) = %v", err)
	}
	if infos, _ := l.List(context.Background(), "set/"); len(infos) != 0 {
		t.Errorf("keys still held after Release(nil): %+v", infos)
	}
}

// A lock of the set lost while AcquireAll still waited for a later key:
// the Set it returns says so at once (Err, Lost), not a moment later from
// a goroutine: "Err is nil while every lock of the set is held".
// Symptom: the returned Set had Err nil and Lost() open with a lost lock.
func TestAcquireAll_ReturnedSetShowsLossAtOnce(t *testing.T) {
	for i := 0; i < 5; i++ {
		l := memlock.New()
		ctx := context.Background()
		blocker, err := l.TryAcquire(ctx, "set/b")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan *dlock.Set, 1)
		go func() {
			s, err := dlock.AcquireAll(ctx, l, []string{"set/a", "set/b"}, dlock.WithTTL(150*time.Millisecond))
			if err != nil {
				t.Error(err)
			}
			done <- s
		}()
		for {
			if infos, _ := l.List(ctx, "set/a"); len(infos) == 1 {
				l.Expire("set/a")
				break
			}
			time.Sleep(time.Millisecond)
		}
		// Wait until the AcquireAll's lock of a has noticed its loss.
		time.Sleep(200 * time.Millisecond)
		blocker.Release(ctx)
		s := <-done
		if s == nil {
			return
		}
		lostLock := s.Lock("set/a").Err()
		setErr := s.Err()
		select {
		case <-s.Lost():
		default:
			if lostLock != nil {
				t.Fatalf("round %d: AcquireAll returned a Set whose lock of set/a is lost (%v) with Lost() open and Err %v", i, lostLock, setErr)
			}
		}
		if lostLock != nil && setErr == nil {
			t.Fatalf("round %d: Set.Err nil with a lost lock (%v)", i, lostLock)
		}
		s.Release(ctx)
	}
}

// Set.Context of a set that is already lost (or released) is done when it
// is returned, so work started under it sees the loss at its first check.
// Symptom: it returned a live context until a goroutine hop later.
func TestSet_ContextOfLostOrReleasedSetIsDone(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	s, err := dlock.AcquireAll(ctx, l, []string{"set/c1", "set/c2"}, dlock.WithTTL(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("set/c2")
	<-s.Lost()
	for i := 0; i < 50; i++ {
		c, cancel := s.Context(ctx)
		err := c.Err()
		cause := context.Cause(c)
		cancel()
		if err == nil {
			t.Fatalf("round %d: Context of a lost set is live", i)
		}
		if !errors.Is(cause, dlock.ErrLockLost) {
			t.Fatalf("round %d: cause %v, want the loss", i, cause)
		}
	}
	s.Release(ctx)
	c, cancel := s.Context(ctx)
	defer cancel()
	if c.Err() == nil {
		t.Error("Context of a released set is live")
	}
}

// A second Release made while the first is still under way (the service
// is slow) returns the first's loss too, not a clean release the first
// then contradicts.
// Symptom: the second Release returned nil while the first reported the loss.
func TestSet_ConcurrentSecondReleaseReturnsFirstsLoss(t *testing.T) {
	dir := t.TempDir()
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := dlock.AcquireAll(ctx, l, []string{"set/r1", "set/r2"}, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Expire("set/r1"); err != nil {
		t.Fatal(err)
	}
	heal := hangFileKey(t, dir, "set/r1") // released last: the first Release waits on it
	first := make(chan error, 1)
	go func() { first <- s.Release(ctx) }()
	time.Sleep(50 * time.Millisecond) // the first is under way
	second := make(chan error, 1)
	go func() { second <- s.Release(ctx) }()
	time.Sleep(50 * time.Millisecond)
	heal()
	if err := <-first; !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("first Release = %v, want the loss of set/r1", err)
	}
	if err := <-second; !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("concurrent second Release = %v, want the first's loss", err)
	}
}
