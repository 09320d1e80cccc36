package redisproto_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// An acquisition executed twice for the same owner (go-redis retrying a
// request whose reply was lost) is granted twice, with the same token.
func TestAcquireRetryGrantsSameLease(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	k, owner := key(t), strings.Repeat("a", 32)
	first, err := n.Acquire(dlocktest.Context(t), k, owner, time.Minute, "{}", "", "")
	if err != nil || !first.Granted {
		t.Fatalf("Acquire = %+v, %v", first, err)
	}
	again, err := n.Acquire(dlocktest.Context(t), k, owner, time.Minute, "{}", "", "")
	if err != nil || !again.Granted || again.Token != first.Token {
		t.Fatalf("repeated Acquire = %+v, %v; want granted with token %d", again, err, first.Token)
	}
	other, err := n.Acquire(dlocktest.Context(t), k, strings.Repeat("b", 32), time.Minute, "{}", "", "")
	if err != nil || other.Granted || other.Holder.Owner != owner {
		t.Fatalf("another owner: %+v, %v", other, err)
	}
}

// A release that already took effect succeeds again, also after the key
// moved on to the next holder; a lease that expired or was deleted does
// not.
func TestReleaseRecognisesItsOwnRelease(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	k := key(t)
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	ga, err := n.Acquire(ctx, k, a, time.Minute, "{}", "", "")
	if err != nil || !ga.Granted {
		t.Fatal(ga, err)
	}
	for i := range 2 {
		if ok, err := n.Release(ctx, k, a, ga.Token, time.Hour); !ok || err != nil {
			t.Fatalf("release %d = %v, %v", i, ok, err)
		}
	}
	gb, err := n.Acquire(ctx, k, b, time.Minute, "{}", "", "")
	if err != nil || !gb.Granted || gb.Token <= ga.Token {
		t.Fatal(gb, err)
	}
	if ok, err := n.Release(ctx, k, a, ga.Token, time.Hour); !ok || err != nil {
		t.Fatalf("release retried while the next holder holds the key = %v, %v", ok, err)
	}
	if ok, err := n.Release(ctx, k, b, gb.Token, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := n.Release(ctx, k, a, ga.Token, time.Hour); !ok || err != nil {
		t.Fatalf("release retried after the next holder released = %v, %v", ok, err)
	}
	// Without its token a release cannot tell (an Abort): not held.
	if ok, err := n.Release(ctx, k, a, 0, time.Hour); ok || err != nil {
		t.Fatalf("tokenless release of a released lease = %v, %v", ok, err)
	}
	// A lease deleted behind its holder's back, the key taken again: the
	// late release is refused and leaves the new holder alone.
	k2 := key(t)
	gc, err := n.Acquire(ctx, k2, a, time.Minute, "{}", "", "")
	if err != nil || !gc.Granted {
		t.Fatal(gc, err)
	}
	if err := c.Del(ctx, n.LockKey(k2)).Err(); err != nil {
		t.Fatal(err)
	}
	gd, err := n.Acquire(ctx, k2, b, time.Minute, "{}", "", "")
	if err != nil || !gd.Granted {
		t.Fatal(gd, err)
	}
	if ok, err := n.Release(ctx, k2, a, gc.Token, time.Hour); ok || err != nil {
		t.Fatalf("release of a deleted lease = %v, %v, want refused", ok, err)
	}
	if v, _ := c.Get(ctx, n.LockKey(k2)).Result(); !strings.HasPrefix(v, b+"|") {
		t.Fatalf("new holder's value = %q", v)
	}
}

// The fast scripts act only where the full ones would do the same and
// hand every other state back: a reservation, a lease (the same owner's
// too: a retry), a group; a release with a waiter queued, or of a lease
// no longer held. A grant over a marker takes a token above it.
// Symptom: a fast path that decided one of these states itself would skip a reservation, a wake-up or a receipt.
func TestFastScripts_DeferWhereTheFullScriptsDecide(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	own := strings.Repeat("a", 32)
	for _, v := range []string{"|5|w1|99999999999999", own + "|5|{}", "*s|5|0"} {
		k := key(t)
		if err := c.Set(ctx, n.LockKey(k), v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, tryOnly := range []bool{false, true} {
			if _, ok, err := n.AcquireFast(ctx, k, own, time.Minute, "{}", tryOnly); ok || err != nil {
				t.Errorf("AcquireFast (tryOnly %v) over %q: ok %v (%v), want it handed to acquire.lua", tryOnly, v, ok, err)
			}
		}
		if got, _ := c.Get(ctx, n.LockKey(k)).Result(); got != v {
			t.Errorf("AcquireFast over %q changed it to %q", v, got)
		}
	}
	k := key(t)
	if err := c.Set(ctx, n.LockKey(k), "|41", 0).Err(); err != nil {
		t.Fatal(err)
	}
	o, ok, err := n.AcquireFast(ctx, k, own, time.Minute, "{}", false)
	if !ok || err != nil || o.Token <= 41 {
		t.Fatalf("AcquireFast over the marker |41: %+v, %v, %v; want granted above 41", o, ok, err)
	}
	// Held by another owner: a refusal that registers nothing (tryOnly)
	// is answered as acquire.lua would; one that registers a waiting
	// writer is acquire.lua's.
	other := strings.Repeat("b", 32)
	if _, ok, err := n.AcquireFast(ctx, k, other, time.Minute, "{}", false); ok || err != nil {
		t.Errorf("AcquireFast of a held key, not tryOnly: ok %v (%v), want it handed to acquire.lua", ok, err)
	}
	r, ok, err := n.AcquireFast(ctx, k, other, time.Minute, "{}", true)
	if !ok || err != nil || r.Granted || r.Holder.Owner != own || r.PTTL <= 0 {
		t.Errorf("AcquireFast of a held key, tryOnly: %+v, %v, %v; want refused naming %s, with its TTL", r, ok, err, own)
	}
	if err := c.ZAdd(ctx, n.WaitersKey(k), redis.Z{Score: 1, Member: "w1"}).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.ReleaseFast(ctx, k, own, time.Hour); ok || err != nil {
		t.Errorf("ReleaseFast with a waiter queued: ok %v (%v), want it handed to release.lua", ok, err)
	}
	if err := c.Del(ctx, n.WaitersKey(k)).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.ReleaseFast(ctx, k, own, time.Hour); !ok || err != nil {
		t.Fatalf("ReleaseFast of the lease: ok %v (%v)", ok, err)
	}
	if ok, err := n.ReleaseFast(ctx, k, own, time.Hour); ok || err != nil {
		t.Errorf("ReleaseFast again: ok %v (%v), want it handed to release.lua (which finds the marker)", ok, err)
	}
}
