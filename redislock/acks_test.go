package redislock_test

import (
	"context"
	"errors"
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

// Every grant's token is at least the server's time in µs, also over a
// release marker: a primary promoted after a failover that missed the
// latest marker (here: a marker far behind, set by hand) still issues a
// token above every earlier one.
func TestTokenFloorOverMarker(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	for _, exclusive := range []bool{true, false} {
		key := dlocktest.Key(t)
		if exclusive {
			key += "-x"
		}
		if _, err := srv.Do("SET", l.LockKey(key), "|5", "PX", "60000"); err != nil {
			t.Fatal(err)
		}
		before := uint64(time.Now().Add(-time.Minute).UnixMicro()) // generous: the server's clock is the host's
		var opts []dlock.Option
		if !exclusive {
			opts = append(opts, dlock.WithShared())
		}
		lk, err := l.TryAcquire(dlocktest.Context(t), key, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() < before {
			t.Errorf("exclusive=%v: token over the marker |5 = %d, want at least the server time in µs (~%d)", exclusive, lk.Token(), before)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// liveAckTimeout is WithReplicaAcks's timeout where a test expects a live
// replica to acknowledge: long, so that a replica starved of CPU for a
// moment (the tests of four modules run at once on two cores) still does;
// how fast it acknowledges is the machine's speed, not a promise. Clients
// of such Lockers and Guards read for longer (ackClient). (A blocking
// Acquire needs no such margin: a grant not acknowledged in time is
// rolled back and tried again.)
const liveAckTimeout = 5 * time.Second

// ackClient is a client of addr (srv's password) whose reads outlast
// liveAckTimeout, as WithReplicaAcks requires.
func ackClient(t testing.TB, srv *testserver.Redis, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: srv.Password(), ReadTimeout: 2 * liveAckTimeout})
	t.Cleanup(func() { c.Close() })
	return c
}

// startReplicated starts a primary and one replica of it and waits for
// their link to be up.
func startReplicated(t *testing.T) (primary, replica *testserver.Redis) {
	t.Helper()
	primary = testserver.StartRedis(t)
	replica = testserver.StartRedis(t, testserver.WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())))
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for {
		info, err := replica.Do("INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return primary, replica
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica's link to the primary is not up after %v: %q, %v", dlocktest.HangTimeout, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pause stops srv (SIGSTOP) until the test ends or the returned func is
// called.
func pause(t *testing.T, srv *testserver.Redis) (resume func()) {
	srv.Pause()
	var once sync.Once
	resume = func() { once.Do(srv.Resume) }
	t.Cleanup(resume)
	return resume
}

// noLease waits (boundedly) until srv holds no lease for lock key lk: the
// key is gone or holds a release marker ("|<token>...").
func noLease(t *testing.T, srv *testserver.Redis, lk string) {
	t.Helper()
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for {
		v, err := srv.Do("GET", lk)
		if err == nil && (v == "" || strings.HasPrefix(v, "|")) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %q (%v) after %v: the unacknowledged grant was not rolled back", lk, v, err, dlocktest.HangTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With a live replica, acquisitions, renewals and releases work, and the
// replica has the lease as soon as Acquire returns: the promise of
// WithReplicaAcks.
func TestReplicaAcksLive(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	l := redislock.New(ackClient(t, primary, primary.Addr()), redislock.WithReplicaAcks(1, liveAckTimeout))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	var last uint64
	for i := range 3 {
		lk, err := l.Acquire(ctx, key, dlock.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("acquisition %d: token %d, not above %d", i, lk.Token(), last)
		}
		last = lk.Token()
		v, err := replica.Do("GET", l.LockKey(key))
		if err != nil || !strings.HasPrefix(v, lk.Owner()+"|"+strconv.FormatUint(lk.Token(), 10)+"|") {
			t.Fatalf("the replica holds %q (%v) right after Acquire returned, want the lease of %s", v, err, lk.Owner())
		}
		if err := lk.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Shared holders go through acquire_group and refresh_group.
	a, err := l.Acquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	if v, err := replica.Do("GET", l.LockKey(key)); err != nil || !strings.HasPrefix(v, "*s|") {
		t.Fatalf("the replica holds %q (%v), want the readers' group", v, err)
	}
	for _, lk := range []*dlock.Lock{a, b} {
		if err := lk.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A Guard's writes reach the replica too.
	g := redislock.NewGuard(ackClient(t, primary, primary.Addr()), redislock.WithReplicaAcks(1, liveAckTimeout))
	if err := g.Put(ctx, key, dlock.Fence{Token: last, Owner: "w"}, "n", "v1"); err != nil {
		t.Fatal(err)
	}
	if v, err := replica.Do("GET", g.Key(key, "n")); err != nil || v != "v1" {
		t.Fatalf("the replica holds %q (%v) right after Put returned, want v1", v, err)
	}
	if n, err := g.IncrBy(ctx, key, dlock.Fence{Token: last, Owner: "w"}, "c", 2); err != nil || n != 2 {
		t.Fatal(n, err)
	}
}

// With the replica stopped, an acquisition is not acknowledged: it fails
// with a *ReplicationError, is rolled back, and leaves no lease.
func TestReplicaAcksPausedReplica(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	l := redislock.New(newClient(t, primary), redislock.WithReplicaAcks(1, 200*time.Millisecond))
	ctx := dlocktest.Context(t)
	pause(t, replica)

	for i, opts := range [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(2)}} {
		key := dlocktest.Key(t) + "-" + strconv.Itoa(i)
		_, err := l.TryAcquire(ctx, key, opts...)
		var re *redislock.ReplicationError
		if !errors.As(err, &re) || !errors.Is(err, redislock.ErrNotReplicated) {
			t.Fatalf("TryAcquire with the replica stopped: %v, want a *ReplicationError", err)
		}
		if re.Op != "acquire" || re.Want != 1 || re.Got != 0 || !re.RolledBack || !errors.Is(err, dlock.ErrTransient) {
			t.Fatalf("%+v (%v): want 0 of 1 replicas, rolled back, transient", re, err)
		}
		if !strings.Contains(err.Error(), "0 of 1 replicas acknowledged within 200ms") {
			t.Errorf("error %q does not say what happened", err)
		}
		noLease(t, primary, l.LockKey(key))
	}

	// A blocking Acquire retries until its deadline, and leaves no lease.
	key := dlocktest.Key(t) + "-blocking"
	const wait = 1500 * time.Millisecond
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(actx, key)
	if err == nil {
		t.Fatal("Acquire succeeded with the replica stopped")
	}
	t.Logf("blocking Acquire: %v", err)
	if took := time.Since(start); took > wait+dlocktest.HangTimeout/2 {
		t.Fatalf("Acquire returned after %v, its deadline was %v", took, wait)
	}
	noLease(t, primary, l.LockKey(key))
}

// TestReplicaAcks_MoreThanReplicas_NeverEnough: two acknowledgements
// asked of one replica: never enough (whether the
// one replica's came within the timeout or not).
func TestReplicaAcks_MoreThanReplicas_NeverEnough(t *testing.T) {
	t.Parallel()
	primary, _ := startReplicated(t)
	l := redislock.New(newClient(t, primary), redislock.WithReplicaAcks(2, 100*time.Millisecond))
	key := dlocktest.Key(t)
	_, err := l.TryAcquire(dlocktest.Context(t), key)
	var re *redislock.ReplicationError
	if !errors.As(err, &re) || re.Want != 2 || re.Got > 1 || !re.RolledBack {
		t.Fatalf("TryAcquire with 2 acks of 1 replica: %v, want at most 1 of 2 replicas, rolled back", err)
	}
	noLease(t, primary, l.LockKey(key))
}

// Renewals the replica does not acknowledge are not counted: the lock is
// lost at its local deadline, though the primary extended the key. A
// Guard's write is applied but reported unacknowledged.
func TestReplicaAcksRenewalNotAcknowledged(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	c := ackClient(t, primary, primary.Addr())
	l := redislock.New(c, redislock.WithReplicaAcks(1, 100*time.Millisecond))
	g := redislock.NewGuard(c, redislock.WithReplicaAcks(1, 100*time.Millisecond))
	gLive := redislock.NewGuard(c, redislock.WithReplicaAcks(1, liveAckTimeout))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(dlocktest.Context(t))
	resume := pause(t, replica)
	select {
	case <-lk.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("Lost() did not close though no renewal was acknowledged")
	}
	if !errors.Is(lk.Err(), dlock.ErrLockLost) {
		t.Fatalf("Err() = %v, want ErrLockLost", lk.Err())
	}
	err = lk.Refresh(dlocktest.Context(t))
	if !errors.Is(err, redislock.ErrNotReplicated) && !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Refresh after the loss: %v", err)
	}

	err = g.Put(dlocktest.Context(t), key, lk.Fence(), "n", "v")
	var re *redislock.ReplicationError
	if !errors.As(err, &re) || !errors.Is(err, redislock.ErrNotReplicated) || errors.Is(err, dlock.ErrTransient) || re.Op != "guard put" {
		t.Fatalf("Guard.Put with the replica stopped: %v, want a *ReplicationError, not transient", err)
	}
	if !strings.Contains(err.Error(), "applied on the primary") {
		t.Errorf("error %q does not say the write was applied", err)
	}
	// Applied on the primary; reads wait for nobody.
	if v, ok, err := g.Get(dlocktest.Context(t), key, lk.Fence(), "n"); err != nil || !ok || v != "v" {
		t.Fatalf("Get = %q, %v, %v", v, ok, err)
	}
	resume()
	if err := gLive.Put(dlocktest.Context(t), key, lk.Fence(), "n", "w"); err != nil {
		t.Fatalf("Put with the replica back: %v", err)
	}
}

// The whole conformance suite, through Lockers that wait for the replica.
func TestConformanceReplicaAcks(t *testing.T) {
	t.Parallel()
	primary, _ := startReplicated(t)
	conformance(t, primary, 2*liveAckTimeout, redislock.WithReplicaAcks(1, liveAckTimeout))
}

// Bad options give Lockers and Guards whose every call fails with a clear
// error; nothing panics.
func TestReplicaAcksBadOptions(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}})
	t.Cleanup(func() { cluster.Close() })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr()}})
	t.Cleanup(func() { ring.Close() })
	short := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: time.Second})
	t.Cleanup(func() { short.Close() })
	plain := newClient(t, srv)
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		opt    redislock.Option
		want   string
	}{
		{"negative", plain, redislock.WithReplicaAcks(-1, 0), "must be 0 (off) to 100"},
		{"too many", plain, redislock.WithReplicaAcks(redislock.MaxReplicaAcks+1, 0), "must be 0 (off) to 100"},
		{"huge timeout", plain, redislock.WithReplicaAcks(1, 1<<62), "at most 1m0s"},
		{"above ReadTimeout", short, redislock.WithReplicaAcks(1, 2*time.Second), "below the client's ReadTimeout"},
		{"cluster", cluster, redislock.WithReplicaAcks(1, 0), "needs a standalone or Sentinel client (redis.Client)"},
		{"ring", ring, redislock.WithReplicaAcks(1, 0), "needs a standalone or Sentinel client (redis.Client)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := dlocktest.Context(t)
			l := redislock.New(tc.client, tc.opt)
			_, err := l.TryAcquire(ctx, "k")
			if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("TryAcquire: %v, want ErrInvalidOption saying %q", err, tc.want)
			}
			if _, err := l.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("Acquire: %v, want ErrInvalidOption", err)
			}
			if _, err := l.List(ctx, ""); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("List: %v, want ErrInvalidOption", err)
			}
			err = redislock.NewGuard(tc.client, tc.opt).Put(ctx, "r", dlock.Fence{Token: 1}, "n", "v")
			if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Guard.Put: %v, want ErrInvalidOption saying %q", err, tc.want)
			}
		})
	}
	// Off (0) is fine anywhere, and a timeout <= 0 is the default.
	if _, err := redislock.New(cluster, redislock.WithReplicaAcks(0, -time.Second)).List(dlocktest.Context(t), "x"); errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatal(err)
	}
}

