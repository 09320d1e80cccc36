package check

import (
	"slices"
	"time"

	"github.com/dlock-go/dlock/safety/history"
)

// Rate is the availability of the lock in the window [from, to) (monotonic
// ns): successful acquisitions that returned within it, per second. It is
// 0 for an empty window.
func Rate(events []history.Event, from, to int64) float64 {
	if to <= from {
		return 0
	}
	n := 0
	for _, e := range events {
		if e.Op == history.OpAcquire && e.Result == history.OK && e.T1 >= from && e.T1 < to {
			n++
		}
	}
	return float64(n) / (float64(to-from) / float64(time.Second))
}

// Latencies are percentiles of acquire latency.
type Latencies struct {
	N             int // acquisitions measured
	P50, P99, Max time.Duration
}

// Latency is the distribution of the latency (T1 - T0) of successful
// acquisitions called within the window [from, to) (monotonic ns), by
// nearest rank. An acquisition called during a fault counts in the fault's
// window even if it returned after it: it is the one the fault delayed.
func Latency(events []history.Event, from, to int64) Latencies {
	var d []time.Duration
	for _, e := range events {
		if e.Op == history.OpAcquire && e.Result == history.OK && e.T0 >= from && e.T0 < to && e.T1 >= e.T0 {
			d = append(d, time.Duration(e.T1-e.T0))
		}
	}
	if len(d) == 0 {
		return Latencies{}
	}
	slices.Sort(d)
	return Latencies{N: len(d), P50: rank(d, 50), P99: rank(d, 99), Max: d[len(d)-1]}
}

// rank is the nearest-rank p-th percentile of sorted d: the smallest
// value with at least p% of d at or below it.
func rank(d []time.Duration, p int) time.Duration {
	i := (p*len(d)+99)/100 - 1
	return d[max(i, 0)]
}
