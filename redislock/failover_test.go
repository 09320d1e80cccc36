package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Failover tests: a Sentinel group (testserver.StartSentinel) fails over
// while a lock is held. Their assertions are orderings, never clock
// thresholds: a failover takes as long as it takes on a loaded machine,
// and what matters is who holds the key when. The group fails over when
// the test says so, after its fault (see failover_judge_test.go).

// TestFailoverWhileHeldKill: the primary is killed while a lock is held
// (auto-refresh on, replicas in sync, no acks), the sentinels promote a
// replica, and a contender on its own client tries the key for up to
// 3×TTL. The promise, as an ordering: whenever the contender is granted,
// the holder's Lost() is already closed; otherwise the holder still holds
// (its renewals reach the new primary, which has the key) and the
// contender was refused. Two leases: "short" (2s), which the failover
// usually outlasts, so the holder's local deadline passes first and the
// contender is granted after it; "long" (6s), which usually outlasts the
// failover, so the holder's renewals reach the new primary and the
// contender is refused. Which branch a run takes depends on the machine's
// timing; each is checked when taken.
//
// Long (make test-long): a failover matrix (two faults × two leases, each
// case a deployment of its own waiting out leases); the failover promise
// is kept in make test by the lagging-replica, split-brain, waiter and
// release tests below.
func TestFailoverWhileHeldKill(t *testing.T) {
	testserver.Long(t, "a failover matrix: two leases, a deployment each")
	t.Parallel()
	testFailoverWhileHeld(t, faultKill)
}

// TestFailoverWhileHeldPause is TestFailoverWhileHeldKill with the
// primary stopped (SIGSTOP) instead of killed: connections to it stay
// open and requests on them hang; it is continued at the end of the test
// (and the sentinels then make it a replica of the new primary). Long, as
// TestFailoverWhileHeldKill.
func TestFailoverWhileHeldPause(t *testing.T) {
	testserver.Long(t, "a failover matrix: two leases, a deployment each")
	t.Parallel()
	testFailoverWhileHeld(t, faultPause)
}

func testFailoverWhileHeld(t *testing.T, fault failoverFault) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{{"short", 2 * time.Second}, {"long", 6 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			failoverWhileHeld(t, fault, tc.ttl)
		})
	}
}

func failoverWhileHeld(t *testing.T, fault failoverFault, ttl time.Duration) {
	h := newFailoverHold(t, failoverSetup{})
	lk := h.hold(t, dlock.WithTTL(ttl))
	h.failover(t, fault, false)
	j := h.judge(t, ordered, 3*ttl, ttl, dlock.WithTTL(ttl))
	if !j.Kept {
		return
	}
	// The key stayed with the holder, on the new primary, and the
	// contender reached it and was refused (for longer than a TTL, so the
	// holder renewed it there, or until 3×TTL).
	if err := lk.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("the holder kept its lease through the failover, yet a refresh on the new primary fails: %v", err)
	}
}