// A link that stalls while the WAIT is pending: the call returns by its
// context's deadline with dlock.ErrUnavailable, and the grant is undone
// once the link heals.
func TestReplicaAcksStalledLink(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	p := testserver.StartProxy(t, primary.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c, redislock.WithReplicaAcks(1, 2*time.Second))
	key := dlocktest.Key(t)
	if lk, err := l.Acquire(dlocktest.Context(t), key); err != nil { // warm: the scripts are cached
		t.Fatal(err)
	} else if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	resume := pause(t, replica) // the WAIT now lasts its 2s
	ctx, cancel := context.WithTimeout(dlocktest.Context(t), time.Second)
	defer cancel()
	stalled := time.AfterFunc(200*time.Millisecond, p.Stall)
	defer stalled.Stop()
	start := time.Now()
	_, err := l.TryAcquire(ctx, key)
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("TryAcquire on a stalled link: %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > time.Second+dlocktest.HangTimeout/2 {
		t.Fatalf("TryAcquire returned after %v, its deadline was 1s", took)
	}
	p.Heal()
	resume()
	noLease(t, primary, l.LockKey(key))
}

// TestReplicaAcks_LostReplyResent_NotAcknowledged: a lost reply on the
// acquisition's pipeline: go-redis resends the whole
// pipeline (script + WAIT) on a new connection. The script finds its own
// lease and grants it again; if that second run writes nothing, Redis 7
// leaves the new connection's replication offset where it was and its WAIT
// answers at once with every connected replica, so a grant no replica has
// would be reported acknowledged. With the replica stopped, no acquisition
// may succeed.
func TestReplicaAcks_LostReplyResent_NotAcknowledged(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	p := testserver.StartProxy(t, primary.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.Heal)
	l := redislock.New(c, redislock.WithReplicaAcks(1, 300*time.Millisecond))
	modes := [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(2)}}
	for i, opts := range modes { // warm: the scripts are cached, the connection open
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t)+"-warm"+strconv.Itoa(i), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	pause(t, replica)
	for i, opts := range modes {
		key := dlocktest.Key(t) + "-" + strconv.Itoa(i)
		if err := c.Ping(dlocktest.Context(t)).Err(); err != nil { // the connection is open: the lost reply is the script's
			t.Fatal(err)
		}
		p.LoseNextReply()
		lk, err := l.TryAcquire(dlocktest.Context(t), key, opts...)
		if err == nil {
			lk.Release(dlocktest.Context(t))
			t.Fatalf("mode %d: TryAcquire with the replica stopped and a lost reply returned a lock (token %d): its grant was reported acknowledged", i, lk.Token())
		}
		p.Heal()
		noLease(t, primary, l.LockKey(key))
	}
}

