package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// The holder's link stalls past its session timeout: the server expires
// the session; Lost() closed before anyone else held the key, and once the
// link heals the client learns the session expired.
func TestLock_LostBeforeTaken_SessionExpiredByStall(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	c := connect(t, []string{p.Addr()})
	sid := c.SessionID()
	l := zklock.New(c)
	key := dlocktest.Key(t)
	holder, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	lk := dlocktest.AcquireWhenFree(t, zklock.New(connect(t, []string{z.Addr()})), key, holder)
	defer lk.Release(context.Background())
	if !errors.Is(holder.Err(), dlock.ErrLockLost) {
		t.Fatalf("holder Err() = %v, want ErrLockLost", holder.Err())
	}
	if lk.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", lk.Token(), holder.Token())
	}
	p.Heal()
	// The old holder's client reconnects into an expired session and gets
	// a new one; its Locker works again.
	waitNewSession(t, c, sid)
	lk3, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatalf("Acquire after the session expired: %v", err)
	}
	lk3.Release(context.Background())
}

// The leader of a 3-node ensemble is killed while a lock is held: once
// the survivors elect a leader, the lock is either still held (a renewal
// sent after the election succeeded, and another client is refused), or
// its Lost() closed before another client could get it; never lost
// silently.
func TestLock_RenewedOrLostFirst_LeaderKilled(t *testing.T) {
	t.Parallel()
	nodes := testserver.StartZooKeeperEnsemble(t, 3)
	logsOnFailure(t, nodes...)
	addrs := testserver.ZooKeeperAddrs(nodes)
	l := zklock.New(connectFor(t, addrs, sessionTimeout))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	leader := testserver.ZooKeeperLeader(nodes)
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Stop()
	// Wait for the survivors to elect a leader and serve again.
	var rest []*testserver.ZooKeeper
	for _, z := range nodes {
		if z != leader {
			rest = append(rest, z)
		}
	}
	waitFor(t, "a new leader", func() bool { return testserver.ZooKeeperLeader(rest) != nil })
	elected := time.Now()
	// The holder's watchdog settles it: a renewal sent after the election
	// answers (the deadline moves past elected+TTL), or the lock is lost.
	waitFor(t, "a renewal after the election, or the loss", func() bool {
		return isClosed(lk.Lost()) || lk.Deadline().After(elected.Add(lk.TTL()))
	})
	other := zklock.New(connectFor(t, testserver.ZooKeeperAddrs(rest), sessionTimeout))
	lostBefore := isClosed(lk.Lost())
	lk2, err := other.TryAcquire(dlocktest.Context(t), key)
	switch {
	case err == nil:
		lk2.Release(context.Background())
		if !lostBefore {
			t.Fatalf("another client acquired (token %d) while the holder (token %d) was not told it lost the lock", lk2.Token(), lk.Token())
		}
		t.Logf("the lock was reported lost (%v), then taken", lk.Err())
	case !errors.Is(err, dlock.ErrNotAcquired):
		t.Fatalf("TryAcquire after the election: %v", err)
	case lostBefore:
		t.Logf("the lock was reported lost (%v); its session still holds the node", lk.Err())
	default:
		t.Logf("the lock survived the leader's death (token %d), renewed after the election", lk.Token())
	}
}

// A short disconnect (the connection reset, the session kept): once the
// client has reconnected, a renewal either succeeds, and another client is
// refused the key, or reports the lock lost (a machine too slow to
// reconnect in time), with Lost() closed before anyone else could hold
// it; never both held and taken.
func TestLock_RenewedOrLostFirst_ShortDisconnect(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	c := connectFor(t, []string{p.Addr()}, sessionTimeout)
	l := zklock.New(c)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	p.Cut()
	waitDisconnected(t, c)
	p.Heal()
	waitSession(t, c)
	other := zklock.New(connect(t, []string{z.Addr()}))
	err = lk.Refresh(dlocktest.Context(t))
	lostBefore := isClosed(lk.Lost())
	_, tryErr := other.TryAcquire(dlocktest.Context(t), key)
	switch {
	case err == nil:
		if !errors.Is(tryErr, dlock.ErrNotAcquired) {
			t.Fatalf("the lock was renewed after the reconnect, yet another client's TryAcquire = %v", tryErr)
		}
		t.Logf("held across the disconnect (token %d)", lk.Token())
	case errors.Is(err, dlock.ErrLockLost):
		if tryErr == nil && !lostBefore {
			t.Fatal("another client acquired before the holder's Lost() closed")
		}
		t.Logf("lost across the disconnect: %v", err)
	default:
		t.Fatalf("Refresh after the reconnect: %v", err)
	}
}

// Keys acquired and released leave no znode behind: each release deletes
// its queue node, and the key's znode, a container, is removed by the
// server once empty (the test servers look every 500ms; ZooKeeper's
// default is every minute, at most 10,000 a minute).
func TestRelease_LeavesNoZnode(t *testing.T) {
	t.Parallel()
	testLeavesNoZnode(t, 500)
}

// TestRelease_LeavesNoZnode at scale: 10,000 keys. Long (make test-long):
// ten thousand acquisitions and container removals take minutes under
// -race.
func TestRelease_LeavesNoZnode_TenThousandKeys(t *testing.T) {
	testserver.Long(t, "10,000 keys acquired and released")
	t.Parallel()
	testLeavesNoZnode(t, 10000)
}

