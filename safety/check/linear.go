package check

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock/safety/history"
)

// The fenced-register model checked with Porcupine: a counter behind
// dlock's fencing rule (guard.Checker, dlock.FenceRecord.Admit). Reads and writes are both fenced: an admitted read records its
// token as the highest, like a write.

// regState is the model's state: the value, the last exclusive token
// admitted and the worker that presented it, and the highest token
// admitted in any mode.
type regState struct {
	value int64
	hi    uint64
	owner int
	seen  uint64
}

// regInput is an operation: a read, or a write of value, at token by
// worker; shared for a read at a shared fence (a Shared or Limited lock's).
type regInput struct {
	write  bool
	shared bool
	token  uint64
	worker int
	value  int64
}

// regOutput is its outcome: Result, and for a read with Result OK the
// value read.
type regOutput struct {
	result history.Result
	value  int64
}

// admit is the fencing rule (dlock.FenceRecord.Admit): never token 0; an
// exclusive fence above every token admitted, or equal to the last
// exclusive one from the same holder with nothing admitted above it; a
// shared fence at or above the last exclusive token.
func (s regState) admit(in regInput) bool {
	if in.shared {
		return in.token != 0 && in.token >= s.hi
	}
	seen := max(s.seen, s.hi)
	return in.token != 0 && (in.token > seen || in.token == s.hi && in.worker == s.owner && seen == s.hi)
}

func (s regState) apply(in regInput) regState {
	if in.shared {
		s.seen = max(s.seen, s.hi, in.token)
		return s
	}
	n := regState{value: s.value, hi: in.token, owner: in.worker, seen: in.token}
	if in.write {
		n.value = in.value
	}
	return n
}

var fencedModel = porcupine.Model{
	Partition: partitionByKey,
	Init:      func() any { return regState{owner: -1} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		ok := s.admit(in)
		switch out.result {
		case history.OK:
			if !ok || (!in.write && out.value != s.value) {
				return false, s
			}
			return true, s.apply(in)
		case history.Rejected:
			return !ok, s
		default: // Unknown: it took effect iff the register admitted it (its return is at infinity, so it may also be linearized after everything else, which is the same as not taking effect)
			if ok {
				return true, s.apply(in)
			}
			return true, s
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		if in.write {
			return fmt.Sprintf("w%d write(%d) tok %d -> %s", in.worker, in.value, in.token, out.result)
		}
		if in.shared {
			return fmt.Sprintf("w%d shared read tok %d -> %s %d", in.worker, in.token, out.result, out.value)
		}
		return fmt.Sprintf("w%d read tok %d -> %s %d", in.worker, in.token, out.result, out.value)
	},
	DescribeState: func(state any) string {
		s := state.(regState)
		return fmt.Sprintf("value %d, last exclusive token %d (w%d), highest token %d", s.value, s.hi, s.owner, max(s.seen, s.hi))
	},
}

// opMeta keeps the key of an operation, for partitioning.
type opMeta struct{ key string }

func partitionByKey(ops []porcupine.Operation) [][]porcupine.Operation {
	idx := map[string]int{}
	var out [][]porcupine.Operation
	for _, op := range ops {
		k := op.Metadata.(opMeta).key
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], op)
	}
	return out
}