// TestFailoverLaggingReplicaDoubleGrant is the negative control: it shows
// the hole replica acknowledgement (WithReplicaAcks) closes. The only
// replica's replication link is stalled, so it misses the lock write; the
// holder acquires without acks (the primary answers before any replica has
// the write), the primary dies, and the sentinels promote the replica that
// never had the key. A contender is then granted the key while the holder
// still, rightly by its own clock, believes it holds it: a double grant
// the holder learns of at its next renewal, or, if that comes first,
// when its Locker's pub/sub connection comes back on the new primary and
// reads its keys there. Fencing tokens still
// order the two holders (the contender's is above the holder's: the new
// primary issues max(marker + 1, its time in µs), and its clock is the
// same host's), so a guard refuses the old holder's late writes.
func TestFailoverLaggingReplicaDoubleGrant(t *testing.T) {
	t.Parallel()
	h := newFailoverHold(t, failoverSetup{Sentinel: []testserver.SentinelOption{testserver.WithReplicas(1), testserver.WithReplicationProxies()}})
	restore := h.S.KeepReplicationLinks()
	h.S.ReplicationLinks[0].Stall()
	// A long lease without renewals: Lost() closes only at its local
	// deadline, long after the test; any grant to the contender while the
	// holder's lease lasts is a double grant.
	lk := h.hold(t, dlock.WithTTL(time.Minute), dlock.WithAutoRefresh(false))
	h.Old.Stop()
	restore()
	p := forceFailover(t, h.S, h.S.Sentinels[0], h.Old)
	if v, err := p.Do("EXISTS", h.Holder.LockKey(h.Key)); err != nil || v != "0" {
		t.Fatalf("the promoted replica has the lock key (EXISTS = %q, %v): the link was not stalled", v, err)
	}
	h.judge(t, doubleGrant, 30*time.Second, 0)
	// The holder finds out at its next renewal (here, its own refresh).
	if err := lk.Refresh(dlocktest.Context(t)); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("the holder's refresh after the double grant: %v, want ErrLockLost", err)
	}
}

// TestFailoverLaggingReplicaAcksRefused is the negative control's
// schedule with replica acknowledgement on (WithReplicaAcks(1, ...)): the
// only replica's link is stalled, so no replica acknowledges the grant in
// time; the grant is rolled back on the primary and the attempt fails
// with a *ReplicationError (ErrNotReplicated), leaving no lease. After
// the failover to that replica the contender is granted the key, and
// nobody else believes it holds it.
func TestFailoverLaggingReplicaAcksRefused(t *testing.T) {
	t.Parallel()
	h := newFailoverHold(t, failoverSetup{
		Sentinel: []testserver.SentinelOption{testserver.WithReplicas(1), testserver.WithReplicationProxies()},
		Holder:   []redislock.Option{redislock.WithReplicaAcks(1, 300*time.Millisecond)},
	})
	restore := h.S.KeepReplicationLinks()
	h.S.ReplicationLinks[0].Stall()
	lk, err := h.Holder.TryAcquire(dlocktest.Context(t), h.Key, dlock.WithTTL(time.Minute), dlock.WithAutoRefresh(false))
	var re *redislock.ReplicationError
	if err == nil || !errors.Is(err, redislock.ErrNotReplicated) || !errors.As(err, &re) {
		if lk != nil {
			lk.Release(context.Background())
		}
		t.Fatalf("TryAcquire with the only replica's link stalled: %v, want a *ReplicationError", err)
	}
	if lk != nil || re.Op != "acquire" || re.Want != 1 || re.Got != 0 || !re.RolledBack {
		t.Fatalf("TryAcquire: lock %v, error %+v: want no lock, 0 of 1 acknowledgements, rolled back", lk, re)
	}
	// No lease on the primary: the key is gone or a release marker.
	if v, err := h.Old.Do("GET", h.Holder.LockKey(h.Key)); err != nil || (v != "" && !strings.HasPrefix(v, "|")) {
		t.Fatalf("the primary holds %q (%v) after the rolled-back attempt, want no lease", v, err)
	}
	h.Old.Stop()
	restore()
	forceFailover(t, h.S, h.S.Sentinels[0], h.Old)
	h.judge(t, granted, 30*time.Second, 0)
}

