package check

import (
	"cmp"
	"slices"
	"time"

	"github.com/dlock-go/dlock/safety/history"
)

// section is one critical section: a worker held key from start to end
// (monotonic ns), as far as the worker could tell.
type section struct {
	worker     int
	key        string
	token      uint64
	start, end int64
	shared     bool // a Shared or Limited lock
	limit      int  // a Limited lock's permits
}

// sections cuts each worker's events (ordered by call time) into critical
// sections. One starts at the return of an acquisition with Result OK and
// lasts until the earliest of the call of the worker's next release and
// the return of its next lost event, or, with neither before the worker's
// next acquisition attempt (or the end of its history: a killed worker),
// until the end of its last event before that.
func sections(workers [][]history.Event) []section {
	var out []section
	for _, w := range workers {
		for i := 0; i < len(w); i++ {
			a := w[i]
			if a.Op != history.OpAcquire || a.Result != history.OK {
				continue
			}
			s := section{worker: a.Worker, key: a.Key, token: a.Token, start: a.T1, end: -1, shared: a.Shared, limit: a.Limit}
			last := end(a)
			j := i + 1
			for ; j < len(w) && w[j].Op != history.OpAcquire; j++ {
				e := w[j]
				last = max(last, end(e))
				var t int64 = -1
				switch e.Op {
				case history.OpRelease:
					t = e.T0
				case history.OpLost:
					t = end(e)
				}
				if t >= 0 && (s.end < 0 || t < s.end) {
					s.end = t
				}
			}
			if s.end < 0 {
				s.end = last
			}
			s.end = max(s.end, s.start)
			out = append(out, s)
			i = j - 1
		}
	}
	return out
}

// overlaps counts pairs of sections of one key, held by different
// workers, that overlap for a positive time, unless both are shared
// (Shared or Limited locks: they may overlap; Limited ones are counted
// by beyondLimit instead).
func overlaps(r *Report, secs []section) {
	by := map[string][]section{}
	for _, s := range secs {
		by[s.key] = append(by[s.key], s)
	}
	keys := sortedKeys(by)
	shown := 0
	for _, k := range keys {
		ss := by[k]
		slices.SortStableFunc(ss, func(a, b section) int {
			return cmp.Or(cmp.Compare(a.start, b.start), cmp.Compare(a.worker, b.worker))
		})
		for i, a := range ss {
			for _, b := range ss[i+1:] {
				if b.start >= a.end {
					break
				}
				if a.worker == b.worker || a.shared && b.shared {
					continue
				}
				d := time.Duration(min(a.end, b.end) - b.start)
				if d <= 0 {
					continue
				}
				r.Overlaps++
				r.OverlapTime += d
				r.MaxOverlap = max(r.MaxOverlap, d)
				if shown < 3 {
					shown++
					r.example("overlap on %q: worker %d (token %d) held [%d, %d], worker %d (token %d) held [%d, %d]: %v together",
						k, a.worker, a.token, a.start, a.end, b.worker, b.token, b.start, b.end, d)
				}
			}
		}
	}
}

// beyondLimit counts, per key, the sections of Limited locks that began
// while the lock's limit of sections were already open (an entry beyond
// the limit), the time during which more than the limit were open, and
// the most open at once.
func beyondLimit(r *Report, secs []section) {
	type edge struct {
		t     int64
		delta int // +1 start, -1 end
		s     section
	}
	by := map[string][]edge{}
	for _, s := range secs {
		if s.limit <= 0 {
			continue
		}
		by[s.key] = append(by[s.key], edge{s.start, 1, s}, edge{s.end, -1, s})
	}
	shown := 0
	for _, k := range sortedKeys(by) {
		es := by[k]
		// Ends before starts at one instant: sections that only touch
		// do not overlap.
		slices.SortStableFunc(es, func(a, b edge) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.delta, b.delta)) })
		open, limit := 0, 0
		var since int64
		for _, e := range es {
			if e.delta > 0 {
				limit = e.s.limit // the limit of the lock entering (one per key in a run)
			}
			was := open > limit && limit > 0
			open += e.delta
			if open > r.MaxInside {
				r.MaxInside = open
			}
			now := open > limit && limit > 0
			switch {
			case e.delta > 0 && now:
				r.BeyondLimit++
				if shown < 3 {
					shown++
					r.example("beyond the limit on %q: worker %d (token %d) entered at %d with %d sections open (limit %d)",
						k, e.s.worker, e.s.token, e.t, open-1, limit)
				}
				if !was {
					since = e.t
				}
			case was && !now:
				r.BeyondLimitTime += time.Duration(e.t - since)
			}
		}
	}
}

// tokenRegressions counts successful acquisitions whose token is not above
// the token of every successful acquisition of the same key that
// completed (returned) before the former was called, or that repeats the
// token of one called before it (concurrent calls included: two holders
// with one token cannot be told apart by a fence).
func tokenRegressions(r *Report, events []history.Event) {
	by := map[string][]history.Event{}
	for _, e := range events {
		if e.Op == history.OpAcquire && e.Result == history.OK {
			by[e.Key] = append(by[e.Key], e)
		}
	}
	shown := 0
	for _, k := range sortedKeys(by) {
		acq := by[k]
		byEnd := slices.Clone(acq)
		slices.SortStableFunc(byEnd, func(a, b history.Event) int { return cmp.Compare(a.T1, b.T1) })
		slices.SortStableFunc(acq, func(a, b history.Event) int {
			return cmp.Or(cmp.Compare(a.T0, b.T0), cmp.Compare(a.Worker, b.Worker))
		})
		var hi history.Event // the highest token among those completed so far
		seen := false
		granted := map[uint64]history.Event{} // tokens of the acquisitions called so far
		j := 0
		for _, x := range acq {
			for ; j < len(byEnd) && byEnd[j].T1 < x.T0; j++ {
				if !seen || byEnd[j].Token > hi.Token {
					hi, seen = byEnd[j], true
				}
			}
			dup, isDup := granted[x.Token]
			if !isDup {
				granted[x.Token] = x
			}
			switch {
			case seen && x.Token <= hi.Token:
				r.TokenRegressions++
				if shown < 3 {
					shown++
					r.example("token regression on %q: worker %d acquired token %d at [%d, %d], after worker %d had acquired token %d at [%d, %d]",
						k, x.Worker, x.Token, x.T0, x.T1, hi.Worker, hi.Token, hi.T0, hi.T1)
				}
			case isDup:
				r.TokenRegressions++
				if shown < 3 {
					shown++
					r.example("token regression on %q: worker %d acquired token %d at [%d, %d], already granted to worker %d at [%d, %d]",
						k, x.Worker, x.Token, x.T0, x.T1, dup.Worker, dup.T0, dup.T1)
				}
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
