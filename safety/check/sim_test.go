package check

import (
	"github.com/dlock-go/dlock/safety/history"
)

// sim builds histories by hand: workers call operations at explicit times
// on two registers that apply them at their call time, the fenced one by
// dlock's rule, and log what they applied.
type sim struct {
	ev  []history.Event
	tok map[int]uint64 // each worker's current token
	reg map[string]*regState
}

func newSim() *sim {
	return &sim{tok: map[int]uint64{}, reg: map[string]*regState{
		history.Fenced:   {owner: -1},
		history.Unfenced: {owner: -1},
	}}
}

const key = "k"

func (s *sim) acquire(w int, tok uint64, t0, t1 int64) {
	s.tok[w] = tok
	s.ev = append(s.ev, history.Event{Worker: w, Key: key, Op: history.OpAcquire, Token: tok, Result: history.OK, T0: t0, T1: t1})
}

func (s *sim) release(w int, t0, t1 int64) {
	s.ev = append(s.ev, history.Event{Worker: w, Key: key, Op: history.OpRelease, Token: s.tok[w], Result: history.OK, T0: t0, T1: t1})
}

func (s *sim) lost(w int, t int64) {
	s.ev = append(s.ev, history.Event{Worker: w, Key: key, Op: history.OpLost, Token: s.tok[w], T0: t, T1: t})
}

// admitted applies the register's rule at worker w's token.
func (s *sim) admitted(w int, reg string) bool {
	st := s.reg[reg]
	in := regInput{token: s.tok[w], worker: w}
	return reg == history.Unfenced || st.admit(in)
}

// read reads reg at t0 and returns the value read (or -1 if refused).
func (s *sim) read(w int, reg string, t0, t1 int64) int64 {
	st := s.reg[reg]
	e := history.Event{Worker: w, Key: key, Op: history.OpRead, Register: reg, Token: s.tok[w], T0: t0, T1: t1}
	if !s.admitted(w, reg) {
		e.Result = history.Rejected
		s.ev = append(s.ev, e)
		return -1
	}
	st.hi, st.owner = max(st.hi, s.tok[w]), w
	e.Result, e.Value = history.OK, st.value
	s.ev = append(s.ev, e)
	return st.value
}

// write writes v to reg at t0 (logging the accept there) and returns
// whether it was admitted; the worker logs res (or Rejected).
func (s *sim) write(w int, reg string, v, t0, t1 int64, res history.Result) bool {
	e := history.Event{Worker: w, Key: key, Op: history.OpWrite, Register: reg, Token: s.tok[w], Value: v, T0: t0, T1: t1, Result: res}
	if !s.admitted(w, reg) {
		e.Result = history.Rejected
		s.ev = append(s.ev, e)
		return false
	}
	s.apply(w, reg, v, t0)
	s.ev = append(s.ev, e)
	return true
}

// apply makes reg apply a write of v by w, as its log records it.
func (s *sim) apply(w int, reg string, v, t int64) {
	st := s.reg[reg]
	st.value, st.hi, st.owner = v, max(st.hi, s.tok[w]), w
	s.ev = append(s.ev, history.Event{Worker: w, Key: key, Op: history.OpAccept, Register: reg, Token: s.tok[w], Value: v, T0: t})
}

// iteration is a whole clean worker iteration starting at t, 10 ns per
// operation; it returns the time after it.
func (s *sim) iteration(w int, tok uint64, t int64) int64 {
	s.acquire(w, tok, t, t+5)
	f := s.read(w, history.Fenced, t+10, t+15)
	u := s.read(w, history.Unfenced, t+20, t+25)
	s.write(w, history.Fenced, f+1, t+40, t+45, history.OK)
	s.write(w, history.Unfenced, u+1, t+50, t+55, history.OK)
	s.release(w, t+60, t+65)
	return t + 70
}