// TestFailoverAckedReplicaPromoted is the schedule in which replica
// acknowledgement keeps the lock exclusive through a failover: two
// replicas, one of them lagging (its link stalled); the holder acquires
// with WithReplicaAcks(1, ...), so the grant counts only once the other
// replica has it; the primary dies. Sentinel promotes, among the replicas
// it can reach and deems eligible, the one with the highest replication
// offset: the one that acknowledged, which has the lease. The contender is
// refused, and the new primary holds the holder's lease.
//
// Acknowledgement does not cover every schedule (replication stays
// asynchronous; WAIT only reports that n replicas received the write):
//   - the acknowledging replica dies too, or restarts without persistence,
//     before or during the failover, and the lagging one is promoted;
//   - the sentinels cannot reach the acknowledging replica (a partition,
//     a pause) but reach the lagging one, or deem it ineligible (its link
//     down too long, replica-priority 0), and promote the lagging one;
//   - fewer replicas acknowledge than could be promoted without the write
//     (n = 1 of 2 here only works because Sentinel prefers the highest
//     offset; with several lagging replicas and a manual or forced
//     failover, any of them may be chosen).
//
// In those the key can be granted twice, as in
// TestFailoverLaggingReplicaDoubleGrant; fencing tokens (max(marker + 1,
// server µs)) still order the holders while the new primary's clock is
// not behind the old one's.
func TestFailoverAckedReplicaPromoted(t *testing.T) {
	t.Parallel()
	h := newFailoverHold(t, failoverSetup{
		Sentinel: []testserver.SentinelOption{testserver.WithReplicas(2), testserver.WithReplicationProxies()},
		Holder:   []redislock.Option{redislock.WithReplicaAcks(1, redislock.DefaultAckTimeout)},
	})
	restore := h.S.KeepReplicationLinks()
	h.S.ReplicationLinks[0].Stall()
	lagging, acked := h.S.Servers[1], h.S.Servers[2]
	// A long lease without renewals, as in the negative control: any
	// grant to the contender during the test is a double grant.
	lk := h.hold(t, dlock.WithTTL(time.Minute), dlock.WithAutoRefresh(false))
	if v, err := acked.Do("EXISTS", h.Holder.LockKey(h.Key)); err != nil || v != "1" {
		t.Fatalf("the acknowledging replica lacks the lease: EXISTS = %q, %v", v, err)
	}
	// Sentinel ranks replicas by the offsets of their last INFO: wait
	// until every sentinel (the one failing over among them) has seen the
	// lagging one behind, so that the ranking is the one this schedule is
	// about, not a tie.
	sentinelsSeeAhead(t, h.S, acked, lagging)
	h.Old.Stop()
	restore()
	p := forceFailover(t, h.S, h.S.Sentinels[0], h.Old)
	if p != acked {
		// Not the schedule under test (see the doc comment): report it
		// rather than pass silently.
		t.Fatalf("the sentinels promoted %s, not the replica that acknowledged (%s; the lagging one is %s)", p.Addr(), acked.Addr(), lagging.Addr())
	}
	h.judge(t, kept, 5*time.Second, 0)
	if v, err := p.Do("GET", h.Holder.LockKey(h.Key)); err != nil || !strings.HasPrefix(v, lk.Owner()+"|") {
		t.Fatalf("the new primary holds %q (%v), want the holder's lease (owner %s)", v, err, lk.Owner())
	}
}

