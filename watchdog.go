package dlock

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// watchdog keeps the locks of one Engine: it renews auto-refreshed
// leases, batching all locks due within a short window into one
// RefreshBatch call, and loses every lock whose local deadline passed.
//
// Timing never waits on I/O. A single timer fires at the earliest renewal
// or deadline of any lock; its pass (on the timer's own goroutine) first
// loses the locks whose deadline passed and re-arms the timer for the next
// event, and only then starts the renewal of the locks due, on the same
// goroutine. A renewal that hangs (a stalled link, a hung server, a client
// that ignores contexts) therefore holds up nothing: the timer fires again
// for the next deadline, a lock added meanwhile is scheduled at once, and a
// lock whose renewal is in flight is skipped by later passes until that
// renewal reports (its deadline still fires on time).
//
// The locks are kept in a min-heap by their next due time, so a pass
// touches only the locks that are due (a scan of every lock on every
// pass, with thousands of locks whose deadlines are spread out, is a pass
// per deadline times a scan of all of them: under the race detector the
// timer falls tens of ms behind).
//
// Losing a lock costs CPU (1-2us; 10-50us under -race), so a pass that
// must lose thousands at once starts early by that cost: the watchdog
// counts the tracked locks per deadline millisecond (a renewal batch gives
// its locks one deadline) and arms the timer early by the lead the stream
// of upcoming deadlines needs (streamLeadLocked). A pass loses locks in
// rounds of at most maxRoundLosses, so that no Lost() waits for a whole
// batch to be collected, keeps taking what comes due until nothing is
// (without arming the timer for it, which would start competing passes),
// and starts the cleanups only then. Leads are bounded by a quarter of the
// TTL (the lateness part by a tenth): a lock may count as lost that much
// before its deadline. Past that bound, or on a machine too starved to
// run the pass, fencing is what protects the resource.
//
// There is no goroutine and no timer per lock: acquiring a lock touches the
// timer only when the new lock is due before everything else, so a lock
// released before its first renewal usually costs no timer operation at
// all (on the 2-core benchmark machine each timer change woke a thread and
// cost ~10% of an uncontended acquire+release).
type watchdog struct {
	batch driver.BatchRenewer // nil: renew leases one by one
	src   *source             // the engine's name and Observer
	clk   clock               // the time source of every lock it keeps

	mu      sync.Mutex
	locks   map[*Lock]*wdEntry
	queue   wdHeap
	timer   clockTimer
	timerAt time.Time // when the timer fires; zero when not armed
	// timerLead is how early before its entry's due time the timer was
	// armed: the pass it starts uses at least that lead, so that a lead
	// that shrank meanwhile (lateness decays, the cost estimate moves)
	// cannot make the pass find nothing and re-arm in the past.
	timerLead time.Duration
	// timerUntil is the last deadline of the stream the timer was armed
	// for (see streamLeadLocked): the pass it starts loses, in order, every
	// lock due up to it.
	timerUntil time.Time
	// looping counts the passes in their losing loop (see collect).
	looping int
	// passes counts the passes run (for tests: a timer re-armed in the
	// past shows as a burst of passes).
	passes atomic.Int64
	// loseCost is the measured time to lose one lock (close its Lost()),
	// a moving average in ns. A pass that loses many locks at once loses
	// each one early by the work queued before it, so that the last one
	// is not late: a lock at position k closes at about now + k*loseCost.
	loseCost atomic.Int64
	// lateness is how late the timer fired recently (see noteLateness):
	// locks are lost, and the timer armed, early by that much.
	lateness atomic.Int64
	// sharing counts the tracked locks per deadline millisecond. A
	// renewal batch gives all its locks one deadline (start + TTL -
	// drift), so thousands of locks can come due in the same instant:
	// the pass that loses them must start early by the time losing them
	// all takes, not only by the timer's lateness (measured under -race:
	// 3289 locks sharing a deadline took 37ms to lose, the last 31ms late).
	sharing map[int64]share
	// maxTTL is the longest TTL of any lock counted in sharing so far (it
	// only grows): no lead is longer than maxTTL/maxLeadDiv, or than the
	// timer's lateness.
	maxTTL time.Duration
}

