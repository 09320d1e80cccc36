package main

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/safety/check"
	"github.com/dlock-go/dlock/safety/history"
)

// Symptom: a run passed with "timed-out" in the fenced-history column.
// A fenced history Porcupine could not decide (timed out) is not
// verified, and is a problem: a history too hard to check could hide a
// violation.
func TestProblems_UndecidedFencedHistoryFails(t *testing.T) {
	c := caseSpec{backend: "redis", fault: "client-pause", ttl: time.Second, dur: time.Second}
	a := analyzed{Report: check.Report{
		Acquired:        100,
		Fenced:          check.Register{Name: "fenced", Accepted: 100},
		Unfenced:        check.Register{Name: "unfenced", Accepted: 100, StaleAccepted: 1, LostUpdates: 5},
		Linearizability: check.TimedOut,
		CheckedOps:      300,
	}}
	rep := report{results: []caseResult{{spec: c, analysis: &a}}}
	if ps := rep.problems(); len(ps) == 0 {
		t.Fatal("a case whose fenced history Porcupine did not decide passed")
	}
	a.Linearizability = check.Linearizable
	if ps := rep.problems(); len(ps) != 0 {
		t.Fatalf("a verified case failed: %v", ps)
	}
}

// Symptom: rows other than client-pause passed vacuously when no worker ever acquired.
// A case in which no worker ever acquired the lock (every worker crashed
// at start, or the backend refused everything) measured nothing: its zeros
// are not "no violation", whatever the fault.
func TestProblems_CaseThatMeasuredNothingFails(t *testing.T) {
	for _, fault := range []string{"none", "server-pause", "restart-volatile", "kill-holder"} {
		c := caseSpec{backend: "redis", fault: fault, ttl: time.Second, dur: time.Second}
		var evs []history.Event
		for i := range 50 { // workers that only ever failed to acquire
			evs = append(evs, history.Event{Worker: i % 4, Key: "k", Op: history.OpAcquire, Result: history.Failed, T0: int64(10 * i), T1: int64(10*i + 5)})
		}
		rep := report{results: []caseResult{{spec: c, events: evs, start: 0, end: 1000}}}
		if ps := rep.problems(); len(ps) == 0 {
			t.Errorf("%s: a case with no successful acquisition and no fenced write passed", c.name())
		}
		rep = report{results: []caseResult{{spec: c}}} // no events at all
		if ps := rep.problems(); len(ps) == 0 {
			t.Errorf("%s: a case with an empty history passed", c.name())
		}
	}
}

// A case whose workers acquired and wrote passes.
func TestProblems_HealthyCasePasses(t *testing.T) {
	c := caseSpec{backend: "redis", fault: "none", ttl: time.Second, dur: time.Second}
	var evs []history.Event
	t0 := int64(0)
	for i := range 20 {
		w, tok := i%2, uint64(i+1)
		evs = append(evs,
			history.Event{Worker: w, Key: "k", Op: history.OpAcquire, Result: history.OK, Token: tok, T0: t0, T1: t0 + 1},
			history.Event{Worker: w, Key: "k", Op: history.OpRead, Register: history.Fenced, Result: history.OK, Token: tok, Value: int64(i), T0: t0 + 2, T1: t0 + 3},
			history.Event{Worker: w, Key: "k", Op: history.OpWrite, Register: history.Fenced, Result: history.OK, Token: tok, Value: int64(i + 1), T0: t0 + 4, T1: t0 + 6},
			history.Event{Worker: w, Key: "k", Op: history.OpAccept, Register: history.Fenced, Result: history.OK, Token: tok, Value: int64(i + 1), T0: t0 + 5},
			history.Event{Worker: w, Key: "k", Op: history.OpRelease, Result: history.OK, Token: tok, T0: t0 + 7, T1: t0 + 8},
		)
		t0 += 10
	}
	rep := report{results: []caseResult{{spec: c, events: evs, start: 0, end: t0}}}
	if ps := rep.problems(); len(ps) != 0 {
		t.Fatalf("a healthy case failed: %s", strings.Join(ps, "; "))
	}
}

// A skipped case (a mode its backend does not offer) is not a problem, and
// its row says why it was skipped; a case that errored still fails.
func TestProblems_SkippedCase(t *testing.T) {
	c := caseSpec{backend: "redis-tair-rw", fault: "client-pause", ttl: time.Second, dur: time.Second}
	why := "shared locks refused: dlock: not supported: no shared | locks"
	rep := report{results: []caseResult{{spec: c, skipped: why, seed: 7}}}
	if ps := rep.problems(); len(ps) != 0 {
		t.Fatalf("a skipped case failed the run: %v", ps)
	}
	if s := rep.results[0].summary(); !strings.HasPrefix(s, "SKIPPED: ") {
		t.Errorf("summary %q", s)
	}
	md := rep.markdown()
	if !strings.Contains(md, "| redis-tair-rw | client-pause | skipped: shared locks refused: dlock: not supported: no shared / locks |||||||||||| 7 |") {
		t.Errorf("skipped row:\n%s", md)
	}
	rep.results[0].err = "deploy failed"
	if ps := rep.problems(); len(ps) != 1 {
		t.Errorf("an errored case: %v", ps)
	}
}
