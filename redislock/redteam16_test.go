package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

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
