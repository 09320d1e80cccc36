package redisproto_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// A reader woken by a release (the marker reserves the key for it) that is
// refused for a waiting writer passes the reservation on to the next
// queued waiter, and the marker keeps the key's token, digit for digit
// (a token of 16 digits printed as a Lua number would read "1.79...e+15").
func TestReaderPassesReservationOn(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	k := key(t)
	// A token ahead of the server clock (the year 2100), so the next one
	// is this one + 1, not the server time (see next_token in helpers.lua).
	const tok = "4102444800000000"
	until := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	if err := c.Set(ctx, n.LockKey(k), "|"+tok+"|r1|"+until, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	// w2 is queued and listening; a writer is registered.
	sub, err := n.Watch(ctx, k, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := c.ZAdd(ctx, n.WaitersKey(k), redis.Z{Score: 1, Member: "w2"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ZAdd(ctx, n.WritersKey(k), redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "writer"}).Err(); err != nil {
		t.Fatal(err)
	}
	o, err := n.AcquireGroup(ctx, k, strings.Repeat("a", 32), time.Minute, "{}", "r1", 0)
	if err != nil || o.Granted || !o.WriterWaiting {
		t.Fatalf("reader with the reservation: %+v, %v; want refused for the writer", o, err)
	}
	v, err := c.Get(ctx, n.LockKey(k)).Result()
	if err != nil || !strings.HasPrefix(v, "|"+tok+"|w2|") {
		t.Fatalf("marker %q (%v), want token %s reserved for w2", v, err, tok)
	}
	select {
	case <-sub.C():
	case <-time.After(5 * time.Second):
		t.Fatal("w2 was not woken")
	}
	// The writer takes the key over the marker with the next token.
	g, err := n.Acquire(ctx, k, strings.Repeat("b", 32), time.Minute, "{}", "w2", "writer")
	if err != nil || !g.Granted || strconv.FormatUint(g.Token, 10) != "4102444800000001" {
		t.Fatalf("writer: %+v, %v; want granted with token %s + 1", g, err, tok)
	}
	if nw, _ := c.ZCard(ctx, n.WritersKey(k)).Result(); nw != 0 {
		t.Fatalf("%d writers registered after the writer's grant, want 0", nw)
	}
}

// A group's holders expire one by one on the server's clock: a holder
// whose lease ended is not reported, refreshed or released, while the
// others stay; the last release leaves the marker with the latest token.
func TestGroupHoldersExpireAlone(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	n := redisproto.NewNode(c, "dlock")
	ctx := dlocktest.Context(t)
	k := key(t)
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	ga, err := n.AcquireGroup(ctx, k, a, 200*time.Millisecond, "{}", "", 0)
	if err != nil || !ga.Granted {
		t.Fatal(ga, err)
	}
	gb, err := n.AcquireGroup(ctx, k, b, time.Minute, "{}", "", 0)
	if err != nil || !gb.Granted || gb.Token <= ga.Token {
		t.Fatal(gb, err)
	}
	time.Sleep(300 * time.Millisecond)
	if ok, err := n.RefreshGroup(ctx, k, a, time.Minute); err != nil || ok {
		t.Fatalf("refresh of an expired holder: %v, %v", ok, err)
	}
	if ok, err := n.ReleaseGroup(ctx, k, a, ga.Token, time.Hour); err != nil || ok {
		t.Fatalf("release of an expired holder: %v, %v", ok, err)
	}
	if ok, err := n.RefreshGroup(ctx, k, b, time.Minute); err != nil || !ok {
		t.Fatalf("refresh of the live holder: %v, %v", ok, err)
	}
	infos, err := n.List(ctx, k)
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Owner != b {
		t.Fatalf("List = %+v, %v; want b alone", infos, err)
	}
	if ok, err := n.ReleaseGroup(ctx, k, b, gb.Token, time.Hour); err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	if ok, err := n.ReleaseGroup(ctx, k, b, gb.Token, time.Hour); err != nil || !ok {
		t.Fatalf("retried release: %v, %v", ok, err)
	}
	v, err := c.Get(ctx, n.LockKey(k)).Result()
	if err != nil || v != "|"+strconv.FormatUint(gb.Token, 10) {
		t.Fatalf("after the last release the key holds %q (%v), want the marker of token %d", v, err, gb.Token)
	}
	for _, key := range []string{n.HoldersKey(k), n.LockKey(k) + ":hd"} {
		if e, _ := c.Exists(ctx, key).Result(); e != 0 {
			t.Errorf("%s left behind", key)
		}
	}
}