// share is one deadline millisecond's count of tracked locks, and the
// longest TTL counted there since the bucket appeared (it only grows: it
// bounds how early the timer may fire for the bucket; collect bounds each
// lock's own lead by its own TTL).
type share struct {
	n      int
	maxTTL time.Duration
}

// deadlineBucket is the sharing key of a deadline.
func deadlineBucket(d time.Time) int64 { return d.UnixNano() / int64(time.Millisecond) }

// shareLocked moves e's deadline count to d. w.mu held.
func (w *watchdog) shareLocked(e *wdEntry, d time.Time) {
	w.unshareLocked(e)
	e.deadline, e.bucket, e.counted = d, deadlineBucket(d), true
	sh := w.sharing[e.bucket]
	sh.n++
	sh.maxTTL = max(sh.maxTTL, e.l.cfg.TTL)
	w.sharing[e.bucket] = sh
	w.maxTTL = max(w.maxTTL, e.l.cfg.TTL)
}

// unshareLocked drops e's deadline count. w.mu held.
func (w *watchdog) unshareLocked(e *wdEntry) {
	if !e.counted {
		return
	}
	e.counted = false
	sh := w.sharing[e.bucket]
	if sh.n--; sh.n <= 0 {
		delete(w.sharing, e.bucket)
		return
	}
	w.sharing[e.bucket] = sh
}

// leadLocked is how early the lock of e counts as lost: the timer's recent
// lateness (at most a tenth of the TTL) plus the cost of losing the locks
// ahead of it (ahead, already taken in this round) and of the locks that
// share its deadline, at most maxLeadDiv-th of its TTL in all. w.mu held.
func (w *watchdog) leadLocked(e *wdEntry, late, cost time.Duration, ahead int) time.Duration {
	n := ahead + w.sharing[e.bucket].n
	return min(min(late, e.l.cfg.TTL/10)+cost*time.Duration(max(n, 1)), e.l.cfg.TTL/maxLeadDiv)
}

// streamLeadLocked is how early before e's due time (e is the heap's
// root, so no tracked deadline comes before it) the timer must fire so
// that losing the locks due from then on keeps up with their deadlines:
// losing at cost per lock, the i-th deadline closes at start + i*cost, so
// for each deadline millisecond b, start must lead b by cost times the
// locks due up to b (plus the timer's lateness, each bounded by the TTLs
// counted at b), less b's distance from e's due time. It is at least the
// timer's lateness for e itself. This holds whether e is due for renewal
// or at its deadline: a renewal due just before a batch's shared deadline
// must not make the timer forget the batch. The stream is read
// from the per-millisecond counts, as far as cost times the number of
// tracked locks reaches, and no further than maxLeadScan ms. until is
// the end of the millisecond that set the lead: the pass started for it
// loses, in order, every lock due by then (each within its own cap), so
// that a stream of many small deadline buckets is worked through from the
// start rather than each lock waiting for its own, shorter, lead. w.mu
// held.
func (w *watchdog) streamLeadLocked(e *wdEntry, late, cost time.Duration) (lead time.Duration, until time.Time) {
	from := e.due()
	steps := min(int64(cost*time.Duration(len(w.locks))/time.Millisecond)+1, maxLeadScan)
	// Fewer deadline milliseconds tracked than the window has (a renewal
	// batch gives all its locks one): read those in the window instead of
	// every millisecond of it.
	sparse := int64(len(w.sharing)) <= steps
	return w.streamScanLocked(from, min(late, e.l.cfg.TTL/10), late, cost, steps, sparse)
}

// streamScanLocked is streamLeadLocked's reading of the per-millisecond
// counts from from's millisecond for steps more, starting from lead:
// sparse reads the tracked milliseconds in the window, sorted, otherwise
// every millisecond of the window is looked up. Both give the same
// answer. w.mu held.
func (w *watchdog) streamScanLocked(from time.Time, lead, late, cost time.Duration, steps int64, sparse bool) (time.Duration, time.Time) {
	first := deadlineBucket(from)
	var until time.Time
	cum := 0
	at := func(b int64, sh share) {
		cum += sh.n
		need := min(min(late, sh.maxTTL/10)+cost*time.Duration(cum), sh.maxTTL/maxLeadDiv)
		end := time.Unix(0, (b+1)*int64(time.Millisecond))
		if l := need - end.Add(-time.Millisecond).Sub(from); l > lead {
			lead, until = l, end
		}
	}
	if sparse {
		var in []int64
		for b := range w.sharing {
			if b >= first && b <= first+steps {
				in = append(in, b)
			}
		}
		slices.Sort(in)
		for _, b := range in {
			at(b, w.sharing[b])
		}
		return lead, until
	}
	seen := 0
	for b := first; b <= first+steps && seen < len(w.sharing); b++ {
		if sh, ok := w.sharing[b]; ok {
			seen++
			at(b, sh)
		}
	}
	return lead, until
}

