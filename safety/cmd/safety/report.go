package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/safety/check"
)

// report is the matrix of a whole run.
type report struct {
	seed    uint64
	results []caseResult
	elapsed time.Duration
	quick   bool
}

// analyzed is one case's checker report plus availability.
type analyzed struct {
	check.Report
	rateBefore, rateDuring float64
	p99During              time.Duration
}

func (r *caseResult) analyze() analyzed {
	if r.analysis != nil {
		return *r.analysis
	}
	a := analyzed{Report: check.Analyze(r.events)}
	from, to := r.faultFrom, r.faultTo
	if from == 0 { // no fault: the middle third, like the fault window
		span := r.end - r.start
		from, to = r.start+span/3, r.start+2*span/3
	}
	a.rateBefore = check.Rate(r.events, r.start, from)
	a.rateDuring = check.Rate(r.events, from, to)
	a.p99During = check.Latency(r.events, from, to).P99
	r.analysis = &a
	return a
}

func (r *caseResult) summary() string {
	if r.err != "" {
		return "ERROR: " + r.err
	}
	if r.skipped != "" {
		return "SKIPPED: " + r.skipped
	}
	a := r.analyze()
	return fmt.Sprintf("faults %d, %s", r.injected, a.String())
}

// expectedLimit says why a fenced violation in this case is a documented
// limit rather than a bug ("" if it would be a bug).
//
// None today: the guard does not depend on the lock service, so no fault
// of the lock service excuses a stale write it accepted. The documented
// limits (a Redis token from a clock running behind, a Redlock quorum
// counter forgotten by a majority) show as token regressions, which the
// guard turns into refusals, not as fenced violations.
func expectedLimit(c caseSpec) string { return "" }

// problems are what make the run fail: a case that errored (a skipped
// case, whose mode the backend does not offer, is not one), a case that
// measured nothing (no acquisition or no fenced write applied: its zeros
// would pass vacuously), a fenced history Porcupine did not decide (not
// verified), a negative control that saw nothing under client
// pauses (the checker would be blind), and a fenced violation that is not
// a documented limit.
func (rep report) problems() []string {
	var out []string
	for i := range rep.results {
		r := &rep.results[i]
		if r.err != "" {
			out = append(out, r.spec.name()+": "+r.err)
			continue
		}
		if r.skipped != "" {
			continue
		}
		a := r.analyze()
		if r.spec.prim() == "sem" {
			out = append(out, semProblems(r, a)...)
			continue
		}
		if a.Acquired == 0 || a.Fenced.Accepted == 0 {
			out = append(out, fmt.Sprintf("%s: nothing was measured (%d acquisitions, %d fenced writes applied): a case whose workers never worked shows no violation vacuously", r.spec.name(), a.Acquired, a.Fenced.Accepted))
			continue
		}
		if r.spec.fault == "none" && (a.Overlaps > 0 || a.ControlSawViolations() || a.TokenRegressions > 0) {
			out = append(out, fmt.Sprintf("%s: the baseline (no fault) shows a broken lock: %s; reproduce with make safety-repro CASE=%s SEED=%d", r.spec.name(), a.String(), r.spec.name(), r.seed))
		}
		if r.spec.fault == "client-pause" && !a.ControlSawViolations() {
			out = append(out, fmt.Sprintf("%s: the negative control (unfenced register) shows no violation after %d pauses past the TTL: the checker or the harness is blind", r.spec.name(), r.injected))
		}
		if a.Linearizability == check.TimedOut {
			out = append(out, fmt.Sprintf("%s: Porcupine did not decide the fenced history (%d operations) within its timeout: the fenced register was not verified", r.spec.name(), a.CheckedOps))
		}
		if a.FencedViolations() && expectedLimit(r.spec) == "" {
			out = append(out, fmt.Sprintf("%s: the fenced register shows a violation: %s (examples: %s); reproduce with make safety-repro CASE=%s SEED=%d", r.spec.name(), a.String(), strings.Join(a.Examples, "; "), r.spec.name(), r.seed))
		}
	}
	return out
}

