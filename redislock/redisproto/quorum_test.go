package redisproto_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Redlock's per-node release keeps a marker with the token, so a retried
// release counts as released; a tokenless one (a failed attempt's
// cleanup) deletes the key.
func TestQuorumReleaseRecognisesItsOwnRelease(t *testing.T) {
	t.Parallel()
	c, n, ctx := quorumNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	g, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0, redisproto.Proposal{})
	if err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	tok := g.Token + 1
	if ok, err := n.Commit(ctx, k, a, tok, "{}", time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// A retried grant leaves the committed lease as it is.
	if g2, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0, redisproto.Proposal{}); err != nil || !g2.Granted {
		t.Fatal(g2, err)
	}
	if v, _ := c.Get(ctx, n.LockKey(k)).Result(); v != fmt.Sprintf("%s|%d|{}", a, tok) {
		t.Fatalf("value after a retried grant = %q", v)
	}
	for i := range 2 {
		if ok, _, err := n.QuorumRelease(ctx, k, a, tok, time.Hour); !ok || err != nil {
			t.Fatalf("release %d = %v, %v", i, ok, err)
		}
	}
	// The marker is free for the next holder.
	if g3, err := n.Grant(ctx, k, strings.Repeat("b", 32), time.Minute, "{}", "", 0, redisproto.Proposal{}); err != nil || !g3.Granted {
		t.Fatal(g3, err)
	}
	k2 := key(t)
	if g, err := n.Grant(ctx, k2, a, time.Minute, "{}", "", 0, redisproto.Proposal{}); err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	if ok, _, err := n.QuorumRelease(ctx, k2, a, 0, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if n, _ := c.Exists(ctx, n.LockKey(k2)).Result(); n != 0 {
		t.Fatal("a tokenless release left the key")
	}
}

// Symptom: a grant executed twice (its reply lost, the client retrying)
// answered "not recorded", which sent the attempt to a commit round.
// A proposal above the floor is the token in the value and the counter;
// the same grant again still counts as recorded, and a proposal at or
// below the floor records nothing.
func TestGrant_ProposalAboveFloor_RecordedOnceAndOnRetry(t *testing.T) {
	t.Parallel()
	c, n, ctx := quorumNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	prop := uint64(time.Now().Add(time.Hour).UnixMicro())
	far := redisproto.Proposal{Token: prop, Retention: time.Hour, MaxLead: 2 * time.Hour}
	for i := range 2 {
		g, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0, far)
		if err != nil || !g.Granted || !g.Recorded || g.Token > prop || i == 0 && g.Token == prop {
			t.Fatalf("grant %d = %+v, %v; want granted, recorded, floor below %d (at it when retried)", i, g, err, prop)
		}
	}
	if v, _ := c.Get(ctx, n.LockKey(k)).Result(); v != fmt.Sprintf("%s|%d|{}", a, prop) {
		t.Fatalf("value = %q, want the proposal as the token", v)
	}
	if v, _ := c.Get(ctx, n.FenceKey(k)).Result(); v != fmt.Sprint(prop) {
		t.Fatalf("counter = %q, want %d", v, prop)
	}
	if ttl, _ := c.PTTL(ctx, n.FenceKey(k)).Result(); ttl <= 59*time.Minute {
		t.Fatalf("counter PTTL %v, want the retention", ttl)
	}
	// A retried grant of a lease that holds another proposal is not
	// recorded.
	far.Token++
	if g, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0, far); err != nil || !g.Granted || g.Recorded {
		t.Fatalf("retried grant with another proposal = %+v, %v; want not recorded", g, err)
	}
	// Another owner after a release proposes at the counter: refused.
	if ok, _, err := n.QuorumRelease(ctx, k, a, prop, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	b := strings.Repeat("b", 32)
	far.Token = prop
	g, err := n.Grant(ctx, k, b, time.Minute, "{}", "", 0, far)
	if err != nil || !g.Granted || g.Recorded || g.Token != prop {
		t.Fatalf("grant at the floor = %+v, %v; want granted, not recorded, floor %d", g, err, prop)
	}
	if v, _ := c.Get(ctx, n.LockKey(k)).Result(); v != b+"|0|{}" {
		t.Fatalf("value = %q, want token 0 until a commit", v)
	}
}

// Symptom: a node recorded any proposal above its floor, up to 2^53, so
// one client with a wrong measure could put a key's tokens years ahead of
// every clock (and tokens went back once the counter expired).
// A proposal more than MaxLead ahead of the node's clock is not recorded,
// and a proposal that cannot be kept, or has no retention, is refused
// before anything is written.
func TestGrant_ProposalTooFarAheadOrBad_NotRecorded(t *testing.T) {
	t.Parallel()
	c, n, ctx := quorumNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	ahead := uint64(time.Now().Add(time.Hour).UnixMicro())
	g, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0, redisproto.Proposal{Token: ahead, Retention: time.Hour})
	if err != nil || !g.Granted || g.Recorded || g.Now <= 0 {
		t.Fatalf("grant an hour ahead = %+v, %v; want granted, not recorded, the node's time", g, err)
	}
	if v, _ := c.Get(ctx, n.LockKey(k)).Result(); v != a+"|0|{}" {
		t.Fatalf("value = %q, want token 0", v)
	}
	if n, _ := c.Exists(ctx, n.FenceKey(k)).Result(); n != 0 {
		t.Fatal("the counter was raised")
	}
	k2 := key(t) + "-2"
	for _, p := range []redisproto.Proposal{
		{Token: 1 << 53, Retention: time.Hour, MaxLead: 1 << 62},
		{Token: uint64(time.Now().UnixMicro()) + 1000, Retention: 0},
	} {
		if g, err := n.Grant(ctx, k2, a, time.Minute, "{}", "", 0, p); err == nil || !strings.Contains(err.Error(), "bad proposal") {
			t.Fatalf("grant with %+v = %+v, %v; want a bad proposal error", p, g, err)
		}
		if n, _ := c.Exists(ctx, n.LockKey(k2), n.FenceKey(k2)).Result(); n != 0 {
			t.Fatalf("grant with %+v wrote %d keys", p, n)
		}
	}
}

// quorumNode starts a server and returns a default client on it, its
// Node under the default prefix, and the test's context.
func quorumNode(t *testing.T) (*redis.Client, *redisproto.Node, context.Context) {
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	return c, redisproto.NewNode(c, "dlock"), dlocktest.Context(t)
}