// maxLeadScan bounds the deadline milliseconds one streamLeadLocked reads
// (at 25us a lock, 1024ms covers 40000 locks due at once).
const maxLeadScan = 1024

// maxLeadDiv bounds how early a lock counts as lost: by at most a quarter
// of its TTL. The timer's lateness alone leads by at most a tenth; the
// rest is for the CPU time of losing many locks at once (measured: 6000
// to 15000 locks sharing one deadline under -race need more than a
// tenth of a 1s TTL).
const maxLeadDiv = 4

// defaultLoseCost is loseCost before the first measurement. It is on the
// high side (measured: 1-2us a lock in a normal build, 10-25us under
// -race) because the first measurement comes only from the first losses,
// and those may be thousands at once: a lead too long costs only locks
// whose renewals have been failing for most of their TTL anyway, a lead
// too short loses locks after their lease expired.
const defaultLoseCost = 25 * time.Microsecond

type wdEntry struct {
	l        *Lock
	renewAt  time.Time // zero: auto-refresh off
	deadline time.Time // the lock's local deadline (copy, under w.mu)
	bucket   int64     // deadlineBucket(deadline), counted in sharing
	idx      int       // position in the heap; -1 when not in it
	inflight bool      // a renewal of this lock is running
	counted  bool      // counted in sharing (while tracked)
}

// due is the next time a pass has something to do for the entry.
func (e *wdEntry) due() time.Time {
	if !e.inflight && !e.renewAt.IsZero() && e.renewAt.Before(e.deadline) {
		return e.renewAt
	}
	return e.deadline
}

// wdHeap orders entries by due time (container/heap).
type wdHeap []*wdEntry

func (h wdHeap) Len() int           { return len(h) }
func (h wdHeap) Less(i, j int) bool { return h[i].due().Before(h[j].due()) }
func (h wdHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *wdHeap) Push(x any) {
	e := x.(*wdEntry)
	e.idx = len(*h)
	*h = append(*h, e)
}
func (h *wdHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}

// fixLocked restores e's place in the heap after its due time changed,
// putting it back if a pass took it out. w.mu held.
func (w *watchdog) fixLocked(e *wdEntry) {
	if e.idx < 0 {
		heap.Push(&w.queue, e)
	} else {
		heap.Fix(&w.queue, e.idx)
	}
}

func newWatchdog(b driver.BatchRenewer, src *source) *watchdog {
	if src == nil {
		src = &source{}
	}
	return &watchdog{batch: b, src: src, clk: realClock{}, locks: map[*Lock]*wdEntry{}, sharing: map[int64]share{}}
}

// add tracks l. Called with l.mu held (lock order: l.mu, then w.mu).
func (w *watchdog) add(l *Lock, renewAt, deadline time.Time) {
	w.mu.Lock()
	e := &wdEntry{l: l, renewAt: renewAt, idx: -1}
	w.shareLocked(e, deadline)
	w.locks[l] = e
	heap.Push(&w.queue, e)
	w.armForLocked(e)
	w.mu.Unlock()
}

// remove stops tracking l. The timer is left armed: a pass with nothing
// to do costs less than stopping and re-arming the timer on every release.
func (w *watchdog) remove(l *Lock) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		delete(w.locks, l)
		w.unshareLocked(e)
		if e.idx >= 0 {
			heap.Remove(&w.queue, e.idx)
		}
	}
	w.mu.Unlock()
}

// setDeadline records a later deadline (after a renewal). Called with
// l.mu held. The timer needs no change: deadlines only move later.
func (w *watchdog) setDeadline(l *Lock, d time.Time) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		w.shareLocked(e, d)
		if e.idx >= 0 {
			heap.Fix(&w.queue, e.idx)
		}
	}
	w.mu.Unlock()
}