// fencedOps turns the workers' reads and writes of the fenced register
// into Porcupine operations, completed with what the register's log
// (its accept events) tells:
//
//   - Failed operations (definitely not done) are left out.
//   - An operation with Result Unknown, or OK or Rejected without a
//     return time (T1 0), returns at infinity with an unknown outcome.
//   - A write with an unknown outcome that the register's log shows
//     applied (an accept of the same worker, token and value) is a write
//     with Result OK returning at infinity.
//   - A write the register's log shows applied that no worker event
//     records (the worker was killed before it could log it) is a write
//     with Result OK, called at the end of that worker's last event
//     before the register applied it, returning at infinity.
func fencedOps(events []history.Event) []porcupine.Operation {
	type wkey struct {
		worker int
		token  uint64
		value  int64
	}
	applied := map[wkey]int{} // accepts not yet matched to a worker's write
	for _, e := range events {
		if e.Op == history.OpAccept && e.Register == history.Fenced {
			applied[wkey{e.Worker, e.Token, e.Value}]++
		}
	}
	match := func(e history.Event) bool {
		k := wkey{e.Worker, e.Token, e.Value}
		if applied[k] > 0 {
			applied[k]--
			return true
		}
		return false
	}
	isWrite := func(e history.Event) bool {
		return e.Op == history.OpWrite && e.Register == history.Fenced
	}
	for _, e := range events { // writes known done claim their accepts first
		if isWrite(e) && e.Result == history.OK && e.T1 != 0 {
			match(e)
		}
	}

	var ops []porcupine.Operation
	add := func(e history.Event, out regOutput, ret int64) {
		in := regInput{write: e.Op == history.OpWrite, shared: e.Shared && e.Op == history.OpRead, token: e.Token, worker: e.Worker, value: e.Value}
		ops = append(ops, porcupine.Operation{
			ClientId: e.Worker, Input: in, Call: e.T0, Output: out, Return: max(ret, e.T0),
			Metadata: opMeta{key: e.Key},
		})
	}
	for _, e := range events {
		if e.Register != history.Fenced || (e.Op != history.OpRead && e.Op != history.OpWrite) {
			continue
		}
		out, ret := regOutput{result: e.Result}, e.T1
		switch e.Result {
		case history.OK, history.Rejected:
			if e.T1 == 0 {
				out.result, ret = history.Unknown, math.MaxInt64
			}
		case history.Unknown:
			ret = math.MaxInt64
		default: // Failed, or no result: not done
			continue
		}
		if out.result == history.Unknown && isWrite(e) && match(e) {
			out.result = history.OK
		}
		if out.result == history.OK && e.Op == history.OpRead {
			out.value = e.Value
		}
		add(e, out, ret)
	}

	// Accepts no worker event records.
	var byWorker map[int][]history.Event // per worker, its events by end
	for _, e := range events {
		if e.Op != history.OpAccept || e.Register != history.Fenced || !match(e) {
			continue
		}
		if byWorker == nil {
			byWorker = map[int][]history.Event{}
			for _, w := range events {
				if w.Op != history.OpAccept {
					byWorker[w.Worker] = append(byWorker[w.Worker], w)
				}
			}
			for _, ws := range byWorker {
				slices.SortStableFunc(ws, func(a, b history.Event) int { return cmp.Compare(end(a), end(b)) })
			}
		}
		w := e
		w.Op, w.T0 = history.OpWrite, 0
		ws := byWorker[e.Worker]
		if i, _ := slices.BinarySearchFunc(ws, e.T0+1, func(x history.Event, t int64) int { return cmp.Compare(end(x), t) }); i > 0 {
			w.T0 = end(ws[i-1]) // the worker's last event before the register applied the write
			if w.Key == "" {
				w.Key = ws[i-1].Key
			}
		}
		add(w, regOutput{result: history.OK}, math.MaxInt64)
	}
	return ops
}

func linearizability(r *Report, events []history.Event, timeout time.Duration) {
	ops := fencedOps(events)
	r.CheckedOps = len(ops)
	if len(ops) == 0 {
		r.Linearizability = NotChecked
		return
	}
	if timeout < 0 {
		timeout = 0 // porcupine: no bound
	}
	res := porcupine.CheckOperationsTimeout(fencedModel, ops, timeout)
	switch res {
	case porcupine.Ok:
		r.Linearizability = Linearizable
	case porcupine.Illegal:
		r.Linearizability = NotLinearizable
		r.example("fenced register: Porcupine found no linearization of its %d operations", len(ops))
	default:
		r.Linearizability = TimedOut
	}
}