// sentinelsSeeAhead waits (bounded) until every sentinel of s reports
// replica ahead at a higher replication offset than replica behind.
func sentinelsSeeAhead(t *testing.T, s *testserver.Sentinel, ahead, behind *testserver.Redis) {
	t.Helper()
	offsets := func(sn *testserver.Redis) map[string]int64 {
		reply, err := sn.Do("SENTINEL", "REPLICAS", s.Master())
		if err != nil {
			return nil
		}
		out := map[string]int64{}
		f := strings.Split(reply, "\n")
		name := ""
		for i := 0; i+1 < len(f); i += 2 {
			switch f[i] {
			case "name":
				name = f[i+1]
			case "slave-repl-offset":
				out[name], _ = strconv.ParseInt(f[i+1], 10, 64)
			}
		}
		return out
	}
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for _, sn := range s.Sentinels {
		for {
			o := offsets(sn)
			if o != nil && o[ahead.Addr()] > o[behind.Addr()] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s does not see %s ahead of %s: %v", sn.Addr(), ahead.Addr(), behind.Addr(), o)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestFailover_ResumedDeposedPrimary_HolderLearnsOfLoss: the primary is
// paused (SIGSTOP) while a lock is held with renewals due every TTL/3,
// the sentinels promote a replica, and the old primary is continued at
// once: it is still a primary (with the lease) until the sentinels turn
// it into a replica, and the holder's client still has its connections to
// it (the pipeline connection of its renewals among them). A renewal in
// flight when it stopped, or sent before the client hears of the switch,
// succeeds there, on a server whose writes the new primary never gets:
// the holder may then believe it holds the key for a while after the new
// primary granted it again (see Not guaranteed in docs/redislock.md). What is
// asserted: whenever the contender is granted, the holder's Lost() is
// closed, or closes within dlocktest.HangTimeout, and the contender's
// token is above the holder's; otherwise the holder keeps its lease (on
// the new primary) and the contender is refused. The "kill" variants kill
// the primary instead: nothing can renew on it, and the holder's Lost()
// is closed by the grant. TTLs from dlock.MinTTL (lost long before the
// failover ends) to 5s (outlasts it).
//
// Long (make test-long): the 8-case paused-primary matrix (two faults ×
// four leases, each case a deployment of its own waiting out leases).
func TestFailover_ResumedDeposedPrimary_HolderLearnsOfLoss(t *testing.T) {
	testserver.Long(t, "the 8-case paused-primary matrix: two faults × four leases, a deployment each")
	t.Parallel()
	ttls := []time.Duration{dlock.MinTTL, time.Second, 2 * time.Second, 5 * time.Second}
	for _, fault := range []failoverFault{faultPause, faultKill} {
		t.Run(string(fault), func(t *testing.T) {
			t.Parallel()
			for _, ttl := range ttls {
				t.Run(ttl.String(), func(t *testing.T) {
					t.Parallel()
					pausedPrimaryResumes(t, fault, ttl)
				})
			}
		})
	}
}

func pausedPrimaryResumes(t *testing.T, fault failoverFault, ttl time.Duration) {
	h := newFailoverHold(t, failoverSetup{})
	h.hold(t, dlock.WithTTL(ttl))
	// The renewals' pipeline connection goes to the old primary (it would
	// be opened by the first renewal, perhaps only after the failover).
	warmPipelines(t, h.HolderClient)
	h.failover(t, fault, true)
	want := ordered
	if fault == faultPause {
		want = learnsOfLoss
	}
	h.judge(t, want, max(4*ttl, 10*time.Second), 2*ttl, dlock.WithTTL(ttl))
}

// TestFailover_SplitBrainStaleConns_HolderLearnsOfLoss: the primary and
// the one sentinel the holder's client listens to for +switch-master stop
// together (one frozen host), the two others fail over, then both resume
// (or the sentinel stays stopped). The holder's client never heard of the
// switch, and its pools still have idle connections to the old primary,
// which is a primary again until the sentinels demote it: renewals there
// succeed meanwhile (see Not guaranteed in docs/redislock.md). Asserted as in
// TestFailover_ResumedDeposedPrimary_HolderLearnsOfLoss: a grant to the
// contender while the holder believes it holds the key must be followed
// by the holder's Lost() within dlocktest.HangTimeout.
//
// Long (make test-long): a failover matrix (the sentinel resumes or stays
// paused), each case a deployment of its own waiting out 8s leases.
func TestFailover_SplitBrainStaleConns_HolderLearnsOfLoss(t *testing.T) {
	testserver.Long(t, "a failover matrix of two cases, each waiting out 8s leases")
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(map[bool]string{false: "SentinelResumes", true: "SentinelStaysPaused"}[keep], func(t *testing.T) {
			t.Parallel()
			splitBrainStaleConns(t, keep)
		})
	}
}

func splitBrainStaleConns(t *testing.T, keepSentinelPaused bool) {
	const ttl = 8 * time.Second
	h := newFailoverHold(t, failoverSetup{HolderSentinels: func(all []string) []string { return all[:1] }})
	hc, s, old := h.HolderClient, h.S, h.Old
	// Fill the pools (commands' and pipelines') with idle connections to
	// the old primary.
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Go(func() { hc.Do(context.Background(), "DEBUG", "SLEEP", "0.05") })
		wg.Go(func() {
			hc.Pipelined(context.Background(), func(p redis.Pipeliner) error {
				p.Do(context.Background(), "DEBUG", "SLEEP", "0.05")
				return nil
			})
		})
	}
	wg.Wait()
	t.Logf("pool: %+v", hc.PoolStats())
	lk := h.hold(t, dlock.WithTTL(ttl))
	s.WaitSynced(old)
	old.Pause()
	s.Sentinels[0].Pause()
	t.Cleanup(old.Resume)
	t.Cleanup(s.Sentinels[0].Resume)
	p := forceFailover(t, s, s.Sentinels[1], old)
	old.Resume()
	if !keepSentinelPaused {
		s.Sentinels[0].Resume()
	}
	t.Logf("failover to %s; holder lost yet: %v; pool %+v", p.Addr(), lostYet(lk), hc.PoolStats())
	h.Detail = func() string {
		v, _ := old.Do("GET", h.Holder.LockKey(h.Key))
		info, _ := old.Do("INFO", "replication")
		return fmt.Sprintf("old primary has %q, %q", v, info[:min(40, len(info))])
	}
	h.judge(t, learnsOfLoss, 4*ttl, 2*ttl, dlock.WithTTL(ttl))
}

// TestFailover_WaitersGrantedAcrossFailover: two blocking Acquires wait
// for a held key, one subscribed and queued before the primary is paused,
// one that starts waiting while it is paused (its subscription goes to
// the stopped server). The sentinels promote a replica (which has the
// lease); the holder releases there. The waiters' pub/sub connections are
// on the old primary, which never tells them: they must still get the
// key, one after the other, by polling, within their bounded backoff
// (well within the hang bound here), and their tokens are above the
// holder's.
func TestFailover_WaitersGrantedAcrossFailover(t *testing.T) {
	t.Parallel()
	h := newFailoverHold(t, failoverSetup{})
	s, old, waiterL, key := h.S, h.Old, h.Contender, h.Key
	const ttl = 20 * time.Second // outlasts the failover: the holder keeps the key
	lk := h.hold(t, dlock.WithTTL(ttl))
	type result struct {
		lk  *dlock.Lock
		err error
		at  time.Time
	}
	results := make(chan result, 2)
	wait := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		l, err := waiterL.Acquire(ctx, key, dlock.WithTTL(ttl))
		results <- result{l, err, time.Now()}
		if l != nil {
			l.Release(context.Background())
		}
	}
	go wait()
	waitQueued(t, newClient(t, old), waiterL.LockKey(key)+":waiters", 1)
	s.WaitSynced(old)
	old.Pause()
	t.Cleanup(old.Resume)
	go wait()
	p := forceFailover(t, s, s.Sentinels[0], old)
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("the holder's release on the new primary %s: %v", p.Addr(), err)
	}
	released := time.Now()
	for i := 0; i < 2; i++ {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("waiter %d: %v", i, r.err)
			}
			t.Logf("waiter granted token %d %v after the release", r.lk.Token(), r.at.Sub(released).Round(time.Millisecond))
			if r.lk.Token() <= lk.Token() {
				t.Errorf("waiter's token %d not above the holder's %d", r.lk.Token(), lk.Token())
			}
		case <-time.After(90 * time.Second):
			t.Fatalf("hang: waiter %d not granted within 90s of the release on the new primary", i)
		}
	}
}