// rearm makes sure a pass runs by l's next due time (a pass that counted
// the lock as expired took it out of the heap).
func (w *watchdog) rearm(l *Lock) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		w.fixLocked(e)
		w.armForLocked(e)
	}
	w.mu.Unlock()
}

// renewDone ends l's renewal in flight and schedules the next one at at.
func (w *watchdog) renewDone(l *Lock, at time.Time) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		e.inflight = false
		e.renewAt = at
		w.fixLocked(e)
		w.armForLocked(e)
	}
	w.mu.Unlock()
}

// armForLocked makes sure a pass runs early enough for e: by its renewal
// time less the timer's lateness, or by its deadline less its lead (see
// leadLocked). w.mu held.
func (w *watchdog) armForLocked(e *wdEntry) { w.armLocked(e, false) }

// armLocked is armForLocked; with stuck (a pass that could do nothing
// for the stream lead: its root cannot be lost yet by its own lead, and
// nothing behind it could), a stream lead that would fire the timer at
// once gives way to e's own lead, so that the timer never fires again and
// again for nothing (otherwise: 28000 passes in 230ms). w.mu held.
func (w *watchdog) armLocked(e *wdEntry, stuck bool) {
	late := time.Duration(w.lateness.Load())
	due := e.due()
	cost := w.cost()
	// Nothing to do when even the longest lead the stream could need
	// (losing every tracked lock, after the lateness; and never more
	// than the lateness or a maxLeadDiv-th of the longest TTL) leaves the
	// timer earlier: most adds and re-arms after a renewal end here
	// without reading the stream, however many locks are tracked.
	// (Plus a millisecond: a stream's lead counts from the start of the
	// millisecond e is due in, not from e's due time.)
	longest := min(late+cost*time.Duration(len(w.locks)), max(late, w.maxTTL/maxLeadDiv)) + time.Millisecond
	if !w.timerAt.IsZero() && !due.Add(-longest).Before(w.timerAt) {
		return
	}
	lead, until := w.streamLeadLocked(e, late, cost)
	at := due.Add(-lead)
	if stuck && !at.After(w.clk.Now()) {
		lead, until = min(late, e.l.cfg.TTL/10), time.Time{}
		if due.Equal(e.deadline) {
			lead = w.leadLocked(e, late, cost, 0)
		}
		at = due.Add(-lead)
	}
	if !w.timerAt.IsZero() && !at.Before(w.timerAt) {
		return
	}
	if w.looping > 0 && !at.After(w.clk.Now()) {
		return // a pass is losing locks; its next round takes this one
	}
	d := clockUntil(w.clk, at)
	if w.timer == nil {
		w.timer = w.clk.AfterFunc(d, w.pass)
	} else {
		w.timer.Reset(d)
	}
	w.timerAt, w.timerLead, w.timerUntil = at, lead, until
}

// cost is the measured time to lose one lock.
func (w *watchdog) cost() time.Duration {
	c := time.Duration(w.loseCost.Load())
	if c <= 0 {
		c = defaultLoseCost
	}
	return c * costMargin
}

// costMargin is the factor by which leads overestimate the measured cost
// of losing a lock: the cost of the next mass loss is not the average of
// the last ones (under -race a pass lost 17us a lock, the next 23us, while
// the estimate said 13us, and a 12000-lock stream was lost 25ms late). A
// lead too long loses locks a little earlier, only when their renewals
// have failed for most of the TTL, and never by more than the cap.
const costMargin = 2

// held reports the number of locks under renewal (for tests and metrics).
func (w *watchdog) held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.locks {
		if !e.renewAt.IsZero() {
			n++
		}
	}
	return n
}

