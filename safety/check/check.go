package check

import (
	"cmp"
	"slices"
	"time"

	"github.com/dlock-go/dlock/safety/history"
)

// DefaultTimeout bounds the Porcupine check in Analyze.
const DefaultTimeout = 10 * time.Second

// Options tune AnalyzeWith.
type Options struct {
	// Timeout bounds the Porcupine check (0: DefaultTimeout; negative:
	// no bound).
	Timeout time.Duration
}

// Analyze counts what broke in a history: the events of every worker and
// of both registers, in any order across files, each register's accept
// events in the order it applied them. It does not modify events.
func Analyze(events []history.Event) Report {
	return AnalyzeWith(events, Options{})
}

// AnalyzeWith is Analyze with options.
func AnalyzeWith(events []history.Event, opt Options) Report {
	if opt.Timeout == 0 {
		opt.Timeout = DefaultTimeout
	}
	var r Report
	workers := workerEvents(events)
	r.Workers = len(workers)
	first := true
	for _, w := range workers {
		for _, e := range w {
			if first || e.T0 < r.Start {
				r.Start = e.T0
			}
			if first || end(e) > r.End {
				r.End = end(e)
			}
			first = false
			switch {
			case e.Op == history.OpAcquire && e.Result == history.OK:
				r.Acquired++
			case e.Op == history.OpAcquire && e.Result == history.Failed:
				r.AcquireFailed++
			case e.Op == history.OpAcquire && e.Result == history.Unknown:
				r.AcquireUnknown++
			case e.Op == history.OpLost:
				r.LostEvents++
			}
		}
	}
	secs := sections(workers)
	overlaps(&r, secs)
	beyondLimit(&r, secs)
	tokenRegressions(&r, events)
	r.Fenced = register(&r, history.Fenced, events)
	r.Unfenced = register(&r, history.Unfenced, events)
	linearizability(&r, events, opt.Timeout)
	return r
}

// end is when e ended, as far as the history knows: its return, or its
// call if it never returned.
func end(e history.Event) int64 { return max(e.T0, e.T1) }

// workerEvents returns each worker's own events (not the registers'),
// ordered by call time (stably: a worker's log order breaks ties), in
// ascending worker order.
func workerEvents(events []history.Event) [][]history.Event {
	by := map[int][]history.Event{}
	for _, e := range events {
		if e.Op == history.OpAccept {
			continue
		}
		by[e.Worker] = append(by[e.Worker], e)
	}
	ids := make([]int, 0, len(by))
	for id := range by {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([][]history.Event, 0, len(ids))
	for _, id := range ids {
		w := by[id]
		slices.SortStableFunc(w, func(a, b history.Event) int { return cmp.Compare(a.T0, b.T0) })
		out = append(out, w)
	}
	return out
}
