package redisproto_test

import (
	"context"
	"fmt"
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
	srv.AddNoScriptsUser(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: testserver.NoScriptsUser, Password: testserver.NoScriptsPassword})
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
	if ok, err := n.TairRelease(ctx, k, redisproto.FormatValue(b, last, "{}"), time.Hour); ok || err != nil {
		t.Fatalf("TairRelease of another value = %v, %v; want false", ok, err)
	}
	for i := range 2 { // the second is a resend
		if ok, err := n.TairRelease(ctx, k, va, time.Hour); !ok || err != nil {
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
	if ok, err := n.TairRelease(ctx, k, redisproto.FormatValue(a, o.Token, "{}"), time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if m, err := sub.ReceiveMessage(ctx); err != nil || m.Channel != n.FreeChannel(k) {
		t.Fatalf("message %+v, %v", m, err)
	}
}

// Grants, renewals and releases are native commands: the token's write,
// the renewal and the release are CAS (the release leaves the token's
// marker, as a script release does), and no script runs.
func TestTair_CommandStats_CASNoScripts(t *testing.T) {
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
	if ok, err := n.TairRelease(ctx, k, v, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	stats, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cmdstat_cas:calls=3,", "cmdstat_set:calls=1,"} {
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

// A release leaves the marker "|<token>" (a key deleted instead would
// forget its last token), and the next grant, by either protocol, is
// above it however far behind the server's clock is.
func TestTairRelease_LeavesTokenMarker_NextGrantAbove(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	high := uint64(time.Now().Add(time.Hour).UnixMicro()) // a clock an hour ahead, now behind
	if err := admin.Set(ctx, n.LockKey(k), "|"+strconv.FormatUint(high, 10), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted || o.Token != high+1 {
		t.Fatalf("TairAcquire over |%d: %+v, %v", high, o, err)
	}
	if ok, err := n.TairRelease(ctx, k, redisproto.FormatValue(a, o.Token, "{}"), time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if v, _ := admin.Get(ctx, n.LockKey(k)).Result(); v != "|"+strconv.FormatUint(high+1, 10) {
		t.Fatalf("after the release the key holds %q, want the marker |%d", v, high+1)
	}
	b := strings.Repeat("b", 32)
	o2, err := n.TairAcquire(ctx, k, b, time.Minute, "{}")
	if err != nil || !o2.Granted || o2.Token != high+2 {
		t.Fatalf("next TairAcquire = %+v, %v; want token %d", o2, err, high+2)
	}
	// A script acquisition after a Lua-free release reads the marker too.
	if ok, err := n.TairRelease(ctx, k, redisproto.FormatValue(b, o2.Token, "{}"), time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	script := redisproto.NewNode(admin, "dlock")
	if o3, err := script.Acquire(ctx, k, strings.Repeat("c", 32), time.Minute, "{}", "", ""); err != nil || !o3.Granted || o3.Token != high+3 {
		t.Fatalf("script Acquire after a Lua-free release = %+v, %v; want token %d", o3, err, high+3)
	}
}

// Symptom: taking over a script release's marker recorded no receipt, so
// that holder's resent release answered "not held".
// The takeover records the marker's token in the receipts, and a marker
// reserving the key for a waiter whose time ran out is free.
func TestTairAcquire_TakesOverMarker_ReceiptAndEndedReservation(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	script := redisproto.NewNode(admin, "dlock")
	k, a, b := key(t), strings.Repeat("a", 32), strings.Repeat("b", 32)
	o, err := script.Acquire(ctx, k, a, time.Minute, "{}", "", "")
	if err != nil || !o.Granted {
		t.Fatal(o, err)
	}
	if ok, err := script.Release(ctx, k, a, o.Token, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	g, err := n.TairAcquire(ctx, k, b, time.Minute, "{}")
	if err != nil || !g.Granted || g.Token <= o.Token {
		t.Fatalf("TairAcquire over the marker = %+v, %v", g, err)
	}
	if ok, err := script.Release(ctx, k, a, o.Token, time.Hour); !ok || err != nil {
		t.Fatalf("the script holder's resent release = %v, %v; want released (by the receipt)", ok, err)
	}
	k2 := key(t) + "-ended"
	ended := strconv.FormatInt(time.Now().Add(-time.Second).UnixMilli(), 10)
	if err := admin.Set(ctx, n.LockKey(k2), "|7|w1|"+ended, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if g, err := n.TairAcquire(ctx, k2, b, time.Minute, "{}"); err != nil || !g.Granted {
		t.Fatalf("over a reservation that ended: %+v, %v; want granted", g, err)
	}
}

// A marker whose token is 2^53 or more is refused with DLOCKTOKEN and
// left as it is, as the scripts do.
func TestTairAcquire_MarkerAt2To53_RefusedAndKept(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	for _, tok := range []string{"9007199254740991", "9007199254740992", "18446744073709551615"} {
		k := key(t) + tok
		if err := admin.Set(ctx, n.LockKey(k), "|"+tok, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if o, err := n.TairAcquire(ctx, k, strings.Repeat("a", 32), time.Minute, "{}"); err == nil || !strings.Contains(err.Error(), "DLOCKTOKEN") {
			t.Fatalf("over |%s: %+v, %v; want DLOCKTOKEN", tok, o, err)
		}
		if v, _ := admin.Get(ctx, n.LockKey(k)).Result(); v != "|"+tok {
			t.Fatalf("the marker became %q", v)
		}
	}
}

// Symptom: a release whose PUBLISH the user's ACL refused reported a
// failure, after the lease was released.
// The release counts; only the notice is lost.
func TestTairRelease_PublishDenied_StillReleased(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	if _, err := srv.Do("ACL", "SETUSER", "nochan", "on", ">pw", "~*", "resetchannels", "+@all", "-@scripting"); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nochan", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	n, ctx := redisproto.NewNode(c, "dlock"), dlocktest.Context(t)
	k, a := key(t), strings.Repeat("a", 32)
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted {
		t.Fatal(o, err)
	}
	if ok, err := n.TairRelease(ctx, k, redisproto.FormatValue(a, o.Token, "{}"), time.Hour); !ok || err != nil {
		t.Fatalf("TairRelease without channel permission = %v, %v; want released", ok, err)
	}
}

// A Ring client is refused: its pipelines would read TIME on another
// shard than the key's.
func TestTairAcquire_RingClient_Refused(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr()}})
	t.Cleanup(func() { r.Close() })
	n := redisproto.NewNode(r, "dlock")
	if o, err := n.TairAcquire(dlocktest.Context(t), key(t), strings.Repeat("a", 32), time.Minute, "{}"); err == nil || !strings.Contains(err.Error(), "Ring") {
		t.Fatalf("TairAcquire on a Ring = %+v, %v; want a refusal naming the Ring", o, err)
	}
}

// Replies lost on the link (the request ran; go-redis sends it again on
// a new connection): the grant finds its own lease and goes on, and the
// release finds its marker. Both report success once.
func TestTair_LostReplies_GrantAndReleaseOnce(t *testing.T) {
	t.Parallel()
	n0, admin, ctx := tairNode(t)
	_ = n0
	srvAddr := admin.Options().Addr
	p := testserver.StartProxy(t, srvAddr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), Username: testserver.NoScriptsUser, Password: testserver.NoScriptsPassword})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(ctx).Err(); err != nil { // the connection's set-up, before any fault
		t.Fatal(err)
	}
	n := redisproto.NewNode(c, "dlock")
	k, a := key(t), strings.Repeat("a", 32)
	p.LoseNextReply()
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted || p.Dropped() != 1 {
		t.Fatalf("TairAcquire with its first reply lost = %+v, %v (%d replies dropped)", o, err, p.Dropped())
	}
	v := redisproto.FormatValue(a, o.Token, "{}")
	if got, _ := admin.Get(ctx, n.LockKey(k)).Result(); got != v {
		t.Fatalf("value %q, want %q", got, v)
	}
	p.LoseNextReply()
	if ok, err := n.TairRelease(ctx, k, v, time.Hour); !ok || err != nil || p.Dropped() != 2 {
		t.Fatalf("TairRelease with its reply lost = %v, %v (%d replies dropped)", ok, err, p.Dropped())
	}
}

// Symptom: a release of a lease that had expired (nobody took the key)
// answered false, and the same release sent again answered true: the
// first had written the marker on the empty key, which the second took
// for its own. Both answer false, and the key is left empty.
func TestTairRelease_ExpiredLease_FalseAlsoWhenSentAgain(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !o.Granted {
		t.Fatal(o, err)
	}
	if err := admin.Del(ctx, n.LockKey(k)).Err(); err != nil { // the lease ends on the server
		t.Fatal(err)
	}
	v := redisproto.FormatValue(a, o.Token, "{}")
	for i := range 2 {
		if ok, err := n.TairRelease(ctx, k, v, time.Hour); ok || err != nil {
			t.Fatalf("release %d of an ended lease = %v, %v; want false", i, ok, err)
		}
	}
	if got, err := admin.Exists(ctx, n.LockKey(k)).Result(); got != 0 || err != nil {
		t.Errorf("the key exists after releases of an ended lease (%d, %v)", got, err)
	}
}

// Symptom: a release sent again after its marker was taken over and the
// next lease expired answered false (a release that happened), and wrote
// a marker below the next holder's token. The receipts answer it: true.
func TestTairRelease_SentAgainAfterTakeoverAndExpiry_Released(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k, a, b := key(t), strings.Repeat("a", 32), strings.Repeat("b", 32)
	oa, err := n.TairAcquire(ctx, k, a, time.Minute, "{}")
	if err != nil || !oa.Granted {
		t.Fatal(oa, err)
	}
	va := redisproto.FormatValue(a, oa.Token, "{}")
	if ok, err := n.TairRelease(ctx, k, va, time.Hour); !ok || err != nil {
		t.Fatal(ok, err)
	}
	ob, err := n.TairAcquire(ctx, k, b, time.Minute, "{}") // takes a's marker over
	if err != nil || !ob.Granted {
		t.Fatal(ob, err)
	}
	if err := admin.Del(ctx, n.LockKey(k)).Err(); err != nil { // b's lease ends
		t.Fatal(err)
	}
	if ok, err := n.TairRelease(ctx, k, va, time.Hour); !ok || err != nil {
		t.Fatalf("a's release sent again = %v, %v; want true (its receipt)", ok, err)
	}
	if got, _ := admin.Get(ctx, n.LockKey(k)).Result(); got != "" {
		t.Errorf("key %q after the resend, want it empty", got)
	}
}

// Symptom: every contender that read a release marker pushed its token
// to the receipts, so a herd of waiters pushed the older receipts out and
// a resent release found none. One receipt per marker, however many
// contenders send the takeover.
func TestTairAcquire_HerdTakingOverOneMarker_OneReceipt(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k := key(t)
	var first string
	for i := range 3 { // three hand-overs: three receipts
		o := strings.Repeat(strconv.Itoa(i), 32)
		g, err := n.TairAcquire(ctx, k, o, time.Minute, "{}")
		if err != nil || !g.Granted {
			t.Fatal(g, err)
		}
		v := redisproto.FormatValue(o, g.Token, "{}")
		if i == 0 {
			first = v
		}
		if ok, err := n.TairRelease(ctx, k, v, time.Hour); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	marker, err := admin.Get(ctx, n.LockKey(k)).Result()
	if err != nil {
		t.Fatal(err)
	}
	last, _ := strconv.ParseUint(strings.TrimPrefix(marker, "|"), 10, 64)
	for i := range 20 { // contenders that all read the marker
		o := fmt.Sprintf("%032d", i)
		if _, err := n.TakeOver(ctx, k, marker, redisproto.FormatValue(o, last, "{}"), last, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	rels, err := admin.LRange(ctx, n.LockKey(k)+":rel", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(rels) != 3 {
		t.Errorf("receipts %v after 3 hand-overs and a herd, want 3", rels)
	}
	if ok, err := n.TairRelease(ctx, k, first, time.Hour); !ok || err != nil {
		t.Errorf("the first holder's release sent again = %v, %v; want true", ok, err)
	}
}

// Symptom: undoing a grant's hold on a key whose marker it had taken
// over deleted the key, so the key forgot its last token. The hold
// carries the marker's token, and undoing it leaves the marker again.
func TestTairAbort_HoldOfATakenOverMarker_LeavesTheMarker(t *testing.T) {
	// Not parallel: the hook is the package's.
	n, admin, ctx := tairNode(t)
	k, a := key(t), strings.Repeat("a", 32)
	const last = 1 << 52
	marker := "|" + strconv.FormatUint(last, 10)
	if err := admin.Set(ctx, n.LockKey(k), marker, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	var hold string
	redisproto.SetAfterTakeOver(t, func() { hold, _ = admin.Get(ctx, n.LockKey(k)).Result() })
	if o, err := n.TairAcquire(ctx, k, a, time.Minute, "{}"); err != nil || !o.Granted {
		t.Fatal(o, err)
	}
	if want := redisproto.FormatValue(a, last, "{}"); hold != want {
		t.Fatalf("hold %q while the marker is taken over, want %q", hold, want)
	}
	// Undo the attempt as if its token write had not happened.
	if err := admin.Set(ctx, n.LockKey(k), hold, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := n.TairAbort(ctx, k, a, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, _ := admin.Get(ctx, n.LockKey(k)).Result(); got != marker {
		t.Fatalf("key %q after the abort, want the marker %q", got, marker)
	}
	o, err := n.TairAcquire(ctx, k, strings.Repeat("b", 32), time.Minute, "{}")
	if err != nil || !o.Granted || o.Token <= last {
		t.Errorf("next grant = %+v, %v; want a token above %d", o, err, uint64(last))
	}
}

// Symptom: breaking a lease whose token is near 2^64 wrapped the marker's
// token round to 1, and the next grant was below the broken holder's.
// Such a lease is refused with DLOCKTOKEN and left in place.
func TestTairBreak_TokenAbove2To53_RefusedAndKept(t *testing.T) {
	t.Parallel()
	n, admin, ctx := tairNode(t)
	k := key(t)
	v := "a|18446744073709551615|{}"
	if err := admin.Set(ctx, n.LockKey(k), v, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.TairBreak(ctx, k, "", time.Hour); err == nil || !strings.Contains(err.Error(), "DLOCKTOKEN") {
		t.Fatalf("TairBreak: %v, want DLOCKTOKEN", err)
	}
	if got, _ := admin.Get(ctx, n.LockKey(k)).Result(); got != v {
		t.Errorf("key %q after the refused break, want %q", got, v)
	}
}

// Symptom: an error reply that passes (OOM, BUSY) to the question "does
// the server have CAS and CAD" was taken for "no", for good. Only an
// unknown command or an ACL's refusal is a no; other errors leave the
// answer to a later question.
func TestTairOffers_PassingErrorReply_NoAnswer(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	if _, err := srv.Do("ACL", "SETUSER", "nocmd", "on", ">pw", "~*", "&*", "+@all", "-@scripting", "-command"); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nocmd", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	n, ctx := redisproto.NewNode(c, "dlock"), dlocktest.Context(t)
	if _, err := srv.Do("CONFIG", "SET", "maxmemory", "1"); err != nil { // CAS is refused as deny-oom
		t.Fatal(err)
	}
	if ok, err := n.TairOffers(ctx); ok || err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("TairOffers while out of memory = %v, %v; want no answer (the OOM error)", ok, err)
	}
	if _, err := srv.Do("CONFIG", "SET", "maxmemory", "0"); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.TairOffers(ctx); !ok || err != nil {
		t.Fatalf("TairOffers = %v, %v; want true", ok, err)
	}
	plain := testserver.StartRedis(t)
	if _, err := plain.Do("ACL", "SETUSER", "nocmd", "on", ">pw", "~*", "&*", "+@all", "-@scripting", "-command"); err != nil {
		t.Fatal(err)
	}
	pc := redis.NewClient(&redis.Options{Addr: plain.Addr(), Username: "nocmd", Password: "pw"})
	t.Cleanup(func() { pc.Close() })
	if ok, err := redisproto.NewNode(pc, "dlock").TairOffers(ctx); ok || err != nil {
		t.Fatalf("TairOffers without the module = %v, %v; want false", ok, err)
	}
}

// Symptom: on a server whose COMMAND is renamed away, the question "does
// the server have CAS and CAD" failed on every request, so a user without
// scripts could never lock. The commands themselves answer it.
func TestTairOffers_CommandRenamedAway_AnsweredByTheCommands(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithTairString(t), testserver.WithArgs("--rename-command", "COMMAND", ""))
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Password()})
	t.Cleanup(func() { c.Close() })
	if ok, err := redisproto.NewNode(c, "dlock").TairOffers(dlocktest.Context(t)); !ok || err != nil {
		t.Fatalf("TairOffers = %v, %v; want true", ok, err)
	}
}
