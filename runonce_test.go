package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/memlock"
)

// A lease TTL equal to atLeastFor is valid whatever its sub-millisecond
// part: the TTL is kept in whole milliseconds, and the check compares it
// with atLeastFor at that precision.
// Symptom: a 6.667s lease (two thirds of a session timeout) was refused with ErrInvalidOption.
func TestRunOnce_AcceptsTTLOfAtLeastFor_SubMillisecond(t *testing.T) {
	atLeast := 6*time.Second + 666*time.Millisecond + 666_666
	ran, err := dlock.RunOnce(context.Background(), memlock.New(), "k", 10*time.Second, atLeast,
		func(context.Context) error { return nil }, dlock.WithTTL(atLeast))
	if !ran || err != nil {
		t.Fatalf("RunOnce with WithTTL(atLeastFor = %v): ran=%v err=%v, want it run", atLeast, ran, err)
	}
}

// grantShaper is a test backend (the in-memory store of slowClient) whose
// grants say what a real backend's may: another TTL than the one asked
// for, a lease that ends with its client, a dead holder's linger.
type grantShaper struct {
	*slowClient
	ttl    time.Duration
	ends   bool
	linger time.Duration
}

func (d grantShaper) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	g, err := d.slowClient.Try(ctx, req)
	if err == nil {
		g.TTL, g.EndsWithClient, g.Linger = d.ttl, d.ends, d.linger
	}
	return g, err
}

// RunOnce refuses, before the job runs and with the key left free, bounds
// the lease it was granted cannot honour: a session-bound lease let a
// cleanly exiting runner free the key at once despite atLeastFor, a short
// granted lease let a crashed runner free it early, and a server that
// keeps a dead client's lease past atMostFor held the key that long.
func TestRunOnce_RefusesBoundsTheGrantCannotHonour(t *testing.T) {
	cases := []struct {
		name            string
		g               grantShaper
		atMost, atLeast time.Duration
	}{
		{"atLeastFor on a lease that ends with its client", grantShaper{ttl: 4 * time.Second, ends: true, linger: 12 * time.Second}, time.Minute, time.Second},
		{"atLeastFor above the granted lease", grantShaper{ttl: 4 * time.Second}, time.Minute, 6 * time.Second},
		{"atMostFor below the granted lease", grantShaper{ttl: 2 * time.Second}, 1500 * time.Millisecond, 0},
		{"atMostFor below a dead holder's linger", grantShaper{ttl: 4 * time.Second, ends: true, linger: 12 * time.Second}, time.Second, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := newStore()
			c.g.slowClient = newSlowClient(st)
			ran, err := dlock.RunOnce(context.Background(), dlock.NewEngine(c.g), "job", c.atMost, c.atLeast, func(context.Context) error {
				t.Error("the job ran")
				return nil
			})
			if ran || !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("RunOnce(atMostFor %v, atLeastFor %v) = %v, %v; want it refused with ErrInvalidOption", c.atMost, c.atLeast, ran, err)
			}
			if owner := st.holder("job"); owner != "" {
				t.Fatalf("the key is still held by %s after the refusal", owner)
			}
		})
	}
}

// A lease that honours both bounds runs the job: a session-bound lease
// with atLeastFor 0 and atMostFor at its linger, a granted lease between
// atLeastFor and atMostFor.
func TestRunOnce_RunsWhenTheGrantHonoursBounds(t *testing.T) {
	cases := []struct {
		name            string
		g               grantShaper
		atMost, atLeast time.Duration
	}{
		{"session-bound lease, atMostFor at its linger", grantShaper{ttl: 4 * time.Second, ends: true, linger: 12 * time.Second}, 12 * time.Second, 0},
		{"granted lease within the bounds", grantShaper{ttl: 4 * time.Second}, 4 * time.Second, 4 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := newStore()
			c.g.slowClient = newSlowClient(st)
			runs := 0
			ran, err := dlock.RunOnce(context.Background(), dlock.NewEngine(c.g), "job", c.atMost, c.atLeast, func(context.Context) error {
				runs++
				return nil
			}, dlock.WithTTL(c.atMost))
			if !ran || err != nil || runs != 1 {
				t.Fatalf("RunOnce(atMostFor %v, atLeastFor %v) = %v, %v (%d runs); want one run", c.atMost, c.atLeast, ran, err, runs)
			}
		})
	}
}

func TestRunOnceReleasesOnPanic(t *testing.T) {
	l := memlock.New()
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on")
			}
		}()
		dlock.RunOnce(context.Background(), l, "job", time.Minute, 0, func(context.Context) error { panic("boom") })
	}()
	lk, err := l.TryAcquire(context.Background(), "job")
	if err != nil {
		t.Fatalf("the key after a panicking job: %v", err)
	}
	lk.Release(context.Background())
}

