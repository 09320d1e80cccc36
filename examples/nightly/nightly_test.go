package main

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/examples/internal/harness"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) {
	harness.RunChild(children) // the crashing runner: this test binary, re-executed
	testserver.Main(m)
}

func testEnv(t *testing.T) env {
	return env{Redis: testserver.StartRedis(t).Addr(), Job: "nightly/" + newRunID()}
}

// TestPeriods: in every period exactly one replica runs the job, the
// long job's lock renewed past its TTL and released cleanly.
func TestPeriods(t *testing.T) {
	t.Parallel()
	ps, err := runPeriods(context.Background(), testEnv(t), periods, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps.runs) != periods {
		t.Fatalf("%d periods ran, want %d", len(ps.runs), periods)
	}
	for _, p := range ps.problems() {
		t.Error(p)
	}
}

// TestAtLeastFor: a fast job keeps its period blocked until
// start+atLeastFor, so a replica firing after the job ended skips it; the
// lock is not free before then. Without atLeastFor that replica runs the
// job a second time (the negative control).
func TestAtLeastFor(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	a, err := atLeast(context.Background(), e, atLeastFor, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range a.problems(atLeastFor) {
		t.Error(p)
	}
	a0, err := atLeast(context.Background(), e, 0, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if !a0.first.Ran || !a0.late.Ran {
		t.Errorf("without atLeastFor: first ran %v, late ran %v; want both (the negative control)", a0.first.Ran, a0.late.Ran)
	}
}

// TestAtMostForCrash: a runner process killed in its job frees the lock
// within atMostFor.
func TestAtMostForCrash(t *testing.T) {
	t.Parallel()
	c, err := crash(context.Background(), testEnv(t), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range c.problems() {
		t.Error(p)
	}
}

// TestAtMostForHang: a hung job's lock is renewed past its TTL, then lost
// at the hold cap, atMostFor: the job's context ends with
// dlock.ErrHoldCapReached and the lock is free.
func TestAtMostForHang(t *testing.T) {
	t.Parallel()
	h, err := hang(context.Background(), testEnv(t), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range h.problems() {
		t.Error(p)
	}
}
