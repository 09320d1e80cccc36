package check

import (
	"github.com/dlock-go/dlock/safety/history"
)

// register analyses one register (by name), per key, and sums over keys.
//
// Keys: an accept event's Key names the key whose copy of the register it
// belongs to. A worker's event is matched to the copy of its own Key; if
// the register logged no accept under that Key but logged some under the
// empty Key (a register that does not record keys), to that one.
func register(r *Report, name string, events []history.Event) Register {
	g := Register{Name: name}
	type state struct {
		applied bool
		value   int64
		hi      history.Event // the accepted write with the highest token
		acked   int64
	}
	st := map[string]*state{}
	get := func(k string) *state {
		s := st[k]
		if s == nil {
			s = &state{}
			st[k] = s
		}
		return s
	}
	staleShown, clobberShown := 0, 0
	for _, e := range events {
		if e.Op != history.OpAccept || e.Register != name {
			continue
		}
		s := get(e.Key)
		g.Accepted++
		if s.applied && (e.Token < s.hi.Token || e.Token == s.hi.Token && e.Worker != s.hi.Worker) {
			g.StaleAccepted++
			if staleShown < 3 {
				staleShown++
				r.example("%s register applied a stale write on %q: worker %d token %d value %d at %d, after worker %d token %d",
					name, e.Key, e.Worker, e.Token, e.Value, e.T0, s.hi.Worker, s.hi.Token)
			}
		}
		if e.Value != s.value+1 {
			g.Clobbers++
			if lost := s.value + 1 - e.Value; lost > 0 {
				g.LostUpdates += lost
			}
			if clobberShown < 3 {
				clobberShown++
				r.example("%s register on %q: worker %d token %d wrote %d at %d over %d (%d increments lost)",
					name, e.Key, e.Worker, e.Token, e.Value, e.T0, s.value, max(0, s.value+1-e.Value))
			}
		}
		if !s.applied || e.Token > s.hi.Token {
			s.hi = e
		}
		s.applied = true
		s.value = e.Value
	}
	keyOf := func(k string) string {
		if _, ok := st[k]; ok {
			return k
		}
		if _, ok := st[""]; ok {
			return ""
		}
		return k
	}
	for _, e := range events {
		if e.Register != name || (e.Op != history.OpWrite && e.Op != history.OpRead) {
			continue
		}
		switch {
		case e.Op == history.OpWrite && e.Result == history.OK:
			g.AckedWrites++
			get(keyOf(e.Key)).acked++
		case e.Op == history.OpWrite && e.Result == history.Unknown:
			g.UnknownWrites++
		case e.Op == history.OpWrite && e.Result == history.Rejected:
			g.RejectedWrite++
		case e.Op == history.OpRead && e.Result == history.Rejected:
			g.RejectedReads++
		}
	}
	for _, k := range sortedKeys(st) {
		s := st[k]
		g.Final += s.value
		if miss := s.acked - s.value; miss > 0 {
			g.AckedMissing += miss
		}
	}
	return g
}
