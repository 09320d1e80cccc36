package check

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Linearizability is the verdict of the Porcupine check of the fenced
// register.
type Linearizability string

const (
	// Linearizable: some linearization of the fenced register's
	// operations obeys the fenced-register model.
	Linearizable Linearizability = "linearizable"
	// NotLinearizable: none does; a fencing violation a client could see.
	NotLinearizable Linearizability = "NOT-linearizable"
	// TimedOut: the search did not finish within the timeout; no verdict.
	TimedOut Linearizability = "timed-out"
	// NotChecked: the history holds no operation on the fenced register.
	NotChecked Linearizability = "not-checked"
)

// Register is what a history shows about one register (fenced or
// unfenced), summed over keys. See the package documentation for the
// exact definitions.
type Register struct {
	Name string

	// The register's log (OpAccept events).
	Accepted      int   // writes the register applied
	StaleAccepted int   // applied writes whose token is below the highest it had applied before, or equal to it from another worker
	Clobbers      int   // applied writes whose Value is not the previous value + 1
	LostUpdates   int64 // increments erased by clobbers: Σ max(0, previous + 1 - Value)
	Final         int64 // the last applied Value (summed over keys)

	// The workers' view (OpWrite and OpRead events).
	AckedWrites   int   // writes with Result OK
	UnknownWrites int   // writes with Result Unknown
	RejectedWrite int   // writes refused by the fencing check (Result Rejected)
	RejectedReads int   // reads refused by the fencing check
	AckedMissing  int64 // max(0, AckedWrites - Final), per key: acknowledged increments the final value lacks
}

// Violations reports whether the register shows a safety violation:
// a stale write applied or an update lost.
func (g Register) Violations() bool {
	return g.StaleAccepted > 0 || g.LostUpdates > 0 || g.AckedMissing > 0
}

// Report is what Analyze found in one run's history.
type Report struct {
	// Start and End bound the workers' events (monotonic ns): the first
	// call and the last call or return.
	Start, End int64
	Workers    int // distinct workers with at least one event

	Acquired       int // acquisitions with Result OK
	AcquireFailed  int // acquisitions with Result Failed
	AcquireUnknown int // acquisitions with Result Unknown
	LostEvents     int // OpLost events: a worker noticed it lost its lock

	// (a) Overlapping critical sections of one key held by different
	// workers: the number of such pairs, their summed overlap, the
	// longest one.
	Overlaps    int
	OverlapTime time.Duration
	MaxOverlap  time.Duration

	// (a') Limited locks (semaphores): sections that began while the
	// lock's limit of sections of the key were already open, the time
	// during which more than the limit were open, and the most sections
	// of a Limited lock open at once. Overlaps leaves pairs of shared
	// sections (Shared or Limited) out.
	BeyondLimit     int
	BeyondLimitTime time.Duration
	MaxInside       int

	// (d) Successful acquisitions whose token is not above the token of
	// every successful acquisition of the key that completed before
	// they started, or that repeat the token of an earlier-called one.
	TokenRegressions int

	// (b), (c) per register.
	Fenced, Unfenced Register

	// (e) Porcupine's verdict on the fenced register's operations, and
	// how many operations it checked.
	Linearizability Linearizability
	CheckedOps      int

	// Examples are a few violations, described for a human (at most
	// MaxExamples), in a deterministic order.
	Examples []string
}

// MaxExamples bounds Report.Examples.
const MaxExamples = 10

// ControlSawViolations reports whether the negative control, the
// unfenced register, shows violations: stale writes applied or lost
// updates. A run whose faults should break a plain lock (a holder paused
// past its TTL) and whose control shows none has a blind checker or a
// fault that did not bite, and must fail.
func (r Report) ControlSawViolations() bool {
	return r.Unfenced.StaleAccepted > 0 || r.Unfenced.LostUpdates > 0 || r.Unfenced.AckedMissing > 0
}

// FencedViolations reports whether fencing failed: a stale write applied
// to the fenced register, an update of it lost, or a history Porcupine
// finds not linearizable.
func (r Report) FencedViolations() bool {
	return r.Fenced.Violations() || r.Linearizability == NotLinearizable
}

// Columns names the cells of Row, for a matrix header.
func Columns() []string {
	return []string{
		"acquired", "overlaps", "overlap time", "beyond limit", "token regressions",
		"stale accepted (unfenced)", "lost updates (unfenced)",
		"stale accepted (fenced)", "stale rejected (fenced)", "lost updates (fenced)",
		"fenced history",
	}
}

// Row is the report as one matrix row, one cell per Columns entry.
func (r Report) Row() []string {
	return []string{
		strconv.Itoa(r.Acquired),
		strconv.Itoa(r.Overlaps),
		r.OverlapTime.Round(time.Millisecond).String(),
		strconv.Itoa(r.BeyondLimit),
		strconv.Itoa(r.TokenRegressions),
		strconv.Itoa(r.Unfenced.StaleAccepted),
		strconv.FormatInt(max(r.Unfenced.LostUpdates, r.Unfenced.AckedMissing), 10),
		strconv.Itoa(r.Fenced.StaleAccepted),
		strconv.Itoa(r.Fenced.RejectedWrite),
		strconv.FormatInt(max(r.Fenced.LostUpdates, r.Fenced.AckedMissing), 10),
		string(r.Linearizability),
	}
}

// String is the report on one line.
func (r Report) String() string {
	cols, row := Columns(), r.Row()
	parts := make([]string, len(cols))
	for i := range cols {
		parts[i] = cols[i] + "=" + row[i]
	}
	return strings.Join(parts, " ")
}

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < MaxExamples {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}
