package check

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/safety/history"
)

// want is the part of a Report a case checks.
type want struct {
	acquired, overlaps      int
	overlapTime             time.Duration
	regressions             int
	fStale, fRejected       int
	fLost, fMissing         int64
	uStale, uClobbers       int
	uLost, uMissing         int64
	lin                     Linearizability
	control, fencedViolated bool
}

func got(r Report) want {
	return want{
		acquired: r.Acquired, overlaps: r.Overlaps, overlapTime: r.OverlapTime,
		regressions: r.TokenRegressions,
		fStale:      r.Fenced.StaleAccepted, fRejected: r.Fenced.RejectedWrite,
		fLost: r.Fenced.LostUpdates, fMissing: r.Fenced.AckedMissing,
		uStale: r.Unfenced.StaleAccepted, uClobbers: r.Unfenced.Clobbers,
		uLost: r.Unfenced.LostUpdates, uMissing: r.Unfenced.AckedMissing,
		lin: r.Linearizability, control: r.ControlSawViolations(), fencedViolated: r.FencedViolations(),
	}
}

func TestAnalyze(t *testing.T) {
	cases := []struct {
		name  string
		build func(s *sim)
		want  want
	}{{
		name: "clean sequential",
		build: func(s *sim) {
			tt := int64(1000)
			for i := range 9 {
				tt = s.iteration(i%3, uint64(i+1), tt)
			}
		},
		want: want{acquired: 9, lin: Linearizable},
	}, {
		// Worker 1 reads both registers, pauses past its TTL; worker 2
		// takes the lock and increments both; worker 1 comes back and
		// writes: the fenced register refuses it, the unfenced one
		// applies it over worker 2's increment.
		name: "paused holder writes late",
		build: func(s *sim) {
			s.acquire(1, 1, 0, 5)
			f := s.read(1, history.Fenced, 10, 15)
			u := s.read(1, history.Unfenced, 20, 25)
			// paused; the lease expires
			s.iteration(2, 2, 100)                                  // holds [105, 160]
			s.write(1, history.Fenced, f+1, 200, 205, history.OK)   // rejected
			s.write(1, history.Unfenced, u+1, 210, 215, history.OK) // applied: stale
			s.lost(1, 220)
			s.iteration(2, 3, 300)
		},
		want: want{
			acquired: 3, overlaps: 1, overlapTime: 55, fRejected: 1,
			uStale: 1, uClobbers: 1, uLost: 1, uMissing: 1,
			lin: Linearizable, control: true,
		},
	}, {
		name: "overlapping critical sections",
		build: func(s *sim) {
			s.acquire(1, 1, 0, 10)
			s.acquire(2, 2, 5, 30)
			s.acquire(3, 3, 6, 40)
			s.release(3, 45, 46) // [40, 45]: 5 with 1, 5 with 2
			s.release(1, 50, 51) // [10, 50]: 20 with 2
			s.release(2, 80, 81) // [30, 80]
			s.acquire(1, 4, 80, 82)
			s.release(1, 90, 91) // [82, 90]: touches nothing
			s.acquire(1, 5, 91, 95)
			s.release(1, 99, 100) // worker 1 again: never overlaps itself
		},
		want: want{acquired: 5, overlaps: 3, overlapTime: 30, lin: NotChecked},
	}, {
		name: "token regression",
		build: func(s *sim) {
			s.acquire(1, 5, 0, 1)
			s.release(1, 2, 3)
			s.acquire(2, 3, 4, 5) // called after token 5 was returned: regression
			s.release(2, 6, 7)
			s.acquire(3, 5, 8, 9) // equal to an earlier token: regression
			s.release(3, 10, 11)
			s.acquire(1, 6, 12, 20)
			s.acquire(2, 4, 13, 14) // concurrent with token 6's acquisition, but after token 5's: regression
			s.acquire(3, 7, 30, 31)
		},
		want: want{acquired: 6, regressions: 3, lin: NotChecked}, // the last three never release: killed, their sections end at once
	}, {
		// Worker 1 is killed in its write of the fenced register, after
		// the register applied it: no write event, no release. Its
		// critical section ends with its last event; worker 2 reads the
		// value worker 1 wrote.
		name: "torn: worker killed",
		build: func(s *sim) {
			s.acquire(1, 1, 0, 5)
			f := s.read(1, history.Fenced, 10, 15)
			u := s.read(1, history.Unfenced, 20, 25)
			s.apply(1, history.Fenced, f+1, 30)
			_ = u
			s.iteration(2, 2, 100)
		},
		want: want{acquired: 2, lin: Linearizable},
	}, {
		// Worker 1's fenced write times out (unknown) but was applied;
		// worker 2's times out and was not; worker 3 reads what worker 1
		// wrote. Both unknowns are possible; nothing is lost.
		name: "unknown outcomes",
		build: func(s *sim) {
			s.acquire(1, 1, 0, 5)
			f := s.read(1, history.Fenced, 10, 15)
			s.write(1, history.Fenced, f+1, 20, 25, history.Unknown)
			s.release(1, 30, 35)
			s.acquire(2, 2, 40, 45)
			s.read(2, history.Fenced, 50, 55)
			s.ev = append(s.ev, history.Event{Worker: 2, Key: key, Op: history.OpWrite, Register: history.Fenced, Token: 2, Value: 2, T0: 60, T1: 65, Result: history.Unknown})
			s.release(2, 70, 75)
			s.iteration(3, 3, 100)
		},
		want: want{acquired: 3, lin: Linearizable},
	}, {
		// A fenced register that wrongly applies a stale write: its log
		// shows the stale accept and the lost update, and Porcupine finds
		// no linearization (worker 1's write at token 1 succeeded after
		// token 2 was admitted).
		name: "fenced register accepts a stale token",
		build: func(s *sim) {
			s.acquire(1, 1, 0, 5)
			f := s.read(1, history.Fenced, 10, 15)
			s.iteration(2, 2, 100)
			s.apply(1, history.Fenced, f+1, 200)
			s.ev = append(s.ev, history.Event{Worker: 1, Key: key, Op: history.OpWrite, Register: history.Fenced, Token: 1, Value: f + 1, T0: 200, T1: 205, Result: history.OK})
			s.lost(1, 210)
		},
		want: want{
			acquired: 2, overlaps: 1, overlapTime: 55,
			fStale: 1, fLost: 1, fMissing: 1,
			lin: NotLinearizable, fencedViolated: true,
		},
	}, {
		// Only Porcupine can see this one: a read returns a value no one
		// wrote; the register's log is clean.
		name: "fenced read of a value never written",
		build: func(s *sim) {
			s.iteration(1, 1, 0)
			s.acquire(2, 2, 100, 105)
			s.ev = append(s.ev, history.Event{Worker: 2, Key: key, Op: history.OpRead, Register: history.Fenced, Token: 2, Value: 7, T0: 110, T1: 115, Result: history.OK})
			s.release(2, 120, 125)
		},
		want: want{acquired: 2, lin: NotLinearizable, fencedViolated: true},
	}, {
		// A fenced write refused although its token was the highest.
		name: "fenced register refuses a current token",
		build: func(s *sim) {
			s.iteration(1, 1, 0)
			s.acquire(2, 2, 100, 105)
			s.ev = append(s.ev, history.Event{Worker: 2, Key: key, Op: history.OpWrite, Register: history.Fenced, Token: 2, Value: 2, T0: 110, T1: 115, Result: history.Rejected})
			s.release(2, 120, 125)
		},
		want: want{acquired: 2, fRejected: 1, lin: NotLinearizable, fencedViolated: true},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSim()
			c.build(s)
			r := Analyze(s.ev)
			if g := got(r); g != c.want {
				t.Errorf("Analyze:\n got %+v\nwant %+v\nreport %+v", g, c.want, r)
			}
			violated := r.Overlaps > 0 || r.TokenRegressions > 0 || r.FencedViolations() || r.ControlSawViolations()
			if violated != (len(r.Examples) > 0) {
				t.Errorf("violations %v, examples %q", violated, r.Examples)
			}
			// Deterministic, and independent of how the workers' logs
			// are interleaved.
			again := Analyze(shuffleWorkers(s.ev))
			if !reflect.DeepEqual(r, again) {
				t.Errorf("Analyze of the same history, interleaved differently:\n%+v\n%+v", r, again)
			}
		})
	}
}