// TestReplicaAcks_LostReply_GrantedAndReplicated: with the replica up, an
// acquisition whose reply is lost is run again
// (on a new connection) and granted: the lease is the caller's, and the
// replica has it when Acquire returns.
func TestReplicaAcks_LostReply_GrantedAndReplicated(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	p := testserver.StartProxy(t, primary.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.Heal)
	l := redislock.New(c, redislock.WithReplicaAcks(1, time.Second))
	for i, opts := range [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(2)}} {
		key := dlocktest.Key(t) + "-" + strconv.Itoa(i)
		if err := c.Ping(dlocktest.Context(t)).Err(); err != nil {
			t.Fatal(err)
		}
		if lk, err := l.Acquire(dlocktest.Context(t), key+"-warm", opts...); err != nil { // the scripts are cached
			t.Fatal(err)
		} else {
			lk.Release(dlocktest.Context(t))
		}
		p.LoseNextReply()
		lk, err := l.Acquire(dlocktest.Context(t), key, opts...)
		if err != nil {
			t.Fatalf("mode %d: Acquire with its reply lost: %v", i, err)
		}
		v, err := replica.Do("GET", l.LockKey(key))
		if err != nil || v == "" || v[0] == '|' {
			t.Fatalf("mode %d: the replica holds %q (%v) when Acquire returned", i, v, err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplicaAcks_BatchRenewal_RecoversAfterReplicaReturns: many locks
// renewed in one batch: while the replica is stopped their renewals are
// not acknowledged and not counted, but no lock is reported lost before
// its deadline; once the replica is back (and the scripts were flushed
// meanwhile: NOSCRIPT), renewals are acknowledged again: each lock has a
// renewal sent after the replica's return counted, and still holds.
func TestReplicaAcks_BatchRenewal_RecoversAfterReplicaReturns(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	c := newClient(t, primary)
	const n = 20
	var unacked sync.Map // keys with a renewal not acknowledged
	enough := make(chan struct{})
	var once sync.Once
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventRenew && errors.Is(e.Err, redislock.ErrNotReplicated) {
			unacked.Store(e.Key, true)
			if countMap(&unacked) == n {
				once.Do(func() { close(enough) })
			}
		}
	})
	l := redislock.New(c, redislock.WithReplicaAcks(1, redislock.DefaultAckTimeout), dlock.WithObserver(obs))
	const ttl = 6 * time.Second
	var locks []*dlock.Lock
	for i := range n {
		var opts []dlock.Option
		if i%3 == 1 {
			opts = append(opts, dlock.WithShared())
		}
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t)+"-"+strconv.Itoa(i), append(opts, dlock.WithTTL(ttl))...)
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(dlocktest.Context(t))
		locks = append(locks, lk)
	}
	resume := pause(t, replica)
	select {
	case <-enough: // every lock had a renewal that was not acknowledged
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("hang: %d of %d locks had an unacknowledged renewal within %v", countMap(&unacked), n, dlocktest.HangTimeout)
	}
	if _, err := c.ScriptFlush(dlocktest.Context(t)).Result(); err != nil {
		t.Fatal(err)
	}
	for i, lk := range locks {
		if lostYet(lk) && time.Now().Before(lk.Deadline()) {
			t.Fatalf("lock %d lost before its deadline (%v left): %v", i, time.Until(lk.Deadline()), lk.Err())
		}
	}
	resume()
	back := time.Now()
	for i, lk := range locks {
		renewedAfter(t, lk, back)
		if err := lk.Refresh(dlocktest.Context(t)); err != nil {
			t.Fatalf("lock %d: Refresh with the replica back: %v", i, err)
		}
	}
}