func testLeavesNoZnode(t *testing.T, n int) {
	z := sharedZooKeeper(t)
	addrs := []string{z.Addr()}
	admin := connect(t, addrs)
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	prefix := "/accum-" + fmt.Sprint(time.Now().UnixNano())
	for w := range workers {
		l := zklock.New(connect(t, addrs), zklock.WithPrefix(prefix))
		wg.Go(func() {
			for i := w; i < n; i += workers {
				lk, err := l.TryAcquire(dlocktest.Context(t), fmt.Sprintf("job/%d", i))
				if err == nil {
					err = lk.Release(dlocktest.Context(t))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("the %d keys' znodes removed", n), func() bool {
		for _, k := range children(t, admin, prefix) {
			if q := children(t, admin, prefix+"/"+k); len(q) != 0 {
				t.Fatalf("key %s still has queue nodes %v after every release", k, q)
			}
			return false
		}
		return true
	})
	// A client that dies holding a lock leaves its key's znode to the
	// server's container reaper.
	dead := connect(t, addrs)
	if _, err := zklock.New(dead, zklock.WithPrefix(prefix)).Acquire(dlocktest.Context(t), "crashed"); err != nil {
		t.Fatal(err)
	}
	dead.Close() // the session ends: its ephemeral node goes
	waitFor(t, "the container of a crashed holder's key removed", func() bool { return len(children(t, admin, prefix)) == 0 })
}

// The link stalls under a Release: the client gives up on the silent
// server (two thirds of the session timeout, well before the request
// timeout and the caller's context) and fails the request with "zk:
// connection closed", which Release reports wrapping ErrUnavailable.
// Symptom: Release returned the bare "zk: connection closed", not ErrUnavailable.
func TestRelease_Unavailable_ConnectionClosedOnStall(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	const session = 2 * time.Second
	l := zklock.New(connectFor(t, []string{p.Addr()}, session), zklock.WithRequestTimeout(time.Minute))
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	err = lk.Release(dlocktest.Context(t))
	t.Logf("Release on a stalled link: %v", err)
	if !errors.Is(err, zk.ErrConnectionClosed) {
		t.Fatalf("Release on a stalled link: %v, want the client's zk.ErrConnectionClosed (the context and the request timeout are far longer)", err)
	}
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release on a stalled link: %v, want ErrUnavailable", err)
	}
}

// RunOnce on a session-bound lock runs the job with atLeastFor 0 and
// atMostFor at LingerOf the session timeout, and refuses, before the job
// and leaving the key free, an atMostFor just below it (a dead runner's
// node outlives it until the session expires) and any atLeastFor (closing
// the connection deletes the node at once).
func TestRunOnce_BoundsAtSessionLinger(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	l := zklock.New(connect(t, []string{z.Addr()}))
	linger := zklock.LingerOf(sessionTimeout)
	cases := []struct {
		name            string
		atMost, atLeast time.Duration
		runs            bool
	}{
		{"atMostFor at the linger", linger, 0, true},
		{"atMostFor below the linger", linger - time.Millisecond, 0, false},
		{"atLeastFor of a millisecond", linger, time.Millisecond, false},
	}
	for _, c := range cases {
		key := dlocktest.Key(t)
		runs := 0
		ran, err := dlock.RunOnce(dlocktest.Context(t), l, key, c.atMost, c.atLeast, func(context.Context) error {
			runs++
			return nil
		})
		switch {
		case c.runs && (!ran || err != nil || runs != 1):
			t.Errorf("%s: ran=%v err=%v (%d runs), want one run", c.name, ran, err, runs)
		case !c.runs && (ran || runs != 0 || !errors.Is(err, dlock.ErrInvalidOption)):
			t.Errorf("%s: ran=%v err=%v (%d runs), want it refused with ErrInvalidOption before the job", c.name, ran, err, runs)
		}
		lk, err := l.TryAcquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("%s: the key after RunOnce returned: %v, want it free", c.name, err)
		}
		lk.Release(context.Background())
	}
}

// A permit's and a reader's Release whose reply is lost leave no node
// behind: the semaphore's permit and the reader's share come back (a
// writer gets the key), with no orphan holding them for the session.
// Symptom: a lost Release reply leaving the permit's or reader's node behind, holding its share for the session.
func TestRelease_LostReplyLeavesNoNode_PermitAndReader(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	key := dlocktest.Key(t)
	l := zklock.New(connect(t, []string{p.Addr()}))
	dir := l.Path(key)
	for _, opt := range []dlock.Option{dlock.WithLimit(1), dlock.WithShared()} {
		lk, err := l.Acquire(dlocktest.Context(t), key, opt)
		if err != nil {
			t.Fatal(err)
		}
		p.LoseNextReply()
		_ = lk.Release(dlocktest.Context(t)) // an error is allowed: the outcome was unknown
		waitFor(t, "the released node gone", func() bool { return len(children(t, admin, dir)) == 0 })
		w, err := zklock.New(admin).TryAcquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("writer after a lost release reply: %v", err)
		}
		if w.Token() <= lk.Token() {
			t.Fatalf("writer token %d not above the released holder's %d", w.Token(), lk.Token())
		}
		releaseOK(t, w)
	}
}
