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
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/memlock"
)

// rt14HangFile takes the flock every filelock operation on key in dir
// needs, from a descriptor of the test's own: until the returned function
// runs, every acquire, refresh and release of key hangs (a hung server).
func rt14HangFile(t *testing.T, dir, key string) func() {
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

// A lock of a Set found lost only by the Set's Release (its lease was
// expired behind its back, the watchdog had not noticed yet) is a loss:
// the first Release reports it, and so must a second Release and Err
// (Set.Release: "A second Release returns the first's loss").
func TestRedTeam14_SetSecondReleaseKeepsLoss(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	s, err := dlock.AcquireAll(ctx, l, []string{"rt14/a", "rt14/b"}, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("rt14/a")
	if err := s.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("first Release = %v, want the loss of rt14/a", err)
	}
	if err := s.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("second Release = %v, want the first's loss", err)
	}
	if err := s.Err(); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Err after a Release that found a loss = %v, want the loss", err)
	}
}

// AcquireAll that fails after taking some keys must not spend a whole
// DefaultReleaseTimeout on each of them when the service hangs: its
// context has ended, and the releases went one after the other, 5s each.
func TestRedTeam14_AcquireAllUndoBounded(t *testing.T) {
	dir := t.TempDir()
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.TryAcquire(context.Background(), "rt14/z")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(context.Background())
	keys := []string{"rt14/a", "rt14/b", "rt14/c", "rt14/z"}
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
		infos, _ := l.List(context.Background(), "rt14/")
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
		heals = append(heals, rt14HangFile(t, dir, k))
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
		if infos, _ := l.List(context.Background(), "rt14/"); len(infos) <= 1 {
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

// Set.Release with a nil context releases like Lock.Release does (it must
// not panic in the bounded release path).
func TestRedTeam14_SetReleaseNilContext(t *testing.T) {
	l := memlock.New()
	s, err := dlock.AcquireAll(context.Background(), l, []string{"rt14/n1", "rt14/n2"})
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 a nil context is what is tested
	if err := s.Release(nil); err != nil { //nolint:staticcheck
		t.Fatalf("Release(nil) = %v", err)
	}
	if infos, _ := l.List(context.Background(), "rt14/"); len(infos) != 0 {
		t.Errorf("keys still held after Release(nil): %+v", infos)
	}
}

// A lock of the set lost while AcquireAll still waited for a later key:
// the Set it returns must say so at once (Err, Lost), not a moment later
// from a goroutine: "Err is nil while every lock of the set is held".
func TestRedTeam14_AcquireAllReturnsLossAtOnce(t *testing.T) {
	for i := 0; i < 5; i++ {
		l := memlock.New()
		ctx := context.Background()
		blocker, err := l.TryAcquire(ctx, "rt14/b")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan *dlock.Set, 1)
		go func() {
			s, err := dlock.AcquireAll(ctx, l, []string{"rt14/a", "rt14/b"}, dlock.WithTTL(150*time.Millisecond))
			if err != nil {
				t.Error(err)
			}
			done <- s
		}()
		for {
			if infos, _ := l.List(ctx, "rt14/a"); len(infos) == 1 {
				l.Expire("rt14/a")
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
		lostLock := s.Lock("rt14/a").Err()
		setErr := s.Err()
		select {
		case <-s.Lost():
		default:
			if lostLock != nil {
				t.Fatalf("round %d: AcquireAll returned a Set whose lock of rt14/a is lost (%v) with Lost() open and Err %v", i, lostLock, setErr)
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
func TestRedTeam14_SetContextOfLostSetIsDone(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	s, err := dlock.AcquireAll(ctx, l, []string{"rt14/c1", "rt14/c2"}, dlock.WithTTL(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("rt14/c2")
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
func TestRedTeam14_ConcurrentSecondReleaseKeepsLoss(t *testing.T) {
	dir := t.TempDir()
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := dlock.AcquireAll(ctx, l, []string{"rt14/r1", "rt14/r2"}, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Expire("rt14/r1"); err != nil {
		t.Fatal(err)
	}
	heal := rt14HangFile(t, dir, "rt14/r1") // released last: the first Release waits on it
	first := make(chan error, 1)
	go func() { first <- s.Release(ctx) }()
	time.Sleep(50 * time.Millisecond) // the first is under way
	second := make(chan error, 1)
	go func() { second <- s.Release(ctx) }()
	time.Sleep(50 * time.Millisecond)
	heal()
	if err := <-first; !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("first Release = %v, want the loss of rt14/r1", err)
	}
	if err := <-second; !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("concurrent second Release = %v, want the first's loss", err)
	}
}