// countMap counts m's entries.
func countMap(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

// TestReplicaAcks_GuardStaleWrite_RefusedBehindLaggingReplica: a Guard
// write with a stale fence is refused by the script: nothing was
// written, but its WAIT still waits behind a lagging replica (the
// documented limitation of TestReplicaAcks_RefusalBehindLaggingReplica_NamesHolderOrUnavailable).
// What must hold: with time to wait, the refusal is the stale fence's
// error, not ErrNotReplicated; under a shorter deadline it is that or an
// unavailable server, by the deadline.
func TestReplicaAcks_GuardStaleWrite_RefusedBehindLaggingReplica(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	c := ackClient(t, primary, primary.Addr())
	const ackTimeout = 2 * time.Second
	g := redislock.NewGuard(c, redislock.WithReplicaAcks(1, ackTimeout))
	res := dlocktest.Key(t)
	// The first write is acknowledged by the live replica.
	if err := redislock.NewGuard(c, redislock.WithReplicaAcks(1, liveAckTimeout)).Put(dlocktest.Context(t), res, dlock.Fence{Token: 10, Owner: "a"}, "n", "v"); err != nil {
		t.Fatal(err)
	}
	want := g.Put(dlocktest.Context(t), res, dlock.Fence{Token: 5, Owner: "b"}, "n", "old")
	if want == nil {
		t.Fatal("a stale fence was admitted")
	}
	pause(t, replica)
	if _, err := c.Set(dlocktest.Context(t), "unreplicated-write", "x", 0).Result(); err != nil { // the replica now lags
		t.Fatal(err)
	}
	start := time.Now()
	err := g.Put(dlocktest.Context(t), res, dlock.Fence{Token: 5, Owner: "b"}, "n", "old")
	t.Logf("a stale Put behind a stopped replica took %v (ack timeout %v)", time.Since(start), ackTimeout)
	if err == nil || errors.Is(err, redislock.ErrNotReplicated) || err.Error() != want.Error() {
		t.Errorf("a stale Put with the replica stopped: %v, want %v", err, want)
	}
	ctx, cancel := context.WithTimeout(dlocktest.Context(t), 300*time.Millisecond)
	defer cancel()
	err = g.Put(ctx, res, dlock.Fence{Token: 5, Owner: "b"}, "n", "old")
	if err == nil || (!errors.Is(err, dlock.ErrUnavailable) && err.Error() != want.Error()) {
		t.Errorf("a stale Put under a 300ms deadline with the replica stopped: %v, want %v or ErrUnavailable", err, want)
	}
}

// stallAfterWait stalls p as soon as a WAIT's reply was read: the
// rollback that follows an unacknowledged grant meets a hung link.
type stallAfterWait struct{ p *testserver.Proxy }

func (h stallAfterWait) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h stallAfterWait) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "wait" {
			h.p.Stall()
		}
		return err
	}
}

