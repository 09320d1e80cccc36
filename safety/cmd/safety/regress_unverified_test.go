package main

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/safety/check"
)

// A fenced history Porcupine could not decide (timed out) was not
// verified: the run passed with "timed-out" in the fenced-history column
// and no problem, so a history too hard to check could hide a violation.
func TestRegressTimedOutHistoryFails(t *testing.T) {
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
