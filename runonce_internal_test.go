package dlock

import (
	"testing"
	"time"
)

// RunOnce's waits between attempts keep a random part above the minimum,
// so replicas that split a quorum's votes do not retry together.
// Symptom: replicas that split a Redlock vote all retried exactly runOnceRetryMin later, split again and gave up.
func TestRunOnceRetryDelay_RandomAboveTheMinimum(t *testing.T) {
	for n := 1; n < RunOnceAttempts; n++ {
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 200 {
			d := runOnceRetryDelay(DefaultBackoff, n)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < runOnceRetryMin || hi >= 2*runOnceRetryMin+DefaultBackoff.(ExpBackoff).Max {
			t.Errorf("attempt %d: waits in [%v, %v], want them from %v on and bounded", n, lo, hi, runOnceRetryMin)
		}
		// 200 uniform draws over 50ms: a spread under a fifth of it has
		// a probability below 1e-100.
		if hi-lo < runOnceRetryMin/5 {
			t.Errorf("attempt %d: waits in [%v, %v]: replicas that split a vote would retry together", n, lo, hi)
		}
	}
}