func (h stallAfterWait) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if cmd.Name() == "wait" {
				h.p.Stall()
			}
		}
		return err
	}
}

// TestReplicaAcks_RollbackOnHungLink_NotTransient: the rollback of an
// unacknowledged grant fails (the link hangs right
// after the WAIT): TryAcquire returns by its deadline with an error that
// is not transient and no lock; the lease is gone at the latest when its
// TTL ends, and nothing is left running (goleak, TestMain).
func TestReplicaAcks_RollbackOnHungLink_NotTransient(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	p := testserver.StartProxy(t, primary.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.Heal)
	l := redislock.New(c, redislock.WithReplicaAcks(1, 200*time.Millisecond))
	key := dlocktest.Key(t)
	if lk, err := l.Acquire(dlocktest.Context(t), key+"-warm"); err != nil {
		t.Fatal(err)
	} else {
		lk.Release(dlocktest.Context(t))
	}
	pause(t, replica)
	c.AddHook(stallAfterWait{p})
	ctx, cancel := context.WithTimeout(dlocktest.Context(t), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	lk, err := l.TryAcquire(ctx, key, dlock.WithTTL(2*time.Second))
	took := time.Since(start)
	if err == nil {
		lk.Release(dlocktest.Context(t))
		t.Fatal("TryAcquire succeeded with the replica stopped")
	}
	if errors.Is(err, dlock.ErrTransient) {
		t.Errorf("a grant whose rollback failed reported transient (nothing left behind): %v", err)
	}
	if took > 1500*time.Millisecond+dlocktest.HangTimeout/2 {
		t.Errorf("TryAcquire took %v under a 1.5s deadline", took)
	}
	t.Logf("%v after %v", err, took)
	p.Heal()
	noLease(t, primary, l.LockKey(key))
}

// Symptom: a blocking Acquire asking more acknowledgements than replicas connected retried for ever without a word.
// A blocking Acquire asking more acknowledgements than the primary has
// replicas connected returns ErrUnavailable, naming the replicas
// connected.
func TestReplicaAcks_MoreThanConnected_AcquireReturnsUnavailable(t *testing.T) {
	t.Parallel()
	primary, _ := startReplicated(t)
	l := redislock.New(newClient(t, primary), redislock.WithReplicaAcks(2, 100*time.Millisecond))
	key := dlocktest.Key(t)
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(context.Background(), key)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Acquire with 2 acks of 1 connected replica never returned")
	}
	var re *redislock.ReplicationError
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrTransient) || !errors.As(err, &re) || re.Connected != 1 || !re.RolledBack {
		t.Fatalf("Acquire with 2 acks of 1 connected replica = %v, want a rolled-back *ReplicationError with Connected 1 wrapping ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "only 1 replicas are connected") {
		t.Errorf("message %q does not say how many replicas are connected", err)
	}
	noLease(t, primary, l.LockKey(key))
}