// shuffleWorkers reorders a history as ReadFiles of one file per worker
// (in descending worker order) and one per register would: each log
// keeps its own order.
func shuffleWorkers(ev []history.Event) []history.Event {
	files := map[string][]history.Event{}
	var names []string
	for _, e := range ev {
		name := "w" + string(rune('0'+e.Worker))
		if e.Op == history.OpAccept {
			name = "r" + e.Register
		}
		if _, ok := files[name]; !ok {
			names = append(names, name)
		}
		files[name] = append(files[name], e)
	}
	slices.Sort(names)
	slices.Reverse(names)
	var out []history.Event
	for _, n := range names {
		out = append(out, files[n]...)
	}
	return out
}

func TestRegisterKeyFallback(t *testing.T) {
	// A register that does not record keys: its log has Key "", the
	// workers' writes have theirs; acknowledged writes still count
	// against it.
	s := newSim()
	s.iteration(1, 1, 0)
	s.iteration(2, 2, 100)
	for i := range s.ev {
		if s.ev[i].Op == history.OpAccept {
			s.ev[i].Key = ""
		}
	}
	r := Analyze(s.ev)
	if r.Fenced.AckedWrites != 2 || r.Fenced.Final != 2 || r.Fenced.AckedMissing != 0 || r.Linearizability != Linearizable {
		t.Fatalf("Analyze = %+v", r)
	}
}