// semProblems are the problems of a semaphore row: its workers touch no
// register (permits overlap by design and no fence orders them), so what
// it measures is the number of holders inside at once. A row that
// acquired nothing measured nothing; the baseline must never have more
// than the limit inside, nor a token regression; under client pauses a
// paused holder's permit frees at its expiry and is taken by another, so
// the paused holder coming back makes one more than the limit: a row that
// never shows it did not exercise the fault (a blind check).
func semProblems(r *caseResult, a analyzed) []string {
	var out []string
	name := r.spec.name()
	switch {
	case a.Acquired == 0:
		return []string{fmt.Sprintf("%s: nothing was measured (no acquisition): a case whose workers never worked shows no violation vacuously", name)}
	case r.spec.fault == "none" && (a.BeyondLimit > 0 || a.Overlaps > 0 || a.TokenRegressions > 0):
		out = append(out, fmt.Sprintf("%s: the baseline (no fault) shows a broken semaphore: %s (examples: %s); reproduce with make safety-repro CASE=%s SEED=%d", name, a.String(), strings.Join(a.Examples, "; "), name, r.seed))
	case r.spec.fault == "client-pause" && a.BeyondLimit == 0:
		out = append(out, fmt.Sprintf("%s: no holder was ever beyond the limit after %d pauses past the TTL: the checker or the harness is blind", name, r.injected))
	}
	return out
}