// With a deadline, an Acquire short of connected replicas waits for them
// (a replica restarting or resyncing) instead of failing at once, and the
// error it ends with keeps the replication failure as its cause, in one
// line. Symptom: the cause was lost when the deadline fell during an
// attempt, and the message carried a raw newline.
func TestReplicaAcks_MoreThanConnected_WaitsUntilDeadline(t *testing.T) {
	t.Parallel()
	primary, _ := startReplicated(t)
	l := redislock.New(newClient(t, primary), redislock.WithReplicaAcks(2, 100*time.Millisecond))
	// The context ends as the second attempt starts: the first one was
	// refused and retried, not reported.
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	retried := make(chan struct{})
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventAttempt && e.Attempts == 2 {
			close(retried)
			cancel()
		}
	})
	_, err := l.Acquire(ctx, dlocktest.Key(t), dlock.WithCallObserver(obs))
	select {
	case <-retried:
	default:
		t.Fatalf("Acquire returned without trying again: %v", err)
	}
	var re *redislock.ReplicationError
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.Canceled) || !errors.As(err, &re) || re.Want != 2 {
		t.Fatalf("Acquire at its context's end = %v, want ErrUnavailable and context.Canceled with the *ReplicationError as its cause", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("the error is not one line: %q", err)
	}
}

