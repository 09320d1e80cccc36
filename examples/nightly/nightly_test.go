package main

import (
	"context"
	"strings"
	"testing"
	"time"

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

// judge fails t for each problem; a case the machine was too slow to make
// is a skip with its reason, never a pass.
func judge(t *testing.T, v verdict) {
	t.Helper()
	for _, p := range v.problems {
		t.Error(p)
	}
	if len(v.problems) == 0 && len(v.notShown) > 0 {
		t.Skip("not shown, this machine was too slow: " + strings.Join(v.notShown, "; "))
	}
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
	judge(t, ps.verdict())
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
	a0, err := atLeast(context.Background(), e, 0, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if !a0.first.Ran || !a0.late.Ran {
		t.Errorf("without atLeastFor: first ran %v, late ran %v; want both (the negative control)", a0.first.Ran, a0.late.Ran)
	}
	judge(t, a.verdict(atLeastFor))
}

// TestAtMostForCrash: a runner process killed in its job frees the lock
// within atMostFor.
func TestAtMostForCrash(t *testing.T) {
	t.Parallel()
	c, err := crash(context.Background(), testEnv(t), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	judge(t, c.verdict())
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
	judge(t, h.verdict())
}

// A replica granted the lock only after the first run released it (a
// cron or a request delayed by a loaded machine) failed the example.
func TestVerdict_LateGrantAfterTheRunIsNotShownNotAViolation(t *testing.T) {
	t0 := time.Now()
	first := Run{Ran: true, Start: t0, Acquired: t0.Add(5 * time.Millisecond), JobEnd: t0.Add(25 * time.Millisecond), Freed: t0.Add(atLeastFor + 5*time.Millisecond)}
	late := Run{Ran: true, Start: t0.Add(900 * time.Millisecond), Acquired: t0.Add(atLeastFor + 10*time.Millisecond), JobEnd: t0.Add(atLeastFor + 30*time.Millisecond)}
	late.Freed = late.Start.Add(atLeastFor)
	skipped := Run{Start: t0.Add(skew)}
	v := periodsResult{runs: [][]Run{{first, skipped, late}}}.verdict()
	if len(v.problems) != 0 || len(v.notShown) != 1 {
		t.Fatalf("periods: problems %q, not shown %q; want only one case not shown", v.problems, v.notShown)
	}
	v = atLeastResult{first: first, late: late, free: first.Freed}.verdict(atLeastFor)
	if len(v.problems) != 0 || len(v.notShown) != 1 {
		t.Fatalf("at least for: problems %q, not shown %q; want only one case not shown", v.problems, v.notShown)
	}
}

// Two runs holding the lock at once could pass as a slow machine's case.
func TestVerdict_OverlappingRunsAreAViolation(t *testing.T) {
	t0 := time.Now()
	first := Run{Ran: true, Start: t0, Acquired: t0.Add(5 * time.Millisecond), JobEnd: t0.Add(25 * time.Millisecond), Freed: t0.Add(atLeastFor + 5*time.Millisecond)}
	late := Run{Ran: true, Start: t0.Add(100 * time.Millisecond), Acquired: t0.Add(120 * time.Millisecond), JobEnd: t0.Add(140 * time.Millisecond)}
	late.Freed = late.Start.Add(atLeastFor)
	v := periodsResult{runs: [][]Run{{first, late}}}.verdict()
	if len(v.problems) != 1 {
		t.Fatalf("periods: problems %q, not shown %q; want one problem", v.problems, v.notShown)
	}
	v = atLeastResult{first: first, late: late, free: first.Freed}.verdict(atLeastFor)
	if len(v.problems) != 1 {
		t.Fatalf("at least for: problems %q, not shown %q; want one problem", v.problems, v.notShown)
	}
}

// A period whose replicas all found the previous period's late run still
// holding failed as "no replica ran the job".
func TestVerdict_PreviousRunSpillingOverIsNotShown(t *testing.T) {
	t0 := time.Now()
	prev := Run{Ran: true, Start: t0, Acquired: t0.Add(5 * time.Millisecond), JobEnd: t0.Add(period + 100*time.Millisecond)}
	prev.Freed = prev.JobEnd
	skipped := Run{Start: t0.Add(period)}
	v := periodsResult{runs: [][]Run{{prev}, {skipped}}}.verdict()
	if len(v.problems) != 0 || len(v.notShown) != 1 {
		t.Fatalf("problems %q, not shown %q; want only one case not shown", v.problems, v.notShown)
	}
	prev.Freed = t0.Add(atLeastFor)
	if v := (periodsResult{runs: [][]Run{{prev}, {skipped}}}).verdict(); len(v.problems) != 1 {
		t.Fatalf("a period nobody ran, the lock free: problems %q; want one", v.problems)
	}
}
