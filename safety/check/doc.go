// Package check reads a safety-harness history (package history) and
// counts what broke: Analyze returns a Report, one matrix row per run.
// Analyze is pure and deterministic: the same events give the same Report
// whatever order the per-process logs were concatenated in, as long as
// each register's accept events keep the order the register logged them
// (its apply order; ReadFiles keeps it). The one exception is a Porcupine
// check that hits its timeout (TimedOut).
//
// # Inputs
//
// Worker events (Op acquire, read, write, release, lost) carry the
// worker's times T0 (call) and T1 (return, 0 if it never returned) on the
// host's monotonic clock, its lock's Token and the Result. Register events
// (Op accept) are the register's own log of the writes it applied, in its
// order: Register, Worker, Token, Value, T0 = when it applied it. Every
// accept is taken to be a write: a register that also logs the reads it
// admitted needs a way to tell them apart (see Limits).
//
// # The counts
//
// (a) Overlaps. A worker's critical section starts at the return (T1) of
// an acquisition with Result OK and ends at the earliest of the call (T0)
// of its next release and the return of its next lost event; with neither
// before its next acquisition attempt or the end of its log (a killed
// worker), at the end of its last event. Overlaps counts the pairs of
// sections of one key, held by different workers, that share a positive
// time; OverlapTime sums that shared time, MaxOverlap is the longest.
// These are the sections as the workers saw them: a holder paused past
// its TTL overlaps its successor for the whole pause. That is what a lock
// alone cannot prevent and fencing must make harmless; an overlap is not
// by itself a fencing violation.
//
// Shared sections (an acquisition with Shared set: a Shared or Limited
// lock) may overlap each other: a pair of them is not counted. A pair of
// which at least one is exclusive is (a writer overlapping a reader).
//
// (a') Semaphores. For the sections of Limited locks (Limit > 0 on the
// acquisition), Report.BeyondLimit counts, per key, the sections that
// began while Limit sections of the key were already open (an entry
// beyond the limit), BeyondLimitTime the time during which more than the
// limit were open, MaxInside the most open at once. Sections that only
// touch (one ends at the instant the next begins) are not counted.
//
// (b) Stale writes. Register.StaleAccepted counts the register's accepts
// whose token is below the highest token among the writes it applied
// before (in its log order), or equal to it from another worker (dlock's
// rule for exclusive fences admits an equal token from its holder only). For the unfenced register this is the
// damage a plain lock lets through; for the fenced one it must be 0.
// Register.RejectedWrite (the fenced column "stale rejected") counts the
// workers' writes with Result Rejected: what fencing refused.
// RejectedReads counts refused fenced reads.
//
// (c) Lost updates. The register is a counter: every write carries the
// value read + 1. Over the register's log, with the value before the first
// accept 0, an accept whose Value is not the previous value + 1 is a
// clobber (Register.Clobbers); Register.LostUpdates is the number of
// increments clobbers erased, Σ max(0, previous + 1 - Value), which, when
// no write jumps ahead, equals the number of accepts minus the final
// value. From the workers' side, Register.AckedMissing is, per key,
// max(0, writes acknowledged with Result OK - final value): acknowledged
// increments the final value lacks. The fenced register must show 0 for
// both; the unfenced one shows them when a paused holder writes late.
// Writes with unknown outcomes that were applied raise the final value,
// so AckedMissing can understate; LostUpdates, from the register's log,
// does not depend on acknowledgements.
//
// (d) Token regressions. An acquisition with Result OK is a regression if
// its token is not above (is below or equal to) the token of some
// acquisition of the same key with Result OK that returned (T1) before it
// was called (T0), or if its token equals the token of an acquisition of
// the same key with Result OK called before it: concurrent acquisitions
// are not ordered, but two holders granted one token cannot be told apart
// by a fence, whatever their timing.
//
// (e) Linearizability. The workers' reads and writes of the fenced
// register are checked with Porcupine (CheckOperationsTimeout, by key)
// against a model of a counter behind dlock's fencing rule for exclusive
// fences: an operation is admitted iff its token is not 0 and is above the
// highest admitted token, or equal to it from the same worker; an
// admitted read returns the value and, like a write, records its token as
// the highest; a refused operation (Result Rejected) changes nothing. A
// read with Shared set (at a Shared or Limited lock's fence) follows
// dlock's rule for shared fences: admitted iff its token is not 0 and at
// least the highest admitted token, and it records nothing.
// Operations with Result Failed are left out. An operation with Result
// Unknown (or without a return time) returns at infinity and takes effect
// if the model admits it: it may be linearized anywhere after its call,
// including after everything else, which is not taking effect. The
// register's log sharpens this: an unknown write it shows applied (same
// worker, token and value) is done, and an applied write no worker logged
// (the worker was killed before it could) is added as done, called at the
// end of that worker's last event before the register applied it, both
// returning at infinity. NotLinearizable means some client saw the fenced
// register behave in a way no order of its operations explains: a stale
// write that succeeded, a read of a value no one wrote, a refusal of the
// current holder.
//
// Report also counts acquisitions by result and lost events. Rate
// (acquisitions per second that returned in a window) and Latency (p50,
// p99, max of T1 - T0 of successful acquisitions called in a window)
// measure availability before and during a fault.
// ControlSawViolations tells whether the negative control (the unfenced
// register) shows stale accepts or lost updates; a run whose faults
// should break a plain lock and whose control saw nothing must fail.
// FencedViolations tells whether fencing failed.
//
// # Limits
//
//   - Clock: all times must come from one host's monotonic clock
//     (history.Now). Overlaps and regressions shorter than the logging
//     delay (the time between an operation's effect and its recorded
//     T0/T1) are invisible, and the logging delay can also stretch a
//     section: a release is taken at its call, a lost event at its return.
//   - One lock at a time per worker: a worker's sections are cut by its
//     own acquisitions, whatever their keys.
//   - Sections of an acquisition with Result Unknown are not counted: the
//     worker does not know it holds the lock, and does not use it.
//   - Registers start at 0, and every accept is a write. If the register
//     also logs admitted reads as accepts, the history needs a field or an
//     Op to tell them apart (not in history.Event today); reads in the log
//     would be counted as clobbers. Stale counts compare with the highest
//     token the register applied in writes only, so a stale write after a
//     newer holder's read but before its write is not counted as stale
//     (it is refused by the fenced register all the same, and Porcupine,
//     which models fenced reads, checks it).
//   - Token 0 is never admitted by the model (dlock's rule); a history of
//     a lock without tokens checks as not linearizable.
//   - Register keys: a worker's write is matched to the register copy of
//     its Key, or to the copy of the empty Key if the register logs no
//     keys. Register.Final sums the final values over keys.
//   - Porcupine's search is exponential in the worst case; operations
//     returning at infinity (unknown outcomes) widen it. Analyze bounds it
//     (DefaultTimeout; AnalyzeWith sets another) and reports TimedOut
//     rather than a verdict.
//   - A killed worker's reads are not in the register's log and are lost
//     with the worker: Porcupine cannot see the token such a read
//     recorded.
package check