// A TryAcquire refused because another client holds the key writes
// nothing that needs acknowledging, but its WAIT (in the same pipeline)
// still waits behind a lagging replica: a documented limitation (see
// "Replica acknowledgement" in docs/redislock.md; a pinned connection
// that sends WAIT only after a grant would avoid it, but races inside
// go-redis v9.23 under -race). What must hold: with time to wait, the refusal names the
// holder; under a deadline shorter than the ack timeout it is the holder
// or an unavailable backend (never a lock), by the deadline.
func TestReplicaAcks_RefusalBehindLaggingReplica_NamesHolderOrUnavailable(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	c := newClient(t, primary)
	const ackTimeout = 2 * time.Second
	l := redislock.New(c, redislock.WithReplicaAcks(1, ackTimeout))
	key := dlocktest.Key(t)
	holder, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(dlocktest.Context(t))
	for i := range 3 { // warm: more pooled connections that wrote
		if _, err := l.TryAcquire(dlocktest.Context(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("warm %d: %v", i, err)
		}
	}
	pause(t, replica)
	if _, err := c.Set(dlocktest.Context(t), "unreplicated-write", "x", 0).Result(); err != nil { // the replica now lags
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.TryAcquire(dlocktest.Context(t), key)
	took := time.Since(start)
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("refused TryAcquire with the replica stopped: %v, want ErrNotAcquired", err)
	}
	t.Logf("refused TryAcquire behind a stopped replica took %v (ack timeout %v)", took, ackTimeout)
	ctx, cancel := context.WithTimeout(dlocktest.Context(t), 300*time.Millisecond)
	defer cancel()
	lk, err := l.TryAcquire(ctx, key)
	if lk != nil {
		t.Fatal("a lock granted while another client holds the key")
	}
	var na *dlock.NotAcquiredError
	if !(errors.As(err, &na) && len(na.Holders) > 0) && !errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("refused TryAcquire with a deadline (300ms) below the ack timeout: %v, want the holder or ErrUnavailable", err)
	}
}

// Contexts: a nil, an ended, and a deadline shorter than the
// acknowledgement timeout with the replica stopped. Each call returns a
// clear error, the last one by its deadline (well before the ack
// timeout), and no lease is left once the replica is back.
func TestReplicaAcks_NilEndedOrShortContext_FailsByDeadlineWithoutLease(t *testing.T) {
	t.Parallel()
	primary, replica := startReplicated(t)
	c := redis.NewClient(&redis.Options{Addr: primary.Addr(), ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { c.Close() })
	const ackTimeout = 8 * time.Second
	l := redislock.New(c, redislock.WithReplicaAcks(1, ackTimeout))
	key := dlocktest.Key(t)
	//lint:ignore SA1012 a nil context is the attack
	if _, err := l.TryAcquire(nil, key); err == nil { //nolint:staticcheck
		t.Fatal("TryAcquire(nil ctx) succeeded")
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.TryAcquire(ended, key); err == nil {
		t.Fatal("TryAcquire with an ended context succeeded")
	}
	resume := pause(t, replica)
	for i, opts := range [][]dlock.Option{nil, {dlock.WithShared()}} {
		k := key + "-" + strconv.Itoa(i)
		ctx, cancel := context.WithTimeout(dlocktest.Context(t), 300*time.Millisecond)
		start := time.Now()
		_, err := l.Acquire(ctx, k, opts...)
		took := time.Since(start)
		cancel()
		if err == nil {
			t.Fatalf("%d: Acquire succeeded with the replica stopped", i)
		}
		if !errors.Is(err, dlock.ErrUnavailable) && !errors.Is(err, redislock.ErrNotReplicated) {
			t.Errorf("%d: Acquire under a 300ms deadline: %v, want ErrUnavailable or ErrNotReplicated", i, err)
		}
		if took >= ackTimeout/2 {
			t.Errorf("%d: Acquire under a 300ms deadline took %v (ack timeout %v)", i, took, ackTimeout)
		}
	}
	resume()
	noLease(t, primary, l.LockKey(key+"-0"))
	noLease(t, primary, l.LockKey(key+"-1"))
}
