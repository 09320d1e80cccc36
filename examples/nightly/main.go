// Command nightly is a case study of dlock: a scheduled job ("nightly
// report") on a fleet of replicas whose cron all fire at the same minute,
// give or take their clock skew. The job must run once per period, on one
// replica; a replica that finds it running skips it. Schedule (schedule.go)
// implements ShedLock's at-most-for / at-least-for over a redislock Locker:
//
//   - periods: 4 periods × 5 replicas, the odd periods' job longer than
//     the lock's TTL (renewed through it): exactly one run per period;
//   - at least for: a fast job keeps the lock until start+AtLeastFor, so
//     a replica firing after the job ended skips it; without AtLeastFor it
//     runs the job a second time (the negative control);
//   - at most for: a runner killed mid-job (a real process, SIGKILL)
//     frees the lock within its TTL, and a hung runner loses it at
//     start+AtMostFor (its job's context is cancelled).
//
// Usage:
//
//	go run ./nightly [-redis host:port]
//
// With no flag it starts a redis-server itself (`make deps` installs it).
// It exits 1 if an outcome is not the expected one.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/examples/internal/harness"
	"github.com/dlock-go/dlock/redislock"
)

const (
	replicas = 5
	periods  = 4
	// period is the cron interval, compressed from a day to seconds.
	period = 3 * time.Second
	// skew: replica r's cron fires r×skew after replica 0's.
	skew = 80 * time.Millisecond

	lockTTL    = time.Second
	atLeastFor = time.Second // ≤ lockTTL: see Schedule
	atMostFor  = 2800 * time.Millisecond
	fastJob    = 20 * time.Millisecond
	longJob    = 2200 * time.Millisecond // > lockTTL, < atMostFor
)

// children are the roles this binary runs in when re-executed.
var children = map[string]func([]byte) error{"runner": crashingRunner}

func main() {
	harness.RunChild(children)
	redisAddr := flag.String("redis", "", "Redis `host:port` (default: start a redis-server)")
	flag.Parse()
	harness.Main("nightly", func(ctx context.Context, p *harness.Program) error {
		e := env{Redis: harness.Redis(p, *redisAddr), Job: "nightly/" + newRunID()}
		say := func(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) }
		fmt.Printf("nightly: %d replicas, one redislock lock per job (TTL %v), atLeastFor %v, atMostFor %v\n", replicas, lockTTL, atLeastFor, atMostFor)
		var fails []string
		check := func(what string, v verdict) {
			line := "invariant: " + what + ": holds"
			switch {
			case len(v.problems) > 0:
				line = "invariant: " + what + ": VIOLATED: " + strings.Join(v.problems, "; ")
				fails = append(fails, v.problems...)
			case len(v.notShown) > 0:
				line = "invariant: " + what + ": not shown, this machine was too slow: " + strings.Join(v.notShown, "; ")
			}
			fmt.Println("  " + line)
		}

		fmt.Printf("[%d periods × %d replicas, cron skew up to %v]\n", periods, replicas, (replicas-1)*skew)
		ps, err := runPeriods(ctx, e, periods, say)
		if err != nil {
			return err
		}
		check("exactly one run per period, long jobs renewed past the TTL", ps.verdict())

		fmt.Println("[at least for: a fast job, then a replica whose cron fires after it ended]")
		al, err := atLeast(ctx, e, atLeastFor, say)
		if err != nil {
			return err
		}
		check(fmt.Sprintf("the period stays blocked for atLeastFor (%v)", atLeastFor), al.verdict(atLeastFor))
		fmt.Println("[the same without atLeastFor]")
		al0, err := atLeast(ctx, e, 0, say)
		if err != nil {
			return err
		}
		if al0.late.Ran {
			fmt.Println("  invariant: one run per period: VIOLATED: the late replica ran the job again (expected: the negative control)")
		} else {
			fmt.Println("  invariant: one run per period: held without atLeastFor (the negative control showed nothing)")
			fails = append(fails, "the negative control: the late replica did not run the job again")
		}

		fmt.Println("[at most for: a runner process killed (SIGKILL) in its job]")
		cr, err := crash(ctx, e, say)
		if err != nil {
			return err
		}
		check(fmt.Sprintf("a crashed runner's lock is free within atMostFor (%v)", atMostFor), cr.verdict())

		fmt.Println("[at most for: a runner whose job hangs]")
		hg, err := hang(ctx, e, say)
		if err != nil {
			return err
		}
		check(fmt.Sprintf("a hung runner's lock is free at atMostFor (%v), its job cancelled", atMostFor), hg.verdict())

		if len(fails) > 0 {
			return errors.New("FAIL: an outcome was not the expected one")
		}
		fmt.Println("nightly: ok")
		return nil
	})
}

