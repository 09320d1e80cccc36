package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// The failover judge: every failover test in this package sets up a
// Sentinel deployment, a holder and a contender on clients of their own,
// acquires a key as the holder, brings about a fault, and then lets the
// contender try the key. What is judged is an ordering, never a latency:
// who held the key when the contender was granted it.
//
// The deployments never fail over on their own: their down-after
// (failoverDownAfter) outlasts any test, so a starved machine, whose
// servers miss the sentinels' PINGs for a moment, cannot trip a failover
// a test did not ask for (before its fault, or a second one after it). A
// test applies its fault (kill, pause, partition) first and then makes a
// sentinel fail over (forceFailover, SENTINEL FAILOVER), the schedule a
// real outage takes once the sentinels find the primary down.
//
// Each case starts its own deployment: cases sharing one (the next case on
// the primary the last failover promoted) inherit whatever the last
// failover had not finished.

// failoverDownAfter is the failover deployments' down-after: longer than
// any test, so that only forceFailover fails them over.
const failoverDownAfter = 2 * dlocktest.HangTimeout

// failoverSetup is a failover test's deployment and clients.
type failoverSetup struct {
	// Sentinel are StartSentinel's options.
	Sentinel []testserver.SentinelOption
	// HolderSentinels and ContenderSentinels pick the sentinels each
	// client asks for the master (nil: all of them).
	HolderSentinels, ContenderSentinels func(all []string) []string
	// Holder are the holder's redislock options (e.g. WithReplicaAcks).
	Holder []redislock.Option
}

// failoverHold is a deployment started by newFailoverHold: Lock is the
// holder's lock once hold is called.
type failoverHold struct {
	S *testserver.Sentinel
	// Old is the primary when the deployment was set up.
	Old *testserver.Redis
	// HolderClient is the holder's go-redis failover client.
	HolderClient      *redis.Client
	Holder, Contender *redislock.Locker
	Key               string
	Lock              *dlock.Lock
	// Detail, when set, adds to the report of a silent double grant
	// (e.g. what the old primary holds).
	Detail func() string
}

// failoverTestClient is a default go-redis failover client of s's master.
func failoverTestClient(t testing.TB, s *testserver.Sentinel) *redis.Client {
	return failoverTestClientOf(t, s, s.Addrs())
}

// failoverTestClientOf is a default go-redis failover client of s's master
// that asks the sentinels at addrs.
func failoverTestClientOf(t testing.TB, s *testserver.Sentinel, addrs []string) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master(), SentinelAddrs: addrs})
	t.Cleanup(func() { c.Close() })
	return c
}

// newFailoverHold starts the deployment of setup and the two clients.
func newFailoverHold(t *testing.T, setup failoverSetup) *failoverHold {
	t.Helper()
	s := testserver.StartSentinel(t, append([]testserver.SentinelOption{testserver.WithDownAfter(failoverDownAfter)}, setup.Sentinel...)...)
	client := func(pick func([]string) []string) *redis.Client {
		addrs := s.Addrs()
		if pick != nil {
			addrs = pick(addrs)
		}
		return failoverTestClientOf(t, s, addrs)
	}
	h := &failoverHold{S: s, Old: s.Primary(), Key: dlocktest.Key(t)}
	h.HolderClient = client(setup.HolderSentinels)
	h.Holder = redislock.New(h.HolderClient, setup.Holder...)
	h.Contender = redislock.New(client(setup.ContenderSentinels))
	return h
}

// hold acquires the key as the holder (released at cleanup, whatever
// happened to it).
func (h *failoverHold) hold(t *testing.T, opts ...dlock.Option) *dlock.Lock {
	t.Helper()
	lk, err := h.Holder.Acquire(dlocktest.Context(t), h.Key, opts...)
	if err != nil {
		t.Fatalf("the holder's Acquire on %s before the fault: %v", h.Old.Addr(), err)
	}
	t.Cleanup(func() { lk.Release(context.Background()) })
	h.Lock = lk
	return lk
}

// failoverFault is how the primary is taken away.
type failoverFault string

const (
	faultKill  failoverFault = "kill"  // SIGKILL: connections to it are refused
	faultPause failoverFault = "pause" // SIGSTOP: requests on its connections hang
)