// pass runs on the timer's goroutine: it loses the locks past their
// deadline, re-arms the timer for the next event, then renews what is due.
func (w *watchdog) pass() {
	w.passes.Add(1)
	var due []*Lock
	// Keep losing what has come due while this goroutine runs: on a busy
	// machine each timer firing waits for the scheduler, and a pass per
	// deadline would fall behind a stream of deadlines (measured: 6000
	// locks on a stalled link, passes 3ms apart, falling 100ms behind).
	var fired passLead // the lead the timer was armed with
	var cleanups, lost []*Lock
	var unbinds []func()
	for round := 0; ; round++ {
		start := w.clk.Now()
		expired, at, more := w.collect(round == 0, round == maxPassRounds-1, &fired, &due)
		if len(due) > 0 && (more || round > 0) {
			// Renewals taken while a long losing loop runs start now,
			// not after it (100ms locks due during a 30000-lock loop
			// would be sent 50ms late and lost).
			batch := due
			due = nil
			background.Go(func() { w.renew(batch) })
		}
		cleanups, unbinds, lost = w.lose(expired, at, cleanups, unbinds, lost)
		w.noteCost(start, len(expired))
		if !more {
			break
		}
	}
	// The backends' loss notifiers are stopped, and the cleanups (server
	// releases) started, once every lock due has been lost: no backend
	// code runs inside the losing loop (while it runs, no other pass
	// starts for what comes due), and the cleanups do not compete with
	// the losing for the CPU.
	for _, stop := range unbinds {
		stop()
	}
	if (len(cleanups) > 0 || len(lost) > 0) && len(due) > 0 {
		// Renewals go out before the cleanups compete with them, and
		// before the Observer hears of the losses.
		batch := due
		due = nil
		background.Go(func() { w.renew(batch) })
	}
	cleanupAll(cleanups)
	// The Observer hears of the losses last: however long it takes, every
	// Lost() of the pass is closed, the timer armed for what comes next
	// (another pass can run meanwhile), and the renewals and cleanups sent.
	for _, l := range lost {
		l.reportLost()
	}
	if len(due) > 0 {
		w.renew(due)
	}
}

// passLead is the lead a pass's timer was armed with, and the last
// deadline of the stream it was armed for.
type passLead struct {
	lead  time.Duration
	until time.Time
}

// maxAside bounds the locks a round looks past (see collect).
const maxAside = 64

// maxPassRounds bounds the rounds of one pass; the timer covers the rest.
const maxPassRounds = 256

// maxRoundLosses bounds the locks one round loses. Every lock of a round
// waits for the whole round to be collected before its Lost() closes:
// when losing a lock costs more than the gap between deadlines (measured
// under -race on a stalled link: 20us per lock, 2627 deadlines 19us
// apart), an unbounded round kept growing and the first of its locks
// closed 10ms+ after its deadline.
const maxRoundLosses = 128