func newRunID() string { return fmt.Sprintf("%06x", rand.Uint32()&0xffffff) }

// env is the Redis server and the lock key of this run's job.
type env struct{ Redis, Job string }

// replica is one replica's Schedule on a client of its own (default
// go-redis options).
func (e env) replica(name string, atLeast time.Duration) (Schedule, func()) {
	rdb := redis.NewClient(&redis.Options{Addr: e.Redis})
	return Schedule{
		Locker: redislock.New(rdb), Name: e.Job, Replica: name,
		TTL: lockTTL, AtLeastFor: atLeast, AtMostFor: atMostFor,
	}, func() { rdb.Close() }
}

func replicaName(r int) string { return fmt.Sprintf("replica-%d", r) }

// --- periods ---------------------------------------------------------------

// periodsResult is every firing of every replica, by period.
type periodsResult struct {
	runs [][]Run // [period][replica]
}

// verdict is an outcome's judgement: problems are violations; notShown
// are the cases this run could not make because the machine was too slow
// (a replica whose cron fired, or whose request was granted, only after
// the run it should have found had ended). Neither passes for the other.
type verdict struct {
	problems []string
	notShown []string
}

// spill is how long into period p (its first firing) the previous
// period's run still held the lock; zero if it did not.
func (ps periodsResult) spill(p int) time.Duration {
	if p == 0 || len(ps.runs[p]) == 0 {
		return 0
	}
	first := ps.runs[p][0].Start
	for _, r := range ps.runs[p] {
		if r.Start.Before(first) {
			first = r.Start
		}
	}
	for _, r := range ps.runs[p-1] {
		if r.Ran && r.Freed.After(first) {
			return r.Freed.Sub(first)
		}
	}
	return 0
}

// holding is a part of the time a run held its lock, for certain: from
// the reply that granted it until its release began (the job's end, or
// start+atLeastFor if later).
func holding(r Run) (from, to time.Time) {
	to = r.JobEnd
	if t := r.Start.Add(atLeastFor); t.After(to) {
		to = t
	}
	return r.Acquired, to
}

func (ps periodsResult) verdict() verdict {
	var v verdict
	for p, runs := range ps.runs {
		var ran []int
		for r, run := range runs {
			if !run.Ran {
				continue
			}
			ran = append(ran, r)
			if run.JobErr != nil || run.LockErr != nil {
				v.problems = append(v.problems, fmt.Sprintf("period %d: %s: job error %v, lock error %v", p+1, replicaName(r), run.JobErr, run.LockErr))
			}
			if p%2 == 1 && run.JobEnd.Sub(run.Start) <= lockTTL {
				v.problems = append(v.problems, fmt.Sprintf("period %d: the long job took %v, not more than the TTL", p+1, run.JobEnd.Sub(run.Start)))
			}
		}
		if len(ran) == 0 {
			if spill := ps.spill(p); spill > 0 {
				v.notShown = append(v.notShown, fmt.Sprintf("period %d: the previous period's run still held the lock %v into it", p+1, ms(spill)))
			} else {
				v.problems = append(v.problems, fmt.Sprintf("period %d: no replica ran the job", p+1))
			}
		}
		for i, a := range ran {
			for _, b := range ran[i+1:] {
				af, at := holding(runs[a])
				bf, bt := holding(runs[b])
				if af.Before(bt) && bf.Before(at) {
					v.problems = append(v.problems, fmt.Sprintf("period %d: %s and %s held the lock at once", p+1, replicaName(a), replicaName(b)))
					continue
				}
				first, late := a, b
				if bf.Before(af) {
					first, late = b, a
				}
				v.notShown = append(v.notShown, fmt.Sprintf("period %d: %s fired at +%v and was granted the lock at +%v, after %s's run had ended: too late to find it held",
					p+1, replicaName(late), ms(runs[late].Start.Sub(runs[first].Start)), ms(runs[late].Acquired.Sub(runs[first].Start)), replicaName(first)))
			}
		}
	}
	return v
}