// failover waits until the replicas have every write the primary has
// (the holder's lease), applies fault to the primary and then makes the
// sentinels promote a replica, which it returns. A paused primary is
// continued at cleanup; with resume, at once after the failover (it is a
// primary, with the lease, until the sentinels make it a replica).
func (h *failoverHold) failover(t *testing.T, fault failoverFault, resume bool) *testserver.Redis {
	t.Helper()
	h.S.WaitSynced(h.Old)
	faulted := time.Now()
	switch fault {
	case faultKill:
		h.Old.Stop()
	case faultPause:
		h.Old.Pause()
		t.Cleanup(h.Old.Resume)
	}
	p := forceFailover(t, h.S, h.S.Sentinels[0], h.Old)
	t.Logf("%s: failover %s -> %s took %v", fault, h.Old.Addr(), p.Addr(), time.Since(faulted).Round(time.Millisecond))
	if fault == faultPause && resume {
		h.Old.Resume()
	}
	return p
}

// forceFailover makes the sentinel via fail the group over now (SENTINEL
// FAILOVER: it promotes a replica without waiting for the primary to be
// found down or for the other sentinels to agree), then waits until every
// running sentinel reports a primary other than old and that server has
// taken the primary role, and returns it. A sentinel that finds no
// replica fit to promote yet (its view of them is refreshed every second)
// is asked again, within dlocktest.HangTimeout.
func forceFailover(t *testing.T, s *testserver.Sentinel, via, old *testserver.Redis) *testserver.Redis {
	t.Helper()
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(100 * time.Millisecond) {
		_, err := via.Do("SENTINEL", "FAILOVER", s.Master())
		if err == nil {
			break
		}
		if !strings.HasPrefix(err.Error(), "NOGOODSLAVE") || time.Now().After(end) {
			t.Fatalf("SENTINEL FAILOVER on %s: %v", via.Addr(), err)
		}
	}
	return s.WaitFailover(old)
}

// warmPipelines opens a connection in c's pipeline pool: go-redis keeps
// pipelines on a pool of their own that dials only when a pipeline needs
// a connection, and a failover client's dial first asks a sentinel for
// the master. The watchdog's renewals are pipelines: once warm, they go
// out on this connection, to the primary c knows now, whatever the
// sentinels (or a paused one) would say later.
func warmPipelines(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := dlocktest.Context(t)
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Echo(ctx, "warm")
		return nil
	}); err != nil {
		t.Fatalf("warming the pipeline pool: %v", err)
	}
}

// verdict is what a failover test asserts of the contender's attempts.
type verdict int

const (
	// ordered is the promise: either the contender is granted the key
	// only once the holder's Lost() is closed (and with a higher token),
	// or the contender is refused and the holder still holds it. Which
	// branch a run takes depends on the machine's timing.
	ordered verdict = iota
	// kept: the holder keeps its lease through the failover, and the
	// contender is refused (reached the new primary) and never granted.
	kept
	// grantedAfterLoss: the contender is granted; the holder's Lost() is
	// closed then, or closes within dlocktest.HangTimeout of the grant
	// (the window of WithReplicaAcks that docs/redislock.md states: renewals on a
	// deposed primary acknowledged by a replica not yet moved away).
	grantedAfterLoss
	// doubleGrant is the negative control, no acknowledgement: the
	// contender is granted while the holder still, by its own clock,
	// believes it holds the key; fencing tokens still order them.
	doubleGrant
	// granted: nobody holds the key (h.Lock is nil); the contender must
	// be granted it.
	granted
	// learnsOfLoss is ordered, except that the contender may be granted
	// while the holder still believes it holds the key, provided the
	// holder's Lost() then closes within dlocktest.HangTimeout (and the
	// contender's token is above the holder's): the window docs/redislock.md states
	// for a primary deposed while it was stopped, which takes renewals
	// again once continued, until the sentinels demote it or the
	// holder's client hears of the switch.
	learnsOfLoss
)

func (v verdict) String() string {
	return [...]string{"ordered", "kept", "grantedAfterLoss", "doubleGrant", "granted", "learnsOfLoss"}[v]
}

// judgement is the outcome of a judged contention.
type judgement struct {
	// Got is the contender's lock (nil if never granted), released at
	// cleanup.
	Got *dlock.Lock
	// Refused counts the attempts refused because the key was held.
	Refused int
	// Kept reports that the holder kept its lease and the contender was
	// refused (the second branch of ordered, and kept).
	Kept bool
}