// collect takes out of the heap the locks to lose now and marks the
// locks due for renewal (appending them to due), re-arms the timer, and
// reports whether it lost anything (so that the pass looks again).
//
// A lock counts as lost early, at now + lead, when that covers its
// deadline: lead is the timer's recent lateness (a timer that fired late
// will be late again; a process paused outright is covered by fencing,
// not by this) plus the measured cost of losing the locks ahead of it in
// this round and the locks sharing its deadline (see leadLocked); and at
// least the lead the timer was armed with (fired, recorded by the first
// round), which covers the stream of deadlines behind the first; every
// lock due by the end of that stream (fired.until) is lost in order, each
// within its own cap; a lock at the root that its own cap keeps from
// being lost yet is set aside, so the stream behind it is not held up.
func (w *watchdog) collect(first, last bool, fired *passLead, due *[]*Lock) (expired []*Lock, at []time.Time, more bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.clk.Now()
	if first {
		w.looping++
		// A firing from before the timer's last re-arm (AfterFunc had
		// already started it) finds the timer armed for later: it leaves
		// that arming alone (it is still scheduled) and takes no lead
		// from it. Taking it would make such a pass find nothing to lose
		// yet and re-arm the timer later, by the root's own lead,
		// dropping the stream lead (a batch 0.2ms short of collectable
		// would then be lost 25ms late).
		if armed := w.timerAt; !armed.IsZero() && !now.Before(armed) {
			w.noteLateness(now.Sub(armed))
			*fired = passLead{w.timerLead, w.timerUntil}
			w.timerAt, w.timerLead, w.timerUntil = time.Time{}, 0, time.Time{}
		}
	}
	late := time.Duration(w.lateness.Load())
	cost := w.cost()
	var aside []*wdEntry
	renewing := len(*due)
	for w.queue.Len() > 0 {
		e := w.queue[0]
		// At least the lead the timer was armed with, plus the cost of
		// the locks taken ahead in this round: a pass armed early for a
		// stream of deadlines works through it in order from the start.
		cap := e.l.cfg.TTL / maxLeadDiv
		floor := min(fired.lead+cost*time.Duration(len(expired)+1), cap)
		lead := max(w.leadLocked(e, late, cost, len(expired)), floor)
		if len(expired) == maxRoundLosses {
			break // the next round takes the rest, with a fresh now
		}
		// Part of the stream the timer was armed for (due by its end), and
		// within this lock's own cap: lost now, in order.
		if !e.deadline.After(fired.until) && e.deadline.Sub(now) <= cap {
			lead = max(lead, e.deadline.Sub(now))
		}
		if t := now.Add(lead); !t.Before(e.deadline) {
			heap.Pop(&w.queue) // back in by rearm if a renewal moved it
			expired = append(expired, e.l)
			at = append(at, t)
			continue
		}
		// Coalesce: renew every lock due within 1/12 of its TTL now, so
		// locks taken at nearly the same time share a round trip (and
		// within the lead the timer was armed early by, so a timer armed
		// early always finds its lock due).
		window := max(e.l.cfg.TTL/12, min(late, e.l.cfg.TTL/10), floor)
		if !e.inflight && !e.renewAt.IsZero() && !e.renewAt.After(now.Add(window)) {
			e.inflight = true // its due time is now its deadline
			heap.Fix(&w.queue, 0)
			*due = append(*due, e.l)
			continue
		}
		// Not due by its own lead, but the timer was armed for a stream
		// of deadlines behind it that needs a longer lead than this
		// lock's TTL allows (a short lock in front of a batch of long
		// ones): set it aside and look further, so that the
		// batch is not lost late and the timer is not re-armed in the
		// past for a root that cannot be collected yet.
		if fired.lead > floor && len(aside) < maxAside {
			heap.Pop(&w.queue)
			aside = append(aside, e)
			continue
		}
		break
	}
	for _, e := range aside {
		heap.Push(&w.queue, e)
	}
	more = len(expired) > 0 && !last
	if !more {
		// The loop ends: arm for what is next. While it runs it takes
		// what comes due itself; arming the timer for a lock already due
		// would start a pass per round, and the passes would fight over
		// w.mu (measured with 6000 locks sharing a deadline under -race:
		// 128 losses took 20-80ms, and the cost estimate rose to 600us a
		// lock).
		w.looping--
		if w.queue.Len() > 0 {
			w.armLocked(w.queue[0], len(expired) == 0 && len(*due) == renewing)
		}
	}
	return expired, at, more
}

// noteLateness feeds how late the timer fired into the moving maximum:
// it jumps up at once and decays by an eighth per pass.
func (w *watchdog) noteLateness(d time.Duration) {
	d = max(d, 0)
	old := time.Duration(w.lateness.Load())
	if d < old {
		d = old - (old-d)/8
	}
	w.lateness.Store(int64(d))
}

// lose closes the Lost() of expired locks (each counting as lost at at[i])
// and appends those that need a cleanup to cleanups, their loss
// notifiers' stop functions to unbinds and those it lost to lost (their
// EventLost is reported after the losing loop): with thousands of locks
// due at once, no Lost() waits behind another lock's goroutine start or
// an Observer.
func (w *watchdog) lose(expired []*Lock, at []time.Time, cleanups []*Lock, unbinds []func(), lost []*Lock) ([]*Lock, []func(), []*Lock) {
	for i, l := range expired {
		cleanup, unbind, justLost := l.deadlinePassedUnbound(at[i])
		if cleanup {
			cleanups = append(cleanups, l)
		}
		if unbind != nil {
			unbinds = append(unbinds, unbind)
		}
		if justLost {
			lost = append(lost, l)
		}
	}
	return cleanups, unbinds, lost
}