// TestFailover_ReleaseAndListReturnByDeadline_PrimaryPaused: while the
// primary is paused, a Release and a List return by their contexts'
// deadlines (with errors wrapping dlock.ErrUnavailable); after the
// failover, the Release retried on the new primary frees the key (a
// contender is granted at once, not after the TTL) and List there sees
// the key's release.
func TestFailover_ReleaseAndListReturnByDeadline_PrimaryPaused(t *testing.T) {
	t.Parallel()
	h := newFailoverHold(t, failoverSetup{})
	s, old, l := h.S, h.Old, h.Holder
	const ttl = 40 * time.Second // a release that did not happen shows: the key stays held
	lk := h.hold(t, dlock.WithTTL(ttl))
	s.WaitSynced(old)
	old.Pause()
	t.Cleanup(old.Resume)
	const short = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), short)
	start := time.Now()
	err := lk.Release(ctx)
	cancel()
	t.Logf("release while paused: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err == nil || !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("release while the primary is paused: %v, want an error wrapping ErrUnavailable", err)
	}
	if over := time.Since(start) - short; over > dlocktest.OverrunBound {
		t.Errorf("release overran its %v context by %v", short, over)
	}
	ctx, cancel = context.WithTimeout(context.Background(), short)
	start = time.Now()
	_, err = l.List(ctx, "")
	cancel()
	t.Logf("list while paused: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err == nil || !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("list while the primary is paused: %v, want an error wrapping ErrUnavailable", err)
	}
	if over := time.Since(start) - short; over > dlocktest.OverrunBound {
		t.Errorf("list overran its %v context by %v", short, over)
	}
	p := forceFailover(t, s, s.Sentinels[0], old)
	var rerr error
	for end := time.Now().Add(dlocktest.HangTimeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if rerr = lk.Release(dlocktest.Context(t)); rerr == nil {
			break
		}
	}
	if rerr != nil {
		t.Fatalf("release retried on the new primary %s: %v", p.Addr(), rerr)
	}
	// Released: nobody holds the key; the contender must be granted it
	// at once, not after the TTL.
	h.Lock = nil
	got := h.judge(t, granted, 10*time.Second, 0, dlock.WithTTL(ttl)).Got
	infos, err := l.List(dlocktest.Context(t), "")
	if err != nil || len(infos) != 1 || infos[0].Holders[0].Token != got.Token() {
		t.Fatalf("List on the new primary: %+v %v, want the contender's token %d", infos, err, got.Token())
	}
}