// judge makes the contender try the key (contendUntil: for at most
// window, and, with held > 0, until it has been refused for longer than
// held) and asserts want of the outcome against h.Lock. It fails the
// test (Fatal) on any breach and returns the outcome for further checks.
func (h *failoverHold) judge(t *testing.T, want verdict, window, held time.Duration, opts ...dlock.Option) judgement {
	t.Helper()
	got, refused, last := contendUntil(t, h.Contender, h.Key, window, held, opts...)
	if got != nil {
		t.Cleanup(func() { got.Release(context.Background()) })
	}
	j := judgement{Got: got, Refused: refused}
	lk := h.Lock
	if lk == nil {
		if want != granted {
			t.Fatalf("judge %v without a holder's lock", want)
		}
		if got == nil {
			t.Fatalf("the contender was not granted the free key within %v (%d refusals, last error %v)", window, refused, last)
		}
		return j
	}
	switch {
	case got != nil && want == kept:
		if !lostYet(lk) {
			t.Fatalf("silent double grant: the contender was granted token %d while the holder (token %d) still believes it holds the key (deadline in %v)%s", got.Token(), lk.Token(), time.Until(lk.Deadline()), h.detail())
		}
		t.Fatalf("the holder lost its lease (%v) and the contender was granted token %d: the holder should have kept it", lk.Err(), got.Token())
	case got != nil && want == doubleGrant:
		// The server granted the key again within the holder's lease.
		// The holder may have heard of it first: its Locker reads its
		// keys when its pub/sub connection comes back (a notice may have
		// been missed), on the new primary, which never had the key.
		// Whether that read or the contender's grant comes first is a
		// race; any other loss is not this control's.
		if lostYet(lk) && !strings.Contains(fmt.Sprint(lk.Err()), "(broken)") {
			t.Fatalf("the holder's Lost() closed (%v): the double grant this control shows did not happen", lk.Err())
		}
		t.Logf("double grant: holder token %d (deadline in %v; told: %v), contender token %d", lk.Token(), time.Until(lk.Deadline()).Round(time.Second), lk.Err(), got.Token())
	case got != nil && (want == grantedAfterLoss || want == learnsOfLoss) && !lostYet(lk):
		grant := time.Now()
		select {
		case <-lk.Lost():
			t.Logf("double grant for %v: the holder's Lost() closed (%v) after the contender (token %d) was granted", time.Since(grant).Round(time.Millisecond), lk.Err(), got.Token())
		case <-time.After(dlocktest.HangTimeout):
			t.Fatalf("the holder still believes it holds the key %v after the contender was granted it (token %d; holder token %d)", dlocktest.HangTimeout, got.Token(), lk.Token())
		}
	case got != nil:
		// ordered: checked right after the grant, the holder must
		// already know.
		if !lostYet(lk) {
			t.Fatalf("silent double grant: the contender was granted token %d while the holder (token %d) still believes it holds the key (deadline in %v)%s", got.Token(), lk.Token(), time.Until(lk.Deadline()), h.detail())
		}
		t.Logf("the holder lost its lease (%v); the contender was granted after it (%d refusals first)", lk.Err(), refused)
	case want != ordered && want != kept && want != learnsOfLoss:
		t.Fatalf("the contender was not granted the key within %v (%d refusals, last error %v), want %v", window, refused, last, want)
	case refused == 0:
		t.Fatalf("the contender was neither granted nor refused within %v: last error %v", window, last)
	case lostYet(lk):
		t.Fatalf("the holder lost its lease (%v) and the contender was never granted the key (%d refusals, last error %v)", lk.Err(), refused, last)
	default:
		t.Logf("the holder kept its lease; the contender was refused %d times", refused)
		j.Kept = true
		return j
	}
	if got.Token() <= lk.Token() {
		t.Errorf("the contender's token %d is not above the holder's %d: a guard could not refuse the old holder", got.Token(), lk.Token())
	}
	return j
}

func (h *failoverHold) detail() string {
	if h.Detail == nil {
		return ""
	}
	return "; " + h.Detail()
}

// contendUntil makes TryAcquire attempts on key through l, one every 100ms,
// for at most d (connection errors while the clients find the new primary
// are retried), and returns the first grant (nil if none), the number of
// attempts refused because the key was held, and the last error. With
// held > 0 it also stops once the key has been refused for longer than
// held since the first refusal: a lease of TTL held that its holder
// renewed meanwhile on the server that refuses it.
func contendUntil(t *testing.T, l *redislock.Locker, key string, d, held time.Duration, opts ...dlock.Option) (lk *dlock.Lock, refused int, last error) {
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

// lostYet reports, without waiting, whether lk's Lost() is closed.
func lostYet(lk *dlock.Lock) bool {
	select {
	case <-lk.Lost():
		return true
	default:
		return false
	}
}
