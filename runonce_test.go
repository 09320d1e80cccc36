package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// A lease TTL equal to atLeastFor is valid whatever its sub-millisecond
// part: the TTL is kept in whole milliseconds, and comparing the
// truncated TTL with the untruncated atLeastFor refused the call with
// ErrInvalidOption (a 6.667s lease, two thirds of a session timeout).
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