func TestWindows(t *testing.T) {
	var ev []history.Event
	for i := range 100 { // one acquisition every 10 ms, taking i+1 ms
		t0 := int64(i) * int64(10*time.Millisecond)
		ev = append(ev, history.Event{Worker: 1, Op: history.OpAcquire, Result: history.OK, T0: t0, T1: t0 + int64(i+1)*int64(time.Millisecond)})
	}
	ev = append(ev, history.Event{Worker: 2, Op: history.OpAcquire, Result: history.Failed, T0: 0, T1: int64(time.Second)})
	if got := Rate(ev, 0, int64(time.Second)); got != 91 { // i = 91 returns at 1.002s
		t.Errorf("Rate over [0, 1s) = %v, want 91", got)
	}
	if got := Rate(ev, 0, int64(2*time.Second)); got != 50 {
		t.Errorf("Rate over [0, 2s) = %v, want 50", got)
	}
	if got := Rate(ev, int64(2*time.Second), int64(3*time.Second)); got != 0 {
		t.Errorf("Rate after the end = %v", got)
	}
	if got := Rate(ev, 5, 5); got != 0 {
		t.Errorf("Rate of an empty window = %v", got)
	}
	l := Latency(ev, 0, int64(time.Second))
	if l.N != 100 || l.P50 != 50*time.Millisecond || l.P99 != 99*time.Millisecond || l.Max != 100*time.Millisecond {
		t.Errorf("Latency = %+v", l)
	}
	l = Latency(ev, int64(500*time.Millisecond), int64(600*time.Millisecond)) // i = 50..59
	if l.N != 10 || l.P50 != 55*time.Millisecond || l.P99 != 60*time.Millisecond {
		t.Errorf("Latency in [0.5s, 0.6s) = %+v", l)
	}
	if l := Latency(nil, 0, 1); l != (Latencies{}) {
		t.Errorf("Latency of nothing = %+v", l)
	}
}

func TestRow(t *testing.T) {
	s := newSim()
	s.iteration(1, 1, 0)
	r := Analyze(s.ev)
	if len(r.Row()) != len(Columns()) {
		t.Fatalf("Row has %d cells, Columns %d", len(r.Row()), len(Columns()))
	}
	if str := r.String(); !strings.Contains(str, "acquired=1") || !strings.Contains(str, "fenced history=linearizable") {
		t.Errorf("String = %q", str)
	}
}

func TestEmpty(t *testing.T) {
	r := Analyze(nil)
	if r.Linearizability != NotChecked || r.ControlSawViolations() || r.FencedViolations() {
		t.Fatalf("Analyze(nil) = %+v", r)
	}
}

// Symptom: a token granted twice by concurrent acquisitions went uncounted.
// Two acquisitions of one key granted the same token to different
// holders: fencing cannot tell them apart. With the two calls concurrent
// (the second called before the first returned), the ordered comparison
// with acquisitions completed before the call does not see it, the
// sections do not overlap, and the guard (correctly) refuses the second
// holder, so Porcupine is satisfied too: the token granted twice is
// itself counted as a token regression.
func TestAnalyze_CountsTokenGrantedTwiceToConcurrentAcquisitions(t *testing.T) {
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

// Symptom: a fenced write at an equal token from another worker was not counted stale.
// The fenced register applies a write at the highest token it had
// applied, presented by another worker: dlock's rule for exclusive fences
// refuses an equal token from another holder, so (b) counts it as a stale
// write, not only tokens strictly below the highest (otherwise only
// Porcupine, when it does not time out, would see it).
func TestAnalyze_EqualTokenFromOtherWorkerIsStale(t *testing.T) {
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
