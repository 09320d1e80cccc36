package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Failover tests (issue 16): a Sentinel group (testserver.StartSentinel)
// fails over while a lock is held. Their assertions are orderings, never
// clock thresholds: a failover takes as long as it takes on a loaded
// machine, and what matters is who holds the key when.

// failoverClient is a default go-redis failover client of s's master.
func failoverClient(t testing.TB, s *testserver.Sentinel) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master(), SentinelAddrs: s.Addrs()})
	t.Cleanup(func() { c.Close() })
	return c
}

// contend makes TryAcquire attempts on key through l, one every 100ms,
// for at most d (connection errors while the clients find the new primary
// are retried), and returns the first grant (nil if none), the number of
// attempts refused because the key was held, and the last error. With
// held > 0 it also stops once the key has been refused for longer than
// held since the first refusal: a lease of TTL held that its holder
// renewed meanwhile on the server that refuses it.
func contend(t *testing.T, l *redislock.Locker, key string, d, held time.Duration, opts ...dlock.Option) (lk *dlock.Lock, refused int, last error) {
	t.Helper()
	var first time.Time
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		lk, last = l.TryAcquire(ctx, key, opts...)
		cancel()
		if last == nil {
			return lk, refused, nil
		}
		if errors.Is(last, dlock.ErrNotAcquired) {
			if refused++; refused == 1 {
				first = time.Now()
			}
			if held > 0 && time.Since(first) > held {
				break
			}
		}
	}
	return nil, refused, last
}

// lost reports, without waiting, whether lk's Lost() is closed.
func lost(lk *dlock.Lock) bool {
	select {
	case <-lk.Lost():
		return true
	default:
		return false
	}
}

// TestFailoverWhileHeldKill: the primary is killed while a lock is held
// (auto-refresh on, replicas in sync, no acks), the sentinels promote a
// replica, and a contender on its own client tries the key for up to
// 3×TTL. The promise, as an ordering: whenever the contender is granted,
// the holder's Lost() is already closed; otherwise the holder still holds
// (its renewals reach the new primary, which has the key) and the
// contender was refused. Two leases: "short" (2s), which a failover here
// (about 2.5s with down-after 1s) usually outlasts, so the holder's local
// deadline passes first and the contender is granted after it; "long"
// (6s), which usually outlasts the failover, so the holder's renewals
// reach the new primary and the contender is refused. Which branch a run
// takes depends on the machine's timing; each is checked when taken.
func TestFailoverWhileHeldKill(t *testing.T) { testFailoverWhileHeld(t, "kill") }

// TestFailoverWhileHeldPause is TestFailoverWhileHeldKill with the
// primary stopped (SIGSTOP) instead of killed: connections to it stay
// open and requests on them hang; it is continued at the end of the test
// (and the sentinels then make it a replica of the new primary).
func TestFailoverWhileHeldPause(t *testing.T) { testFailoverWhileHeld(t, "pause") }

func testFailoverWhileHeld(t *testing.T, fault string) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{{"short", 2 * time.Second}, {"long", 6 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) { failoverWhileHeld(t, fault, tc.ttl) })
	}
}

func failoverWhileHeld(t *testing.T, fault string, ttl time.Duration) {
	s := testserver.StartSentinel(t)
	old := s.Primary()
	holderL := redislock.New(failoverClient(t, s))
	contenderL := redislock.New(failoverClient(t, s))
	key := dlocktest.Key(t)
	lk, err := holderL.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	s.WaitSynced(old) // the replicas have the lease
	faulted := time.Now()
	switch fault {
	case "kill":
		old.Stop()
	case "pause":
		old.Pause()
		t.Cleanup(old.Resume)
	}
	p := s.WaitFailover(old)
	t.Logf("failover %s -> %s took %v", old.Addr(), p.Addr(), time.Since(faulted).Round(time.Millisecond))

	got, refused, last := contend(t, contenderL, key, 3*ttl, ttl, dlock.WithTTL(ttl))
	if got != nil {
		// Checked right after the grant: the holder must already know.
		if !lost(lk) {
			t.Fatalf("silent double grant: the contender was granted token %d while the holder (token %d) still believes it holds the key", got.Token(), lk.Token())
		}
		t.Logf("the holder lost its lease during the failover (%v); the contender was granted after it (%d refusals first)", lk.Err(), refused)
		if got.Token() <= lk.Token() {
			t.Errorf("contender's token %d not above the holder's %d", got.Token(), lk.Token())
		}
		got.Release(context.Background())
		return
	}
	// Not granted: the key stayed with the holder, on the new primary,
	// and the contender reached it and was refused (for longer than a TTL,
	// so the holder renewed it there, or until 3×TTL).
	if refused == 0 {
		t.Fatalf("the contender was neither granted nor refused for %v after the failover: last error %v", 3*ttl, last)
	}
	if lost(lk) {
		t.Fatalf("the holder lost its lease (%v) and the contender was never granted the key (%d refusals; last %v)", lk.Err(), refused, last)
	}
	if err := lk.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("the holder kept its lease through the failover, yet a refresh on the new primary fails: %v", err)
	}
	t.Logf("the holder kept its lease through the failover; the contender was refused %d times", refused)
}