// runPeriods fires every replica in every period, replica r at the
// period's start + r×skew; odd periods' job is longer than the lock's TTL.
func runPeriods(ctx context.Context, e env, n int, say func(string, ...any)) (periodsResult, error) {
	scheds := make([]Schedule, replicas)
	for r := range scheds {
		s, closeFn := e.replica(replicaName(r), atLeastFor)
		defer closeFn()
		scheds[r] = s
	}
	res := periodsResult{runs: make([][]Run, n)}
	t0 := time.Now()
	for p := range n {
		tick := t0.Add(time.Duration(p) * period)
		if err := sleepUntil(ctx, tick); err != nil {
			return res, err
		}
		d, kind := fastJob, "fast job"
		if p%2 == 1 {
			d, kind = longJob, "long job"
		}
		runs := make([]Run, replicas)
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		for r := range replicas {
			wg.Go(func() {
				if errs[r] = sleepUntil(ctx, tick.Add(time.Duration(r)*skew)); errs[r] != nil {
					return
				}
				runs[r], errs[r] = scheds[r].Fire(ctx, func(ctx context.Context) error { return work(ctx, d) })
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		res.runs[p] = runs
		say("period %d (%s, %v): %s", p+1, kind, d, describe(runs))
	}
	return res, nil
}

// describe says who ran and who skipped in one period.
func describe(runs []Run) string {
	var ran, skipped []string
	holders := map[string]bool{}
	for r, run := range runs {
		if run.Ran {
			ran = append(ran, fmt.Sprintf("%s ran (lock held %v)", replicaName(r), run.Freed.Sub(run.Start).Round(10*time.Millisecond)))
		} else {
			skipped = append(skipped, fmt.Sprint(r))
			holders[run.Holder] = true
		}
	}
	var hs []string
	for h := range holders {
		hs = append(hs, h)
	}
	sort.Strings(hs)
	s := strings.Join(ran, ", ")
	if len(skipped) > 0 {
		s += fmt.Sprintf("; replicas %s skipped (held by %s)", strings.Join(skipped, ","), strings.Join(hs, ","))
	}
	return s
}

// work is a job: it takes d, or stops when ctx ends.
func work(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func sleepUntil(ctx context.Context, t time.Time) error {
	return work(ctx, time.Until(t))
}

// probe tries the job's lock every 20ms until it gets it (and releases
// it at once), and returns when it got it.
func probe(ctx context.Context, l dlock.Locker, key string) (time.Time, error) {
	for {
		lk, err := l.TryAcquire(ctx, key, dlock.WithTTL(lockTTL))
		if err == nil {
			got := time.Now()
			return got, lk.Release(ctx)
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			return time.Time{}, err
		}
		if err := work(ctx, 20*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}

// --- at least for ------------------------------------------------------------

type atLeastResult struct {
	first, late Run
	free        time.Time // when a prober first got the lock
}

func (a atLeastResult) verdict(atLeast time.Duration) verdict {
	var v verdict
	if !a.first.Ran {
		v.problems = append(v.problems, "the first replica did not run the job")
	}
	if a.first.LockErr != nil {
		v.problems = append(v.problems, fmt.Sprintf("the first replica's lock error: %v", a.first.LockErr))
	}
	end := a.first.Start.Add(atLeast)
	switch {
	case !a.late.Ran:
	case a.late.Acquired.Before(end):
		// Granted before the first run's release began: both held it.
		v.problems = append(v.problems, fmt.Sprintf("the late replica was granted the lock at +%v, within atLeastFor", ms(a.late.Acquired.Sub(a.first.Start))))
	default:
		v.notShown = append(v.notShown, fmt.Sprintf("the late replica fired at +%v and was granted the lock at +%v, after atLeastFor: too late to find it held",
			ms(a.late.Start.Sub(a.first.Start)), ms(a.late.Acquired.Sub(a.first.Start))))
	}
	if a.free.Before(end) {
		v.problems = append(v.problems, fmt.Sprintf("the lock was free %v after the run started, before atLeastFor", a.free.Sub(a.first.Start)))
	}
	return v
}

// atLeast: replica 0 runs a fast job; replica 4, whose clock is late,
// fires once that job has ended (and, without atLeastFor, once replica 0
// is done); a prober finds when the lock is free again.
func atLeast(ctx context.Context, e env, atLeast time.Duration, say func(string, ...any)) (atLeastResult, error) {
	e.Job += fmt.Sprintf("/at-least-%v", atLeast)
	first, close0 := e.replica(replicaName(0), atLeast)
	defer close0()
	late, close4 := e.replica(replicaName(4), atLeast)
	defer close4()
	var a atLeastResult
	jobDone := make(chan struct{})
	firstDone := make(chan struct{})
	var firstErr error
	go func() {
		defer close(firstDone)
		a.first, firstErr = first.Fire(ctx, func(ctx context.Context) error {
			defer close(jobDone)
			return work(ctx, fastJob)
		})
	}()
	select {
	case <-jobDone:
	case <-firstDone:
		select {
		case <-jobDone:
		default:
			return a, fmt.Errorf("replica-0 did not run the job (error %v)", firstErr)
		}
	}
	if atLeast == 0 {
		<-firstDone // replica-0 released the lock
	}
	if err := work(ctx, 100*time.Millisecond); err != nil {
		return a, err
	}
	var err error
	if a.late, err = late.Fire(ctx, func(ctx context.Context) error { return work(ctx, fastJob) }); err != nil {
		return a, err
	}
	if a.free, err = probe(ctx, late.Locker, e.Job); err != nil {
		return a, err
	}
	<-firstDone
	if firstErr != nil {
		return a, firstErr
	}
	outcome := "skipped it (held by " + a.late.Holder + ")"
	if a.late.Ran {
		outcome = "RAN IT AGAIN"
	}
	say("replica-0 ran a %v job, done at +%v; replica-4 fired at +%v and %s; the lock was free again at +%v",
		fastJob, ms(a.first.JobEnd.Sub(a.first.Start)), ms(a.late.Start.Sub(a.first.Start)), outcome, ms(a.free.Sub(a.first.Start)))
	return a, nil
}

func ms(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }

// --- at most for: a crash ----------------------------------------------------

// crashingRunner is a replica in its own process whose job never ends:
// the parent kills it in the middle.
func crashingRunner(raw []byte) error {
	var e env
	if err := json.Unmarshal(raw, &e); err != nil {
		return err
	}
	s, closeFn := e.replica("runner-process", atLeastFor)
	defer closeFn()
	ctx := context.Background()
	r, err := s.Fire(ctx, func(ctx context.Context) error {
		harness.Say("running")
		return work(ctx, time.Minute)
	})
	if err != nil {
		return err
	}
	return fmt.Errorf("the job ended (ran %v, job error %v, lock error %v) instead of being killed", r.Ran, r.JobErr, r.LockErr)
}

type crashResult struct {
	running, killed, free time.Time
	stalled               time.Duration // this process, not running, in between
}

// probeSlack is how late a prober may see a lock free: one probe step
// (20ms) and a round trip of that, on a loaded host. The time this process
// was stalled (dlocktest.StallMeter) comes on top: a prober that did not
// run cannot see anything.
const probeSlack = 250 * time.Millisecond

func (c crashResult) verdict() verdict {
	// The runner's lock began before it said "running"; it cannot outlive
	// start+atMostFor.
	if late := c.free.Sub(c.running) - c.stalled; late > atMostFor+probeSlack {
		return verdict{problems: []string{fmt.Sprintf("the lock was free only %v after the runner started its job (%v stalled)", late, c.stalled)}}
	}
	return verdict{}
}

func crash(ctx context.Context, e env, say func(string, ...any)) (crashResult, error) {
	e.Job += "/crash"
	var c crashResult
	child, err := harness.StartChild("runner", e)
	if err != nil {
		return c, err
	}
	defer child.Close()
	if _, err := child.Expect(ctx, "running"); err != nil {
		return c, err
	}
	c.running = time.Now()
	// Only a stall after the bound can delay seeing the lock free past it.
	m := dlocktest.StartStallMeter(c.running.Add(atMostFor))
	defer m.Stop()
	if err := work(ctx, 300*time.Millisecond); err != nil {
		return c, err
	}
	if err := child.Kill(); err != nil {
		return c, err
	}
	c.killed = time.Now()
	_ = child.Wait(ctx)
	prober, closeFn := e.replica(replicaName(1), atLeastFor)
	defer closeFn()
	if c.free, err = probe(ctx, prober.Locker, e.Job); err != nil {
		return c, err
	}
	c.stalled = m.StopAt(c.free)
	say("runner (pid %d) started its job, killed at +%v; the lock was free again at +%v (its lease, TTL %v, was no longer renewed)",
		child.Pid(), ms(c.killed.Sub(c.running)), ms(c.free.Sub(c.running)), lockTTL)
	return c, nil
}

// --- at most for: a hung job -------------------------------------------------

type hangResult struct {
	run       Run
	cause     error     // why the job's context ended
	cancelled time.Time // when
	free      time.Time
	stalled   time.Duration // this process, not running, while it probed
}

func (h hangResult) verdict() verdict {
	var out []string
	if !errors.Is(h.cause, dlock.ErrHoldCapReached) {
		out = append(out, fmt.Sprintf("the hung job's context ended with %v, not the hold cap", h.cause))
	}
	if !errors.Is(h.run.LockErr, dlock.ErrHoldCapReached) {
		out = append(out, fmt.Sprintf("the run's lock error is %v, not the hold cap", h.run.LockErr))
	}
	if held := h.free.Sub(h.run.Start); held <= lockTTL {
		out = append(out, fmt.Sprintf("the lock was free after %v, within its TTL: not renewed", held))
	}
	// The hold cap counts from the attempt's start, after Start.
	if held := h.free.Sub(h.run.Start) - h.stalled; held > atMostFor+probeSlack {
		out = append(out, fmt.Sprintf("the lock was free only %v after the run started (%v stalled after atMostFor)", held, h.stalled))
	}
	return verdict{problems: out}
}

// hang: replica 0's job blocks until its context is cancelled, and then
// some more (it ignores the cancellation until released), while replica
// 1 probes the lock.
func hang(ctx context.Context, e env, say func(string, ...any)) (hangResult, error) {
	e.Job += "/hang"
	s, close0 := e.replica(replicaName(0), atLeastFor)
	defer close0()
	prober, close1 := e.replica(replicaName(1), atLeastFor)
	defer close1()
	var h hangResult
	started := make(chan struct{})
	unblock := make(chan struct{})
	done := make(chan error, 1)
	fired := time.Now()
	go func() {
		var err error
		h.run, err = s.Fire(ctx, func(jctx context.Context) error {
			close(started)
			<-jctx.Done()
			h.cancelled, h.cause = time.Now(), context.Cause(jctx)
			<-unblock
			return h.cause
		})
		done <- err
	}()
	<-started
	// Only a stall after the bound (from before the run's Start) can
	// delay seeing the lock free past it.
	m := dlocktest.StartStallMeter(fired.Add(atMostFor))
	var err error
	h.free, err = probe(ctx, prober.Locker, e.Job)
	h.stalled = m.StopAt(h.free)
	close(unblock)
	if derr := <-done; err == nil {
		err = derr
	}
	if err != nil {
		return h, err
	}
	why := "hold cap reached"
	if !errors.Is(h.cause, dlock.ErrHoldCapReached) {
		why = fmt.Sprint(h.cause)
	}
	say("replica-0's job hung; its lock was renewed past its TTL, then its job's context was cancelled at +%v (%s), the lock free again at +%v",
		ms(h.cancelled.Sub(h.run.Start)), why, ms(h.free.Sub(h.run.Start)))
	return h, nil
}