func TestRunOnceKeepsAtLeastFor(t *testing.T) {
	l := memlock.New()
	const atLeast = 300 * time.Millisecond
	start := time.Now()
	ran, err := dlock.RunOnce(context.Background(), l, "job", time.Minute, atLeast, func(context.Context) error { return nil })
	if !ran || err != nil {
		t.Fatalf("RunOnce = %v, %v", ran, err)
	}
	if _, err := l.TryAcquire(context.Background(), "job"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("right after a quick run: %v, want the key held", err)
	}
	lk, err := l.Acquire(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	if el := time.Since(start); el < atLeast {
		t.Fatalf("the key was free %v after the run started, before atLeastFor %v", el, atLeast)
	}
}

func TestRunOnceJobError(t *testing.T) {
	l := memlock.New()
	boom := errors.New("boom")
	ran, err := dlock.RunOnce(context.Background(), l, "job", time.Minute, 0, func(context.Context) error { return boom })
	if !ran || !errors.Is(err, boom) || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("RunOnce = %v, %v; want ran and only the job's error", ran, err)
	}
	if ran, err := dlock.RunOnce(nil, l, "job", time.Minute, 0, func(context.Context) error { return nil }); ran || !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck // nil context on purpose
		t.Fatalf("nil context: %v %v", ran, err)
	}
	if ran, err := dlock.RunOnce(context.Background(), nil, "job", time.Minute, 0, func(context.Context) error { return nil }); ran || !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("nil Locker: %v %v", ran, err)
	}
	if ran, err := dlock.RunOnce(context.Background(), l, "", time.Minute, 0, func(context.Context) error { return nil }); ran || !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("empty key: %v %v", ran, err)
	}
}

// RunOnce promises that at most one replica runs the job; a shared or
// multi-permit lock would let every replica in, so such options are
// refused (WithLimit(1), one runner, is allowed).
// Symptom: with WithShared or WithLimit(2) two replicas ran the job at once.
func TestRunOnce_RefusesSharedAndMultiPermitModes(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opt  dlock.Option
	}{{"shared", dlock.WithShared()}, {"limit2", dlock.WithLimit(2)}} {
		t.Run(tc.name, func(t *testing.T) {
			key := "runonce/job/" + tc.name
			runs := 0
			inside := make(chan struct{})
			second := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := dlock.RunOnce(ctx, l, key, time.Minute, 0, func(context.Context) error {
					runs++
					close(inside)
					<-second
					return nil
				}, tc.opt)
				done <- err
			}()
			select {
			case <-inside:
			case err := <-done:
				if !errors.Is(err, dlock.ErrInvalidOption) {
					t.Fatalf("RunOnce with %s = %v, want ErrInvalidOption", tc.name, err)
				}
				return // refused
			}
			ran, err := dlock.RunOnce(ctx, l, key, time.Minute, 0, func(context.Context) error { return nil }, tc.opt)
			close(second)
			<-done
			if ran {
				t.Errorf("RunOnce with %s: two replicas ran the job at once (err %v)", tc.name, err)
			}
		})
	}
	// Limit 1 is one runner: still allowed.
	ran, err := dlock.RunOnce(ctx, l, "runonce/job/limit1", time.Minute, 0, func(context.Context) error { return nil }, dlock.WithLimit(1))
	if !ran || err != nil {
		t.Errorf("RunOnce with WithLimit(1) = %v, %v", ran, err)
	}
}

// RunOnce's release after fn returns by the caller's context against a
// hung service.
// Symptom: it returned only after DefaultReleaseTimeout (5s), the deadline stripped by context.WithoutCancel.
func TestRunOnce_ReleaseReturnsByCallersContext(t *testing.T) {
	dir := t.TempDir()
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var heal func()
	start := time.Now()
	ran, err := dlock.RunOnce(ctx, l, "runonce/hung", time.Minute, 0, func(context.Context) error {
		heal = hangFileKey(t, dir, "runonce/hung")
		return nil
	})
	took := time.Since(start)
	if heal != nil {
		heal()
	}
	// The release goes on in the background once healed: let it finish
	// before the directory is removed.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if infos, _ := l.List(context.Background(), "runonce/"); len(infos) == 0 {
			break
		}
	}
	if !ran {
		t.Fatalf("RunOnce did not run: %v", err)
	}
	if took >= dlock.DefaultReleaseTimeout-time.Second {
		t.Errorf("RunOnce returned %v after its start against a hung release, its context ended after 300ms", took)
	}
}

// WithMaxHold given to RunOnce applies "as for TryAcquire": a cap below
// atMostFor is kept, not raised to atMostFor; a cap below atLeastFor is
// refused.
// Symptom: fn's context was cancelled only at atMostFor.
func TestRunOnce_KeepsCallersMaxHold(t *testing.T) {
	l := memlock.New()
	ran, err := dlock.RunOnce(context.Background(), l, "runonce/maxhold", time.Minute, 0, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(3 * time.Second):
			return errors.New("fn's context outlived the caller's WithMaxHold(300ms)")
		}
	}, dlock.WithTTL(time.Second), dlock.WithMaxHold(300*time.Millisecond))
	if !ran {
		t.Fatalf("RunOnce did not run: %v", err)
	}
	if err != nil && !errors.Is(err, dlock.ErrLockLost) {
		t.Error(err)
	}
	// A cap below atLeastFor cannot keep the key held that long: refused.
	if _, err := dlock.RunOnce(context.Background(), l, "runonce/maxhold2", time.Minute, 10*time.Second, func(context.Context) error { return nil }, dlock.WithTTL(10*time.Second), dlock.WithMaxHold(time.Second)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("WithMaxHold below atLeastFor = %v, want ErrInvalidOption", err)
	}
}