// TestFailoverLaggingReplicaDoubleGrant is the negative control: it shows
// the hole replica acknowledgement (WithReplicaAcks) closes. The only
// replica's replication link is stalled, so it misses the lock write; the
// holder acquires without acks (the primary answers before any replica has
// the write), the primary dies, and the sentinels promote the replica that
// never had the key. A contender is then granted the key while the holder
// still, rightly by its own clock, believes it holds it: a double grant
// the holder learns of only at its next renewal. Fencing tokens still
// order the two holders (the contender's is above the holder's: the new
// primary issues max(marker + 1, its time in µs), and its clock is the
// same host's), so a guard refuses the old holder's late writes.
func TestFailoverLaggingReplicaDoubleGrant(t *testing.T) {
	s := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithReplicationProxies())
	restore := keepReplicationLinks(t, s)
	old := s.Primary()
	holderL := redislock.New(failoverClient(t, s))
	contenderL := redislock.New(failoverClient(t, s))
	key := dlocktest.Key(t)
	s.ReplicationLinks[0].Stall()
	// A long lease without renewals: Lost() closes only at its local
	// deadline, long after the test; any grant to the contender while the
	// holder's lease lasts is a double grant.
	const ttl = time.Minute
	lk, err := holderL.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	old.Stop()
	restore()
	p := s.WaitFailover(old)
	if v, err := p.Do("EXISTS", holderL.LockKey(key)); err != nil || v != "0" {
		t.Fatalf("the promoted replica has the lock key (EXISTS = %q, %v): the link was not stalled", v, err)
	}
	got, refused, last := contend(t, contenderL, key, 30*time.Second, 0)
	if got == nil {
		t.Fatalf("the contender was not granted the key the new primary never had (%d refusals, last %v)", refused, last)
	}
	defer got.Release(context.Background())
	if lost(lk) {
		t.Fatalf("the holder's Lost() closed (%v): the double grant this control shows did not happen", lk.Err())
	}
	t.Logf("double grant: holder token %d (lease until %v), contender token %d", lk.Token(), lk.Deadline().Round(time.Second), got.Token())
	if got.Token() <= lk.Token() {
		t.Errorf("the contender's token %d is not above the holder's %d: a guard could not refuse the old holder", got.Token(), lk.Token())
	}
	// The holder finds out at its next renewal (here, its own refresh).
	if err := lk.Refresh(dlocktest.Context(t)); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("the holder's refresh after the double grant: %v, want ErrLockLost", err)
	}
}

// keepReplicationLinks keeps s's replicas on their replication proxies
// until restore is called. A sentinel "fixes" a replica whose master
// address is not the primary's (a proxy's is not) with REPLICAOF the
// primary, once failover-timeout has passed since it found the replica:
// the stalled link would then be bypassed, and the replica have every
// write. So failover-timeout is raised on every sentinel meanwhile, and
// restore sets it back (call it once the primary is gone: the fix can
// then only point a replica at the dead primary, and a failover that
// needs a second election is not held back by the raised timeout).
func keepReplicationLinks(t testing.TB, s *testserver.Sentinel) (restore func()) {
	t.Helper()
	set := func(v string) error {
		for _, sn := range s.Sentinels {
			if _, err := sn.Do("SENTINEL", "SET", s.Master(), "failover-timeout", v); err != nil {
				return err
			}
		}
		return nil
	}
	reply, err := s.Sentinels[0].Do("SENTINEL", "MASTER", s.Master())
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Split(reply, "\n")
	orig := ""
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == "failover-timeout" {
			orig = fields[i+1]
		}
	}
	if orig == "" {
		t.Fatalf("SENTINEL MASTER %s has no failover-timeout: %q", s.Master(), reply)
	}
	if err := set(strconv.Itoa(int(time.Hour.Milliseconds()))); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := set(orig); err != nil {
			t.Errorf("restoring failover-timeout %s: %v", orig, err)
		}
	}
}