// splitBrain sets up a deposed primary that stays a primary: the
// sentinels can neither check it nor reconfigure it (its default user,
// the one they use, loses PING and REPLICAOF/SLAVEOF, as if a partition
// cut it off from them), and the group fails over to a replica. The
// holder's client listens for +switch-master on one sentinel only, which
// is paused (on the old primary's side of the partition): it never learns
// of the switch, and its renewals go out on the pipeline connection it
// opened to the old primary before the partition (warmPipelines; a new
// connection would ask the sentinels for the master first). The
// contender's client asks the two other sentinels. It returns the new
// primary.
//
// Without the ACL on REPLICAOF the split would heal by itself: a sentinel
// demotes an instance that reports itself a primary while its config says
// replica once it has been so for 8s, even one it still finds down (it
// checks when the instance went down, not whether it came back), and the
// SLAVEOF it sends kills the holder's connections.
func splitBrain(t *testing.T, h *failoverHold) *testserver.Redis {
	t.Helper()
	s, old := h.S, h.Old
	warmPipelines(t, h.HolderClient)
	s.WaitSynced(old)
	s.Sentinels[0].Pause()
	t.Cleanup(s.Sentinels[0].Resume)
	if _, err := old.Do("ACL", "SETUSER", "default", "-ping", "-replicaof", "-slaveof"); err != nil {
		t.Fatal(err)
	}
	p := forceFailover(t, s, s.Sentinels[1], old)
	if info, err := old.Do("INFO", "replication"); err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("the old primary is no longer a primary: %q %v", info, err)
	}
	return p
}

