package check

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dlock-go/dlock/safety/history"
)

// A long run of the shape `make safety` produces (4 workers, thousands of
// iterations, some holders paused past their TTL writing late, some
// writes with unknown outcomes) checks well within the timeout, and the
// counts add up.
func TestScale(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newSim()
	tt, tok := int64(0), uint64(0)
	pauses, unknowns := 0, 0
	for range 3000 {
		tok++
		w := int(tok % 4)
		if rng.IntN(50) == 0 { // w pauses after its reads; the next holder runs
			s.acquire(w, tok, tt, tt+5)
			f := s.read(w, history.Fenced, tt+10, tt+15)
			u := s.read(w, history.Unfenced, tt+20, tt+25)
			tok++
			tt = s.iteration((w+1)%4, tok, tt+100)
			s.write(w, history.Fenced, f+1, tt, tt+5, history.OK)
			s.write(w, history.Unfenced, u+1, tt+10, tt+15, history.OK)
			s.lost(w, tt+20)
			tt += 30
			pauses++
			continue
		}
		if rng.IntN(50) == 0 { // a fenced write times out, applied or not
			s.acquire(w, tok, tt, tt+5)
			f := s.read(w, history.Fenced, tt+10, tt+15)
			if rng.IntN(2) == 0 {
				s.write(w, history.Fenced, f+1, tt+20, tt+25, history.Unknown)
			} else {
				s.ev = append(s.ev, history.Event{Worker: w, Key: key, Op: history.OpWrite, Register: history.Fenced, Token: tok, Value: f + 1, T0: tt + 20, T1: tt + 25, Result: history.Unknown})
			}
			s.release(w, tt+30, tt+35)
			tt += 40
			unknowns++
			continue
		}
		tt = s.iteration(w, tok, tt)
	}
	start := time.Now()
	r := Analyze(s.ev)
	took := time.Since(start)
	t.Logf("%d events, %d pauses, %d unknowns: %v in %v", len(s.ev), pauses, unknowns, r, took)
	if r.Linearizability != Linearizable || r.FencedViolations() {
		t.Fatalf("fenced: %+v", r)
	}
	if r.Unfenced.StaleAccepted != pauses || r.Unfenced.LostUpdates != int64(pauses) || r.Overlaps != pauses || r.Fenced.RejectedWrite != pauses {
		t.Fatalf("with %d pauses: %+v", pauses, r)
	}
	if !r.ControlSawViolations() {
		t.Fatal("the control saw nothing")
	}
}
