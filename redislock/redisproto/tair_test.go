package redisproto_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// tairNode starts a server with the TairString module and returns, on a
// user whose ACL denies every script (+@all -@scripting), a default
// client's Node, an admin client, and the test's context.
func tairNode(t *testing.T) (*redisproto.Node, *redis.Client, context.Context) {
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	if _, err := srv.Do("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@scripting"); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	return redisproto.NewNode(c, "dlock"), newClient(t, srv.Addr()), dlocktest.Context(t)
}

// The Lua-free protocol acquires, refuses, renews and releases on a user
// that may run no script, and each grant's token is above the last:
// after a release, after an expiry, and after another holder.
func TestTairAcquire_NoScripts_TokensIncrease(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k := key(t)
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	var last uint64
	grant := func(owner string, ttl time.Duration) string {
		t.Helper()
		o, err := n.TairAcquire(ctx, k, owner, ttl, "{}")
		if err != nil || !o.Granted || o.Token <= last {
			t.Fatalf("TairAcquire(%s) = %+v, %v; want granted above %d", owner[:1], o, err, last)
		}
		last = o.Token
		v := redisproto.FormatValue(owner, o.Token, "{}")
		if got, _ := admin.Get(ctx, n.LockKey(k)).Result(); got != v {
			t.Fatalf("value %q, want %q", got, v)
		}
		if pttl, _ := admin.PTTL(ctx, n.LockKey(k)).Result(); pttl <= 0 || pttl > ttl {
			t.Fatalf("PTTL %v after a grant of %v", pttl, ttl)
		}
		return v
	}
	va := grant(a, time.Minute)
	// Held: b is refused, with a named.
	if o, err := n.TairAcquire(ctx, k, b, time.Minute, "{}"); err != nil || o.Granted || o.Holder.Owner != a || o.Holder.Token != last || o.PTTL <= 0 {
		t.Fatalf("TairAcquire while held = %+v, %v; want a refusal naming a", o, err)
	}
	if ok, err := n.TairRefresh(ctx, k, va, 2*time.Minute); !ok || err != nil {
		t.Fatalf("TairRefresh = %v, %v", ok, err)
	}
	if pttl, _ := admin.PTTL(ctx, n.LockKey(k)).Result(); pttl <= time.Minute {
		t.Fatalf("PTTL %v after a refresh to 2m", pttl)
	}
	if ok, err := n.TairRefresh(ctx, k, redisproto.FormatValue(b, last, "{}"), time.Minute); ok || err != nil {
		t.Fatalf("TairRefresh of another value = %v, %v; want false", ok, err)
	}
	if ok, err := n.TairRelease(ctx, k, redisproto.FormatValue(b, last, "{}")); ok || err != nil {
		t.Fatalf("TairRelease of another value = %v, %v; want false", ok, err)
	}
	for i := range 2 { // the second is a resend
		if ok, err := n.TairRelease(ctx, k, va); !ok || err != nil {
			t.Fatalf("TairRelease %d = %v, %v", i, ok, err)
		}
	}
	grant(b, 50*time.Millisecond)
	// b's lease expires unreleased; a's next grant is above it still.
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for admin.Exists(ctx, n.LockKey(k)).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("b's lease never expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	grant(a, time.Minute)
}

// Symptom: a resent grant (its reply lost) found its own lease and
// refused itself as held.
// A grant that finds this attempt's lease, with its token written or
// not, is this attempt's grant.
func TestTairAcquire_OwnLeaseFound_Granted(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	if err := admin.Set(ctx, n.LockKey(k), redisproto.FormatValue(a, 0, "{}"), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted || o.Token == 0 {
		t.Fatalf("over its own unstamped lease: %+v, %v", o, err)
	}
	o2, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o2.Granted || o2.Token != o.Token {
		t.Fatalf("over its own stamped lease: %+v, %v; want token %d", o2, err, o.Token)
	}
}

// A script release's marker is taken over: the next token is above the
// marker's, and a marker reserving the key for a waiter is a refusal.
func TestTairAcquire_ScriptReleaseMarker_TakenOverAbove(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	high := uint64(time.Now().Add(time.Hour).UnixMicro())
	if err := admin.Set(ctx, n.LockKey(k), "|"+strconv.FormatUint(high, 10), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted || o.Token != high+1 {
		t.Fatalf("over the marker |%d: %+v, %v; want token %d", high, o, err, high+1)
	}
	k2 := key(t) + "-reserved"
	until := strconv.FormatUint(uint64(time.Now().Add(time.Minute).UnixMilli()), 10)
	if err := admin.Set(ctx, n.LockKey(k2), "|5|w1|"+until, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if o, err := n.TairAcquire(ctx, k2, a, time.Minute, "{}"); err != nil || o.Granted || o.ReservedFor != "w1" {
		t.Fatalf("over a reservation: %+v, %v; want a refusal naming w1", o, err)
	}
}

// A Lua-free release tells the key's free channel.
func TestTairRelease_PublishesOnFreeChannel(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	sub := admin.Subscribe(ctx, n.FreeChannel(k))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted {
		t.Fatal(o, err)
	}
	if ok, err := n.TairRelease(ctx, k, redisproto.FormatValue(a, o.Token, "{}")); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if m, err := sub.ReceiveMessage(ctx); err != nil || m.Channel != n.FreeChannel(k) {
		t.Fatalf("message %+v, %v", m, err)
	}
}

// Renewals and releases are the native commands: they show up as
// cmdstat_cas and cmdstat_cad, and no script runs.
func TestTair_CommandStats_CASAndCADNoScripts(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted {
		t.Fatal(o, err)
	}
	v := redisproto.FormatValue(a, o.Token, "{}")
	if ok, err := n.TairRefresh(ctx, k, v, time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := n.TairRelease(ctx, k, v); !ok || err != nil {
		t.Fatal(ok, err)
	}
	stats, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cmdstat_cas:calls=2,", "cmdstat_cad:calls=1,"} {
		if !strings.Contains(stats, want) {
			t.Errorf("commandstats lack %q:\n%s", want, stats)
		}
	}
	for _, not := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
		if strings.Contains(stats, not) {
			t.Errorf("a script ran: %s", not)
		}
	}
}