func (rep report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Safety matrix\n\n")
	fmt.Fprintf(&b, "Generated by `make safety` (`cd safety && go run ./cmd/safety -out ../docs/safety.md`) on %s in %s, seed %d (`make safety SEED=%d` replays the fault schedule; server and scheduler timing still vary).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), rep.elapsed.Round(time.Second), rep.seed, rep.seed)
	b.WriteString(matrixIntro)
	b.WriteString("\n| backend | fault | faults | acquired | overlaps | stale writes accepted, no fencing | lost updates, no fencing | stale writes rejected by fencing | stale writes accepted with fencing | lost updates with fencing | fenced history | token regressions | acquisitions/s before → during | acquire p99 during | seed |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i := range rep.results {
		r := &rep.results[i]
		if r.err != "" {
			fmt.Fprintf(&b, "| %s | %s | error: %s |||||||||||| %d |\n", r.spec.backend, r.spec.fault, cell(r.err), r.seed)
			continue
		}
		if r.skipped != "" {
			fmt.Fprintf(&b, "| %s | %s | skipped: %s |||||||||||| %d |\n", r.spec.backend, r.spec.fault, cell(r.skipped), r.seed)
			continue
		}
		a := r.analyze()
		if r.spec.prim() == "sem" {
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d beyond the limit of %d (%s; most inside %d) | n/a | n/a | n/a | n/a | n/a | %s | %d | %s → %s | %s | %d |\n",
				r.spec.backend, r.spec.fault, r.injected, a.Acquired, a.BeyondLimit, semPermits, a.BeyondLimitTime.Round(time.Millisecond), a.MaxInside,
				a.Linearizability, a.TokenRegressions, rate(a.rateBefore), rate(a.rateDuring), a.p99During.Round(time.Millisecond), r.seed)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d (%s) | %d | %d | %d | %d | %d | %s | %d | %s → %s | %s | %d |\n",
			r.spec.backend, r.spec.fault, r.injected, a.Acquired, a.Overlaps, a.OverlapTime.Round(time.Millisecond),
			a.Unfenced.StaleAccepted, max(a.Unfenced.LostUpdates, a.Unfenced.AckedMissing),
			a.Fenced.RejectedWrite, a.Fenced.StaleAccepted, max(a.Fenced.LostUpdates, a.Fenced.AckedMissing),
			a.Linearizability, a.TokenRegressions, rate(a.rateBefore), rate(a.rateDuring), a.p99During.Round(time.Millisecond), r.seed)
	}
	b.WriteString("\n## Faults\n\n")
	seen := map[string]bool{}
	for _, r := range rep.results {
		if !seen[r.spec.fault] {
			seen[r.spec.fault] = true
			fmt.Fprintf(&b, "- **%s**: %s.\n", r.spec.fault, faultDoc[r.spec.fault])
		}
	}
	b.WriteString(matrixNotes)
	if ps := rep.problems(); len(ps) > 0 {
		b.WriteString("\n## Problems in this run\n\n")
		for _, p := range ps {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	return b.String()
}

// cell is text made fit for one table cell.
func cell(s string) string { return strings.NewReplacer("|", "/", "\n", " / ").Replace(s) }

// rate formats acquisitions per second: whole numbers, but two decimals
// below one (the Sentinel rows' 6 s sections make a fraction of one).
func rate(v float64) string {
	if v > 0 && v < 1 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

const matrixIntro = `Each case runs 4 worker processes for 12–20 s (the Sentinel rows 65 s,
with a 20 s TTL) on one key. A worker loops:
acquire → read both registers (the fenced read records its token) → think
(5 ms; half the TTL in the server-side fault cases, so that a restart or a
clock jump catches a holder mid-work; 6 s in the Sentinel rows, longer
than a failover) → write both registers (value read
+ 1) → release. It never checks its
lock between the read and the write: a pause there is exactly what a GC
pause or a stalled VM does to a real client. The **fenced** register sits
behind a ` + "`filelock.Guard`" + ` (a store separate from the lock service, which the
faults never touch); the **unfenced** register is its twin with no token
check — the negative control, a resource behind a plain lock. The checker
(` + "`safety/check`" + `) reads the workers' and the registers' logs (times from the
host's CLOCK_MONOTONIC, shared by all processes) and counts:

- **overlaps**: pairs of workers that both believed they held the key at the
  same instant (acquire returned → release called or loss noticed), and
  their total overlapped time;
- **stale writes accepted**: writes a register applied with a token below
  one it had already applied; **rejected by fencing**: writes the guard
  refused;
- **lost updates**: increments acknowledged or applied that the register's
  final value does not contain;
- **fenced history**: Porcupine's verdict on the fenced register's history
  against a fenced-register model (unknown outcomes treated as such);
- **token regressions**: an acquisition whose token is not above every
  token granted for the key before it began;
- **availability**: successful acquisitions per second before the first
  fault and during the fault window, and the acquire p99 during it.
`

const matrixNotes = `
## What the matrix shows, and the theory it tests

- **A lock alone is not enough** (the client-pause rows). On every backend
  a holder stopped past its TTL comes back believing it holds the lock: the
  lock service did its job (the lease expired, the next holder got a higher
  token), yet the two critical sections overlap. Without fencing the paused
  holder's write is accepted and the increments made meanwhile are lost;
  with fencing the same write is refused, no update is lost and Porcupine
  finds the fenced register linearizable. This is Kleppmann's argument
  ("How to do distributed locking", 2016), measured; it holds for etcd too,
  as Jepsen found for etcd 3.4.3's locks (2020), whose advice was to fence
  with the lease's revision, which is dlock's etcd token, and for
  ZooKeeper, whose session expiry hands the key on the same way. The run fails if
  the negative control shows no violation in a client-pause row, so the
  checker cannot be blind.
- **Server pauses, partitions and lost replies** cost availability for their
  duration (compare the acquisitions/s columns); they do not hand the key to
  a second holder while the first still works, because the holder's local
  deadline ends its lease on its side before the server can.
- **A restart without persistence** forgets held leases: another worker gets
  the key while the holder is still working, so sections overlap and the
  unfenced register loses updates. Fencing still holds because dlock's Redis
  token survives in the key after release and otherwise comes from the
  server clock in µs, which keeps tokens increasing across a restart while
  the server's clock does not run behind the tokens it issued — the
  documented limit (the Redis documentation's advice for Redlock is to delay
  restarts by the maximum TTL instead). **With appendfsync always** the lease
  survives the restart and there is no overlap.
- **A clock jump forward** on the Redis server expires a held lease early
  (Redis expires keys by its wall clock, an assumption Redlock's analysis
  depends on and Kleppmann criticised): the next holder enters while the
  first still works; fencing refuses the late write. The backward jump only
  makes leases last longer (liveness, not safety).
- **Without scripts** (the redis-tair rows): a server with Tair's CAS and
  CAD (here redis-server with the TairString module) and an ACL user who
  may run every command but scripts (+@all -@scripting), as managed
  services that deny Lua configure. redislock.New with its defaults sends
  a script, is refused (NOPERM), finds CAS and CAD and from then on locks
  with native commands only (redislock.ProtocolAuto): the Lua-free
  protocol. Its token follows the scripts' rule, max(the marker's token +
  1, the server's time in µs), taken while the attempt holds the key, so
  the rows read as the redis rows do: a paused holder comes back to a key
  granted to another with a higher token and the guard refuses its write;
  a stopped server, a stalled link and lost replies cost availability
  only; a restart without persistence forgets the lease (the row creates
  the user again at once, as a deployment's ACL file would), and fencing
  holds by the server's clock. Shared and limited locks need scripts:
  redislock refuses them on this path (dlock.ErrUnsupported), so the
  redis-tair-rw and redis-tair-sem rows are skipped, naming the refusal.
- **Redlock with one of three nodes restarted** (restart-minority) does not
  hand a key to two holders: a healthy holder took all three nodes, so one
  forgetful node leaves a majority still holding it. **Kleppmann's scenario**
  (the kleppmann row) does: the holder got a bare majority (A, B) while C
  was cut off, B restarts without persistence and C comes back, and (B, C)
  grant the key to a second client while the first still works. Without
  fencing the first holder's late write is accepted and updates are lost;
  Redlock's quorum fencing token is committed to a majority before use, so
  the second holder's token is above the first's and the guard refuses the
  late write. The kleppmann-clock row is the same scenario with B's wall
  clock jumping forward instead of a restart (Kleppmann's other example):
  the same overlap, refused the same way. A restart without persistence
  that also loses the quorum counter on a majority could let a token repeat: that is the documented
  limit (redlock's package docs), and the row's token-regression count
  would show it.
- **etcd's leader stopped**: the cluster elects a new leader and the leases
  survive it; expect a short unavailability and no overlap.
- **ZooKeeper** (the zk rows) is Curator's recipe: each attempt is an
  ephemeral sequential node, the lowest holds the key, and a node lives as
  long as its client's session, which the server expires when it has heard
  nothing from the client for the session timeout. So the lease is not a
  TTL the client asked for but the session's: zklock gives a lock two
  thirds of the timeout (the rows ask for 1.5 s, so a 1 s lease), counted
  from the sending of the last renewal (a sync, then an exists of the
  node) that found the node. The client-pause row is the case Kleppmann's
  article gives for ZooKeeper: the paused holder's session expires, its
  node goes, the next waiter enters, and the holder comes back to write;
  his remedy, the zxid as a fencing token, is dlock's token (the node's
  czxid), and the guard refuses the write. A stopped server, a stalled
  link and lost replies must cost availability only: the holder's deadline
  passes before the server can expire its session. A create whose reply
  is lost is found again by the owner id in the node's name, and a release
  whose reply is lost is retried until the node is gone, so no orphan node
  keeps the key for the rest of its session; the recovery (go-zookeeper
  waits a second before it retries a lone server, then the retried
  deletions) is why few keys change hands during the lost-replies window.
- **ZooKeeper's leader killed or stopped** (zk3): the two others elect a
  new leader in a new epoch, the high half of every zxid (the tokens jump
  by 2³² at each election), and take over its sessions with a fresh
  timeout; a killed leader is started again and rejoins as a follower, a
  stopped one resumes to find itself deposed. Tokens must keep increasing
  across elections, and a lease must not outlive the leader's silence:
  expect unavailability for the election and no overlap.
- **PostgreSQL** (the pg rows) keeps a lease as a row of a table:
  expires_at is the database's clock_timestamp() plus the TTL, written by
  the statement that grants or renews it, and a takeover is allowed only
  once expires_at ≤ clock_timestamp(). Expiry is judged by the server's
  one clock, never a client's; the holder counts its own deadline from
  the moment it sent the statement, which is before the server read its
  clock, so the holder's deadline passes first (a client clock running
  slow against the server's is what the drift allowance covers). Tokens
  come from a sequence, drawn (nextval) while the takeover holds the row's
  lock, so a key's tokens increase in grant order. The client-pause rows
  are Kleppmann's case once more: the row expires by the database's clock
  while the holder sleeps, the next worker takes it over with a higher
  token, and the guard refuses the late write. A stopped server (the
  postmaster and every backend), a stalled link and lost replies cost
  availability only: the server's clock runs on while it is stopped, and a
  renewal extends a row only if it is still the owner's and unexpired by
  that clock, so a renewal that arrives late (queued in a stopped backend,
  held in a stalled link) extends nothing, while the holder has already
  given the lease up at its own deadline. An acquisition whose reply is
  lost is undone by its owner id (every attempt has its own), and a
  release whose reply is lost is safe to retry (it finds its own row
  marked released). **The restart row** crashes the server mid-hold
  (SIGKILL to the postmaster and every backend, then crash recovery): a
  lease is a committed row, so it survives with its expiry by the
  database's clock, and its holder keeps it through the short outage or
  gives it up at its own deadline; the sequence does not go back either
  (PostgreSQL logs a sequence ahead of the values it hands out, so after
  recovery it resumes past every token issued: tokens jump, never
  repeat). Expect unavailability for the restart and no overlap. Behind
  **PgBouncer** in transaction pooling (the pgbouncer row) every operation
  is one statement in its own transaction with no session state (pglock
  runs its statements without pgx's statement cache, and it detects the
  pooler, whose backend process ID is not the server's, and does not
  LISTEN through it: a LISTEN would stay on a pooled server session, which
  PgBouncer 1.18 complained about on every NOTIFY and once exited on;
  waiters poll), so pooling changes nothing: a paused holder overlaps the
  next one the same way, and its write is refused the same way.
- **Read-write locks** (the redis-rw and etcd-rw rows): workers 0 and 2 are writers
  (an exclusive lock: read, think, write, as in every other row), workers
  1 and 3 readers (dlock.WithShared(): they read both registers at their
  lock's fence, a shared one, and write nothing). Readers may hold the
  key together, so a pair of readers is not an overlap; a writer inside
  with anyone else is. The client-pause row pauses writers only. The
  paused writer's lease expires, and the key goes to readers and to the
  other writer, with tokens above its own (every grant of a key, in any
  mode, takes the key's next token), so the writer comes back overlapping
  them. The guard refuses its late write once the other writer has
  written (an exclusive fence is recorded); a reader's shared fence is
  not recorded (readers must not fence each other out), so if only
  readers came in during the pause, the late write is admitted after
  their reads, which is still a linearizable history (the reads come
  before the write) but means a reader can overlap a writer that is
  not yet fenced out: fencing protects the data from the stale writer,
  not a reader from seeing a writer's work in progress. The fenced-history
  column checks the readers' reads under dlock's rule for shared fences.
- **Semaphores** (the redis-sem and etcd-sem rows): 4 workers each take one of 2 permits
  (dlock.WithLimit) and hold it for the think time; they touch neither
  register, because holders of a semaphore overlap by design and no token
  orders them (their fences are shared), so fencing does not apply
  (n/a). The overlaps column counts entries beyond the limit: a worker
  entering while the limit's number of holders were already inside, as
  the workers saw their sections. The baseline must show none. Under a
  client pause the paused holder's permit frees at its expiry (never
  later: a crashed holder does not leak it, as an owner-less counter
  would), a waiting worker takes it, and the paused holder comes back
  believing it still holds its permit: one more than the limit inside
  until it releases. A lock service cannot prevent that for a semaphore
  any more than for a lock, and a guard cannot refuse it; the run fails
  if a client-pause row never shows it (the check would be blind).
- **Sentinel failover** (the redis-sentinel rows: a primary, two
  replicas, three sentinels with down-after 1 s; workers on go-redis's
  default failover client; one failover per row, as the killed primary
  stays down; 20 s leases, 6 s sections). The primary is killed right
  after it granted the key. With the replicas in sync (failover) the
  promoted replica has the lease: its holder renews and releases it on
  the new primary, the others wait for it, and the failover costs only
  availability (about 2.5 s here). With the replication links stalled
  first (failover-lagging) the grant never reached a replica: the
  promoted one has no lease, another worker is granted the key while the
  holder is still in its section, and the holder learns of it only at its
  next renewal or, here, its release (ErrLockLost): a double grant, the
  overlap in that row (one, of about 3.7 s, in each of our runs). Without
  fencing the holder's late write is accepted (before the new holder's
  own, so it counts as a lost increment rather than a stale write); with
  fencing the guard refuses it,
  because the new holder's token is above the old one's (every grant's
  token is max(marker + 1, the server's time in µs), and the new
  primary's clock is the same host's). Had the links stalled while a lease
  was held and then released, the promoted replica would have that stale
  lease and keep everyone out until it expires (at most a TTL: lost
  availability, not a second holder: what the first tuning runs of this
  fault showed); the fault waits a TTL after the stall so that the row
  shows the double grant instead. Each row is one failover: it shows what
  can happen, not how often. **With replica
  acknowledgement** (redis-sentinel-acks: redislock.WithReplicaAcks(1,
  DefaultAckTimeout)) the in-sync row is unchanged, and in the lagging
  row, with one link of two stalled, a grant counts only once the other
  replica has it; Sentinel promotes the replica with the highest
  replication offset, which is that one, so the holder keeps its lease
  through the failover: no overlap, no stale write. The acknowledgement
  costs a WAIT round trip per acquisition and renewal (make bench's
  redis-ha group measures it), invisible next to these 6 s sections: the
  rows with and without acks acquire as often. What
  acknowledgement does not cover: WAIT reports that n replicas received
  the write, not that the one promoted is among them. If the
  acknowledging replica dies or restarts without persistence too, or the
  sentinels cannot reach it while they reach a lagging one, or a failover
  is forced to a lagging replica, the key can be granted twice as in the
  lagging row without acks; fencing orders the holders there as it does
  here, while the new primary's clock is not behind the old one's.
- **A holder killed mid-work** (file) leaves its lease to expire: the next
  holder waits up to one TTL; no overlap, no lost update.

Counts vary between runs (timing is not seeded); the ratios and which cells
are zero are what the matrix is for. A cell with a violation *with*
fencing fails the run unless it is a documented limit, and names its
reproduction: ` + "`make safety-repro CASE=backend/fault SEED=N`" + `.
`