// noteCost feeds the time a round took to collect and lose n locks
// (since start) into loseCost, a moving average per lock weighted by n: a
// round of one lock is mostly fixed overhead (and a preemption in it
// would count as the cost of every lock of the next batch), while the
// estimate matters for rounds of thousands.
func (w *watchdog) noteCost(start time.Time, n int) {
	if n < minCostSample {
		return
	}
	per := int64(clockSince(w.clk, start)) / int64(n)
	old := w.loseCost.Load()
	if old == 0 {
		old = int64(defaultLoseCost)
	}
	// A round that waited for the mutex or was preempted says little about
	// the next: one sample moves the estimate up by at most 4x (unclamped,
	// it can rise to 1.5ms a lock against a real 10us).
	per = min(per, 4*old)
	w.loseCost.Store(old + (per-old)*int64(min(n, 64))/256)
}

// minCostSample is the fewest losses a round needs to feed loseCost.
const minCostSample = 16

// cleanupWorkers bounds the goroutines releasing lost locks of one pass:
// thousands of locks lost at once (a hung server) must not become
// thousands of goroutines competing with the timers of the next deadlines.
const cleanupWorkers = 16

// cleanupAll releases lost locks on the server in the background.
func cleanupAll(locks []*Lock) {
	if len(locks) == 0 {
		return
	}
	n := min(len(locks), cleanupWorkers)
	var next atomic.Int64
	for range n {
		background.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(locks) {
					return
				}
				locks[i].cleanup()
			}
		})
	}
}

// renew refreshes due locks in one batch and applies each outcome as soon
// as the backend reports it. The call's context ends at the latest
// deadline among them: no answer after that can save any of them.
func (w *watchdog) renew(due []*Lock) {
	start := w.clk.Now()
	rs := make([]driver.Renewal, 0, len(due))
	locks := make([]*Lock, 0, len(due))
	var last time.Time
	for _, l := range due {
		ttl, ok := l.renewTTL(start)
		if !ok {
			l.lose(LossHoldCap, ErrHoldCapReached, true)
			continue
		}
		rs = append(rs, driver.Renewal{Lease: l.lease, TTL: ttl})
		locks = append(locks, l)
		if d := l.Deadline(); d.After(last) {
			last = d
		}
	}
	if len(rs) == 0 {
		return
	}
	// Give the call at least a few ms so a near-due lock still gets a try.
	if min := start.Add(5 * time.Millisecond); last.Before(min) {
		last = min
	}
	// A duration on the engine's clock: the wall clock's reading of
	// last is not comparable with a test's clock.
	ctx, cancel := context.WithTimeout(context.Background(), clockUntil(w.clk, last))
	defer cancel()
	reported := make([]atomic.Bool, len(rs))
	done := func(i int, err error) {
		if i < 0 || i >= len(rs) || reported[i].Swap(true) {
			return // out of range or reported twice: ignore
		}
		w.apply(locks[i], start, rs[i].TTL, err)
	}
	switch {
	case w.batch != nil:
		w.batch.RefreshBatch(ctx, rs, done)
	case len(rs) == 1:
		done(0, rs[0].Lease.Refresh(ctx, rs[0].TTL))
	default:
		// One at a time would let a slow lease hold up the others.
		var wg sync.WaitGroup
		for i, r := range rs {
			wg.Go(func() { done(i, r.Lease.Refresh(ctx, r.TTL)) })
		}
		wg.Wait()
	}
	for i := range rs {
		done(i, errNoRenewalResult) // no-op for the reported ones
	}
}

var errNoRenewalResult = errors.New("dlock: the backend reported no result for this renewal")

// apply records the outcome of l's renewal sent at start.
func (w *watchdog) apply(l *Lock, start time.Time, ttl time.Duration, err error) {
	switch {
	case err == nil:
		w.src.renew(l, ResultOK, nil)
		if l.renewed(start, ttl) {
			w.renewDone(l, start.Add(ttl/3))
		}
	case errors.Is(err, ErrNotHeld):
		w.src.renew(l, ResultRefused, err)
		// A refusal that arrives after the local deadline passed is the
		// server ending a lease the holder had already given up (a
		// starved watchdog had not said so yet): a loss at the deadline.
		if now := w.clk.Now(); !now.Before(l.Deadline()) {
			if l.deadlinePassed(now) {
				background.Go(l.cleanup)
			}
			return
		}
		l.lose(LossNotHeld, err, false)
	default:
		w.src.renew(l, ResultError, err)
		// Transient: try again soon; the local deadline decides loss.
		w.renewDone(l, w.clk.Now().Add(max(l.cfg.TTL/10, 10*time.Millisecond)))
	}
}
