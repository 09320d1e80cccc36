package check

import (
	"testing"

	"github.com/dlock-go/dlock/safety/history"
)

// The fenced register applied a write at the highest token it had applied,
// presented by another worker: dlock's rule for exclusive fences refuses
// an equal token from another holder, so this is a stale write, but (b)
// counted only tokens strictly below the highest; only Porcupine (when it
// does not time out) saw it.
func TestRegressEqualTokenOtherWorkerIsStale(t *testing.T) {
	ev := []history.Event{
		{Worker: 1, Key: "k", Op: history.OpAccept, Register: history.Fenced, Result: history.OK, Token: 5, Value: 1, T0: 1},
		{Worker: 2, Key: "k", Op: history.OpAccept, Register: history.Fenced, Result: history.OK, Token: 5, Value: 2, T0: 2},
		{Worker: 2, Key: "k", Op: history.OpAccept, Register: history.Fenced, Result: history.OK, Token: 5, Value: 3, T0: 3},
		{Worker: 1, Key: "k", Op: history.OpAccept, Register: history.Fenced, Result: history.OK, Token: 6, Value: 4, T0: 4},
		{Worker: 1, Key: "k", Op: history.OpAccept, Register: history.Fenced, Result: history.OK, Token: 6, Value: 5, T0: 5},
	}
	r := Analyze(ev)
	if r.Fenced.StaleAccepted != 2 {
		t.Fatalf("worker 2 wrote twice at worker 1's token 5: %d stale accepted, want 2 (the same holder's second write and a higher token are not stale)", r.Fenced.StaleAccepted)
	}
	if !r.FencedViolations() {
		t.Fatal("not a fenced violation")
	}
}
