package check

import (
	"testing"

	"github.com/dlock-go/dlock/safety/history"
)

// Two acquisitions of one key granted the same token to different
// holders: fencing cannot tell them apart. When the two calls were
// concurrent (the second was called before the first returned) nothing
// counted it: regressions compare only with acquisitions completed before
// the call, the sections did not overlap, and the guard (correctly)
// refused the second holder, so Porcupine was satisfied too.
func TestRegressDuplicateTokenConcurrentAcquisitions(t *testing.T) {
	ev := []history.Event{
		{Worker: 1, Key: "k", Op: history.OpAcquire, Result: history.OK, Token: 5, T0: 0, T1: 10},
		{Worker: 2, Key: "k", Op: history.OpAcquire, Result: history.OK, Token: 5, T0: 1, T1: 30},
		{Worker: 1, Key: "k", Op: history.OpRelease, Result: history.OK, Token: 5, T0: 20, T1: 21},
		{Worker: 2, Key: "k", Op: history.OpRelease, Result: history.OK, Token: 5, T0: 40, T1: 41},
	}
	r := Analyze(ev)
	if r.TokenRegressions != 1 {
		t.Fatalf("two holders granted token 5: %d token regressions, want 1 (%v)", r.TokenRegressions, r.Examples)
	}
	// Distinct tokens, concurrent calls: no regression.
	ev[1].Token = 6
	if r := Analyze(ev); r.TokenRegressions != 0 {
		t.Fatalf("tokens 5 and 6: %d regressions", r.TokenRegressions)
	}
	// Same token on different keys: no regression.
	ev[1].Token, ev[1].Key, ev[3].Key = 5, "other", "other"
	if r := Analyze(ev); r.TokenRegressions != 0 {
		t.Fatalf("token 5 on two keys: %d regressions", r.TokenRegressions)
	}
}