// splitBrainSetup is the clients of splitBrain: the holder asks the first
// sentinel, the contender the two others.
func splitBrainSetup(holder ...redislock.Option) failoverSetup {
	return failoverSetup{
		HolderSentinels:    func(all []string) []string { return all[:1] },
		ContenderSentinels: func(all []string) []string { return all[1:] },
		Holder:             holder,
	}
}

// TestFailover_SplitBrain_DoubleGrantWithoutAcks is a negative control:
// in the schedule of splitBrain, the holder (no acks) renews on the
// deposed primary, which accepts, while the new primary lets the lease
// expire and grants the key to the contender. The holder is never told: a
// silent double grant, not caused by a write lost in replication but by
// renewals landing on a primary that was deposed (see Not guaranteed in
// docs/redislock.md). Fencing tokens order the two holders. The schedule is made,
// not hoped for: the holder's renewals have their connection to the old
// primary before the partition, and the old primary cannot be demoted.
func TestFailover_SplitBrain_DoubleGrantWithoutAcks(t *testing.T) {
	t.Parallel()
	h := newFailoverHold(t, splitBrainSetup())
	// Long enough that only a holder starved for most of it (2/3 TTL)
	// would miss its renewals.
	const ttl = 4 * time.Second
	lk := h.hold(t, dlock.WithTTL(ttl))
	p := splitBrain(t, h)
	t.Logf("split brain: the holder renews on the deposed primary %s, the contender asks for the key on %s", h.Old.Addr(), p.Addr())
	h.judge(t, doubleGrant, dlocktest.HangTimeout, 0, dlock.WithTTL(ttl))
	// A renewal sent after the grant lands on the deposed primary too:
	// the holder still believes it holds the key.
	renewedAfter(t, lk, time.Now())
}

// TestFailover_SplitBrain_HolderLosesWithAcks is the schedule of
// TestFailover_SplitBrain_DoubleGrantWithoutAcks with WithReplicaAcks(1,
// ...): the deposed primary has no replicas left, so no renewal there is
// acknowledged, the holder's deadline stops moving and its Lost() closes
// (within dlocktest.HangTimeout of the contender's grant at the latest:
// a replica not yet moved away may have acknowledged the last renewals;
// see Not guaranteed in docs/redislock.md).
func TestFailover_SplitBrain_HolderLosesWithAcks(t *testing.T) {
	t.Parallel()
	h := newFailoverHold(t, splitBrainSetup(redislock.WithReplicaAcks(1, redislock.DefaultAckTimeout)))
	const ttl = 2 * time.Second
	h.hold(t, dlock.WithTTL(ttl))
	p := splitBrain(t, h)
	t.Logf("split brain: the holder renews on the deposed primary %s, the contender asks for the key on %s", h.Old.Addr(), p.Addr())
	h.judge(t, grantedAfterLoss, dlocktest.HangTimeout, 0, dlock.WithTTL(ttl))
}

// renewedAfter waits (bounded by dlocktest.HangTimeout) until a renewal
// of lk sent after at has succeeded: lk's deadline is then at least at +
// TTL less the drift allowance. It fails the test if lk is lost first.
func renewedAfter(t *testing.T, lk *dlock.Lock, at time.Time) {
	t.Helper()
	drift := time.Duration(float64(lk.TTL())*dlock.DefaultDriftFactor) + dlock.DefaultDriftMin
	want := at.Add(lk.TTL() - drift)
	for end := time.Now().Add(dlocktest.HangTimeout); lk.Deadline().Before(want); time.Sleep(10 * time.Millisecond) {
		if lostYet(lk) {
			t.Fatalf("the holder's Lost() closed (%v) before a renewal sent after %v succeeded", lk.Err(), at.Format(time.StampMilli))
		}
		if time.Now().After(end) {
			t.Fatalf("hang: no renewal of the holder's lock sent after %v succeeded within %v", at.Format(time.StampMilli), dlocktest.HangTimeout)
		}
	}
}
