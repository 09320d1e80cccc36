package redisproto_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// A retried release is recognised by its receipt however often the key
// changed hands meanwhile, up to Receipts hand-overs; the receipts expire
// ReceiptRetention after the latest hand-over. A lease that was deleted,
// not released, has no receipt; neither has a release without its token.
func TestReleaseReceipts(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	for _, quorum := range []bool{false, true} {
		k := key(t)
		acquire := func(owner string) uint64 {
			t.Helper()
			if quorum {
				g, err := n.Grant(ctx, k, owner, time.Minute, "{}", "", 0, redisproto.Proposal{})
				if err != nil || !g.Granted {
					t.Fatal(g, err)
				}
				if ok, err := n.Commit(ctx, k, owner, g.Token+1, "{}", time.Hour); !ok || err != nil {
					t.Fatal(ok, err)
				}
				return g.Token + 1
			}
			g, err := n.Acquire(ctx, k, owner, time.Minute, "{}", "", "")
			if err != nil || !g.Granted {
				t.Fatal(g, err)
			}
			return g.Token
		}
		release := func(owner string, tok uint64) bool {
			t.Helper()
			var ok bool
			var err error
			if quorum {
				ok, _, err = n.QuorumRelease(ctx, k, owner, tok, time.Hour)
			} else {
				ok, err = n.Release(ctx, k, owner, tok, time.Hour)
			}
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		owner := func(i int) string { return fmt.Sprintf("%032x", i+1) }
		first := acquire(owner(0))
		if !release(owner(0), first) {
			t.Fatal("release")
		}
		if l, _ := c.Exists(ctx, n.ReceiptsKey(k)).Result(); l != 0 {
			t.Fatal("a release nobody took over wrote receipts (the marker is the receipt)")
		}
		// Receipts hand-overs: the first release is still recognised while
		// each next holder holds the key and after it released.
		second := uint64(0)
		for i := 1; i <= redisproto.Receipts; i++ {
			tok := acquire(owner(i))
			if i == 1 {
				second = tok
			}
			if !release(owner(0), first) {
				t.Fatalf("quorum=%v: retried release not recognised while holder %d holds the key", quorum, i)
			}
			if !release(owner(i), tok) {
				t.Fatal("release")
			}
			if !release(owner(0), first) {
				t.Fatalf("quorum=%v: retried release not recognised after %d hand-overs", quorum, i)
			}
		}
		if release(owner(0), 0) {
			t.Fatalf("quorum=%v: a release without its token recognised", quorum)
		}
		pttl, err := c.PTTL(ctx, n.ReceiptsKey(k)).Result()
		if err != nil || pttl <= 0 || pttl > redisproto.ReceiptRetention {
			t.Fatalf("receipts PTTL = %v, %v; want within (0, %v]", pttl, err, redisproto.ReceiptRetention)
		}
		if l, _ := c.LLen(ctx, n.ReceiptsKey(k)).Result(); l != redisproto.Receipts {
			t.Fatalf("receipts: %d entries, want %d", l, redisproto.Receipts)
		}
		// One hand-over more: the first falls out of the receipts. Its
		// retry is reported as not held (documented limit).
		if !release(owner(99), acquire(owner(99))) {
			t.Fatal("release")
		}
		if release(owner(0), first) {
			t.Fatalf("quorum=%v: a release %d hand-overs back still recognised (receipts are capped)", quorum, redisproto.Receipts+1)
		}
		if !release(owner(1), second) {
			t.Fatalf("quorum=%v: the second release is no longer recognised", quorum)
		}
		// An owner whose lease was deleted never released: no receipt.
		tok := acquire(owner(100))
		if err := c.Del(ctx, n.LockKey(k)).Err(); err != nil {
			t.Fatal(err)
		}
		if release(owner(100), tok) {
			t.Fatalf("quorum=%v: a lease that was deleted, not released, reported released", quorum)
		}
	}
}

// A release retried (its reply lost) after the next holder took over its
// marker: every token being at least the server clock in µs, the next
// token is rarely the marker's + 1, so the retry is recognised by its
// receipt: released already, and the new holder's lease untouched.
func TestRelease_RetryAfterTakeover_RecognisedByReceipt(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	n := redisproto.NewNode(newClient(t, srv.Addr()), "dlock")
	ctx := dlocktest.Context(t)
	k := key(t)
	a, b := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	oa, err := n.Acquire(ctx, k, a, time.Minute, "{}", "", "")
	if err != nil || !oa.Granted {
		t.Fatal(oa, err)
	}
	if ok, err := n.Release(ctx, k, a, oa.Token, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	ob, err := n.Acquire(ctx, k, b, time.Minute, "{}", "", "")
	if err != nil || !ob.Granted || ob.Token <= oa.Token {
		t.Fatalf("%+v, %v: want a grant above %d", ob, err, oa.Token)
	}
	if ob.Token == oa.Token+1 {
		t.Logf("the next token is the marker's + 1 (the clock was behind it)")
	}
	if ok, err := n.Release(ctx, k, a, oa.Token, time.Hour); !ok || err != nil {
		t.Fatalf("the retried release: %v, %v; want released already", ok, err)
	}
	if v, _ := srv.Do("GET", n.LockKey(k)); len(v) < len(b) || v[:len(b)] != b {
		t.Fatalf("the key holds %q after the retried release, want %s's lease", v, b)
	}
}
