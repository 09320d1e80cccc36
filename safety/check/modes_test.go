package check

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/safety/history"
)

// Histories of Shared (read) and Limited (semaphore) locks, built by hand.

func acq(w int, tok uint64, t0, t1 int64, shared bool, limit int) history.Event {
	return history.Event{Worker: w, Key: key, Op: history.OpAcquire, Token: tok, Result: history.OK, T0: t0, T1: t1, Shared: shared, Limit: limit}
}

func rel(w int, tok uint64, t0, t1 int64) history.Event {
	return history.Event{Worker: w, Key: key, Op: history.OpRelease, Token: tok, Result: history.OK, T0: t0, T1: t1}
}

func rd(w int, tok uint64, v, t0, t1 int64, shared bool, res history.Result) history.Event {
	return history.Event{Worker: w, Key: key, Op: history.OpRead, Register: history.Fenced, Token: tok, Value: v, Result: res, T0: t0, T1: t1, Shared: shared}
}

func wr(w int, tok uint64, v, t0, t1 int64, res history.Result) []history.Event {
	e := history.Event{Worker: w, Key: key, Op: history.OpWrite, Register: history.Fenced, Token: tok, Value: v, Result: res, T0: t0, T1: t1}
	if res != history.OK {
		return []history.Event{e}
	}
	return []history.Event{e, {Worker: w, Key: key, Op: history.OpAccept, Register: history.Fenced, Token: tok, Value: v, T0: t0 + 1}}
}

func TestReadersOverlapEachOtherNotWriters(t *testing.T) {
	// Readers 1 and 2 overlap each other: allowed.
	ev := []history.Event{
		acq(1, 1, 0, 10, true, 0), acq(2, 2, 5, 15, true, 0),
		rd(1, 1, 0, 20, 21, true, history.OK), rd(2, 2, 0, 22, 23, true, history.OK),
		rel(1, 1, 30, 31), rel(2, 2, 40, 41),
	}
	if r := Analyze(ev); r.Overlaps != 0 || r.Acquired != 2 || r.Linearizability != Linearizable || r.BeyondLimit != 0 {
		t.Fatalf("two readers: %d overlaps, %d acquired, %s, %d beyond limit", r.Overlaps, r.Acquired, r.Linearizability, r.BeyondLimit)
	}
	// A writer overlapping a reader is an overlap; so is a writer
	// overlapping a writer.
	ev = append(ev, acq(3, 3, 35, 38, false, 0), rel(3, 3, 50, 51), acq(4, 4, 45, 48, false, 0), rel(4, 4, 60, 61))
	r := Analyze(ev)
	if r.Overlaps != 2 || r.OverlapTime != time.Duration(40-38)+time.Duration(50-48) {
		t.Fatalf("writers 3 and 4 overlap reader 2 and each other: %d overlaps (%v)", r.Overlaps, r.OverlapTime)
	}
}

// A writer paused past its TTL: a reader came in (token above the
// writer's) and read the old value. Its shared fence raises the highest
// token the guard admitted, so the writer's late write must be refused: a
// history where it was admitted is not linearizable, in either mode of
// the read; one where it was refused is.
func TestSharedReadsFenceOutOlderWriters(t *testing.T) {
	build := func(shared bool, late history.Result) []history.Event {
		ev := []history.Event{acq(1, 1, 0, 5, false, 0), rd(1, 1, 0, 10, 11, false, history.OK)}
		// writer 1 pauses; reader 2 enters with token 2 and reads 0
		ev = append(ev, acq(2, 2, 100, 105, shared, 0), rd(2, 2, 0, 110, 111, shared, history.OK), rel(2, 2, 120, 121))
		// writer 1 resumes and writes 1
		ev = append(ev, wr(1, 1, 1, 200, 205, late)...)
		return append(ev, rel(1, 1, 210, 211))
	}
	for _, shared := range []bool{true, false} {
		if r := Analyze(build(shared, history.OK)); r.Linearizability != NotLinearizable {
			t.Errorf("late write admitted after a read at token 2 (shared %v): %s, want not linearizable", shared, r.Linearizability)
		}
		if r := Analyze(build(shared, history.Rejected)); r.Linearizability != Linearizable {
			t.Errorf("late write refused after a read at token 2 (shared %v): %s, want linearizable: %v", shared, r.Linearizability, r.Examples)
		}
	}
}

// A shared read below the highest exclusive token must be refused; one
// reported as done is a fencing violation.
func TestSharedReadBelowWriterRefused(t *testing.T) {
	base := []history.Event{acq(1, 3, 0, 5, false, 0)}
	base = append(base, wr(1, 3, 1, 10, 11, history.OK)...)
	base = append(base, rel(1, 3, 20, 21), acq(2, 2, 30, 35, true, 0))
	ok := append(append([]history.Event{}, base...), rd(2, 2, 1, 40, 41, true, history.OK))
	if r := Analyze(ok); r.Linearizability != NotLinearizable {
		t.Fatalf("a shared read at token 2 admitted after a write at token 3: %s", r.Linearizability)
	}
	refused := append(append([]history.Event{}, base...), rd(2, 2, 0, 40, 41, true, history.Rejected))
	if r := Analyze(refused); r.Linearizability != Linearizable {
		t.Fatalf("a shared read at token 2 refused after a write at token 3: %s (%v)", r.Linearizability, r.Examples)
	}
}

func TestBeyondLimit(t *testing.T) {
	// Limit 2: workers 1 and 2 inside, 3 enters (beyond), 1 leaves, 4
	// enters (beyond again: 2 and 3 are inside), then all leave.
	ev := []history.Event{
		acq(1, 1, 0, 10, true, 2), acq(2, 2, 0, 20, true, 2), acq(3, 3, 0, 30, true, 2),
		rel(1, 1, 40, 41), acq(4, 4, 42, 50, true, 2),
		rel(2, 2, 60, 61), rel(3, 3, 70, 71), rel(4, 4, 80, 81),
	}
	r := Analyze(ev)
	if r.BeyondLimit != 2 || r.MaxInside != 3 || r.Overlaps != 0 {
		t.Fatalf("beyond limit %d, most inside %d, overlaps %d; want 2, 3, 0", r.BeyondLimit, r.MaxInside, r.Overlaps)
	}
	if want := time.Duration(40-30) + time.Duration(60-50); r.BeyondLimitTime != want {
		t.Fatalf("time beyond the limit %v, want %v", r.BeyondLimitTime, want)
	}
	// Sections that only touch (one ends as the next begins) are not
	// beyond the limit.
	ev = []history.Event{
		acq(1, 1, 0, 10, true, 1), rel(1, 1, 20, 21), acq(2, 2, 0, 20, true, 1), rel(2, 2, 30, 31),
	}
	if r := Analyze(ev); r.BeyondLimit != 0 || r.MaxInside != 1 {
		t.Fatalf("touching sections of a limit-1 semaphore: beyond %d, most inside %d", r.BeyondLimit, r.MaxInside)
	}
}
