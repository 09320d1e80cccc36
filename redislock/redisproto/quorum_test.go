package redisproto_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Redlock's per-node release keeps a marker with the token, so a retried
// release counts as released; a tokenless one (a failed attempt's
// cleanup) deletes the key.
func TestQuorumReleaseRecognisesItsOwnRelease(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	k, a := key(t), strings.Repeat("a", 32)
	g, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0)
	if err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	tok := g.Token + 1
	if ok, err := n.Commit(ctx, k, a, tok, "{}", time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// A retried grant leaves the committed lease as it is.
	if g2, err := n.Grant(ctx, k, a, time.Minute, "{}", "", 0); err != nil || !g2.Granted {
		t.Fatal(g2, err)
	}
	if v, _ := c.Get(ctx, n.LockKey(k)).Result(); v != fmt.Sprintf("%s|%d|{}", a, tok) {
		t.Fatalf("value after a retried grant = %q", v)
	}
	for i := range 2 {
		if ok, err := n.QuorumRelease(ctx, k, a, tok, time.Hour); !ok || err != nil {
			t.Fatalf("release %d = %v, %v", i, ok, err)
		}
	}
	// The marker is free for the next holder.
	if g3, err := n.Grant(ctx, k, strings.Repeat("b", 32), time.Minute, "{}", "", 0); err != nil || !g3.Granted {
		t.Fatal(g3, err)
	}
	k2 := key(t)
	if g, err := n.Grant(ctx, k2, a, time.Minute, "{}", "", 0); err != nil || !g.Granted {
		t.Fatal(g, err)
	}
	if ok, err := n.QuorumRelease(ctx, k2, a, 0, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if n, _ := c.Exists(ctx, n.LockKey(k2)).Result(); n != 0 {
		t.Fatal("a tokenless release left the key")
	}
}
