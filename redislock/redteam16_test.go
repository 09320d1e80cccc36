package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Red team, issue 16 (replica acknowledgement).

// A lost reply on the acquisition's pipeline: go-redis resends the whole
// pipeline (script + WAIT) on a new connection. The script finds its own
// lease and grants it again; if that second run writes nothing, Redis 7
// leaves the new connection's replication offset where it was and its WAIT
// answers at once with every connected replica, so a grant no replica has
// would be reported acknowledged. With the replica stopped, no acquisition
// may succeed.
func TestRedTeam16_LostReplyIsNotAcknowledged(t *testing.T) {
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

// Tokens are Lua doubles in the scripts: a marker or group token at or
// above 2^53 (written by hand, by another tool, or restored from
// elsewhere) must not give a next token at or below it (2^53 + 1 reads
// as 2^53, and 2^53 + 1 is not a double): the grant is refused with a
// clear error instead, or its token is above the last one.
func TestRedTeam16_TokenAbove2To53(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	const last = "9007199254740993" // 2^53 + 1
	lastN, _ := strconv.ParseUint(last, 10, 64)
	for i, tc := range []struct {
		value string
		opts  []dlock.Option
	}{
		{"|" + last, nil},
		{"|" + last, []dlock.Option{dlock.WithShared()}},
		{"|" + last, []dlock.Option{dlock.WithLimit(3)}},
		{"*s|" + last + "|0", nil}, // a group whose holders are all gone
		{"*s|" + last + "|0", []dlock.Option{dlock.WithShared()}},
	} {
		key := dlocktest.Key(t) + "-" + strconv.Itoa(i)
		if _, err := srv.Do("SET", l.LockKey(key), tc.value, "PX", "60000"); err != nil {
			t.Fatal(err)
		}
		lk, err := l.TryAcquire(dlocktest.Context(t), key, tc.opts...)
		if err != nil {
			t.Logf("%d (%q): refused: %v", i, tc.value, err)
			if errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("%d: refused as if held: %v", i, err)
			}
			continue
		}
		tok := lk.Token()
		lk.Release(dlocktest.Context(t))
		if tok <= lastN {
			t.Fatalf("%d (%q): granted token %d, not above the key's last token %s", i, tc.value, tok, last)
		}
	}
}

// A TryAcquire refused because another client holds the key writes
// nothing that needs acknowledging, but its WAIT (in the same pipeline)
// still waits behind a lagging replica: a documented limitation (see
// "Replica acknowledgement" in doc.go; the fix, a pinned connection that
// sends WAIT only after a grant, races inside go-redis v9.23 under
// -race). What must hold: with time to wait, the refusal names the
// holder; under a deadline shorter than the ack timeout it is the holder
// or an unavailable backend (never a lock), by the deadline.
func TestRedTeam16_RefusedBehindLaggingReplica(t *testing.T) {
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
	if _, err := c.Set(dlocktest.Context(t), "rt16-unreplicated", "x", 0).Result(); err != nil { // the replica now lags
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

// With the replica up, an acquisition whose reply is lost is run again
// (on a new connection) and granted: the lease is the caller's, and the
// replica has it when Acquire returns.
func TestRedTeam16_LostReplyLiveReplicaGranted(t *testing.T) {
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

// Contexts: a nil, an ended, and a deadline shorter than the
// acknowledgement timeout with the replica stopped. Each call returns a
// clear error, the last one by its deadline (well before the ack
// timeout), and no lease is left once the replica is back.
func TestRedTeam16_ContextsWithAcks(t *testing.T) {
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

// A Guard write with a stale fence is refused by the script: nothing was
// written, but its WAIT still waits behind a lagging replica (the
// documented limitation of TestRedTeam16_RefusedBehindLaggingReplica).
// What must hold: with time to wait, the refusal is the stale fence's
// error, not ErrNotReplicated; under a shorter deadline it is that or an
// unavailable server, by the deadline.
func TestRedTeam16_GuardStaleWriteBehindLaggingReplica(t *testing.T) {
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
	if _, err := c.Set(dlocktest.Context(t), "rt16-unreplicated", "x", 0).Result(); err != nil { // the replica now lags
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

// The rollback of an unacknowledged grant fails (the link hangs right
// after the WAIT): TryAcquire returns by its deadline with an error that
// is not transient and no lock; the lease is gone at the latest when its
// TTL ends, and nothing is left running (goleak, TestMain).
func TestRedTeam16_RollbackOnHungLink(t *testing.T) {
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
