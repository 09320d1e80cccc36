package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

func TestHolderInError(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithMetadata("job", "nightly"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(dlocktest.Context(t))
	_, err = redislock.New(newClient(t, srv)).TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("err = %v", err)
	}
	if len(na.Holders) != 1 {
		t.Fatalf("NotAcquiredError = %+v, want one holder", na)
	}
	if h := na.Holders[0]; h.Owner != lk.Owner() || h.Token != lk.Token() || h.Metadata["job"] != "nightly" || h.Metadata[dlock.MetaPID] == "" || h.TTL <= 0 {
		t.Fatalf("NotAcquiredError = %+v", na)
	}
	if !strings.Contains(err.Error(), "pid=") {
		t.Fatalf("message lacks holder: %v", err)
	}
	infos, err := l.List(dlocktest.Context(t), "dlocktest.")
	if err != nil || len(infos) != 1 || infos[0].Key != key || len(infos[0].Holders) != 1 || infos[0].Holders[0].Token != lk.Token() || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List = %+v, %v", infos, err)
	}
}

func TestTokenIncreasesAfterRestart(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	key := dlocktest.Key(t)
	l := redislock.New(newClient(t, srv))
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	before := lk.Token()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	srv.Restart() // no persistence: the fence counter is gone
	l2 := redislock.New(newClient(t, srv))
	lk2, err := l2.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk2.Release(dlocktest.Context(t))
	if lk2.Token() <= before {
		t.Fatalf("token after restart %d <= before %d", lk2.Token(), before)
	}
}

// Symptom: a last token of 2^53 or more gave a next token at or below it.
// Tokens are Lua doubles in the scripts: a marker or group token at or
// above 2^53 (written by hand, by another tool, or restored from
// elsewhere) must not give a next token at or below it (2^53 + 1 reads
// as 2^53, and 2^53 + 1 is not a double): the grant is refused with a
// clear error instead, or its token is above the last one.
func TestAcquire_LastTokenAbove2To53_NeverReissued(t *testing.T) {
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

// TestTryAcquire_ReservedKey_ReportsReservation: while a release reserves
// the key for the waiter it woke, a TryAcquire by someone else says that
// the key is reserved, for which waiter, and for how long. Symptom:
// ErrNotAcquired naming an empty holder and no metadata ("not acquired",
// by nobody).
//
// The reservation lasts HandoffReserve (100ms) on the server's clock, and
// a TryAcquire sent later gets the key. So the test checks the
// reservation the release wrote (for the waiter queued, ending within
// 100ms of the server's time), then moves its end a minute on (the
// marker's <until ms>, nothing else): the TryAcquire that follows comes
// within the reservation however slow the machine.
func TestTryAcquire_ReservedKey_ReportsReservation(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	l1 := redislock.New(newClient(t, srv))
	px := testserver.StartProxy(t, srv.Addr())
	t.Cleanup(px.Heal)
	c2 := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { c2.Close() })
	l2 := redislock.New(c2)
	l3 := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	lk, err := l1.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		w, err := l2.Acquire(dlocktest.Context(t), key)
		if err == nil {
			err = w.Release(context.Background())
		}
		waiting <- err
	}()
	queue := l1.LockKey(key) + ":waiters"
	waitQueued(t, admin, queue, 1)
	ids, err := admin.ZRange(context.Background(), queue, 0, -1).Result()
	if err != nil || len(ids) != 1 {
		t.Fatal(ids, err)
	}
	px.Stall() // the waiter's host hangs: it does not take the key
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	ctx := dlocktest.Context(t)
	marker, err := admin.Get(ctx, l1.LockKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Split(marker, "|")
	var until int64
	if len(f) == 4 {
		until, err = strconv.ParseInt(f[3], 10, 64)
	}
	if len(f) != 4 || f[1] != strconv.FormatUint(lk.Token(), 10) || f[2] != ids[0] || err != nil {
		t.Fatalf("after the release the key holds %q, want a marker of token %d reserving it for waiter %s", marker, lk.Token(), ids[0])
	}
	if left := time.Duration(until-now.UnixMilli()) * time.Millisecond; left > redisproto.HandoffReserve {
		t.Fatalf("the reservation ends %v after the server's time, want at most %v", left, redisproto.HandoffReserve)
	}
	f[3] = strconv.FormatInt(now.Add(time.Minute).UnixMilli(), 10)
	if err := admin.SetArgs(ctx, l1.LockKey(key), strings.Join(f, "|"), redis.SetArgs{KeepTTL: true}).Err(); err != nil {
		t.Fatal(err)
	}
	_, err = l3.TryAcquire(ctx, key)
	t.Logf("TryAcquire: %v", err)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire of a reserved key = %v, want a *dlock.NotAcquiredError", err)
	}
	if len(na.Holders) != 1 {
		t.Fatalf("TryAcquire of a key reserved for waiter %s: holders %+v, want one (the reservation)", ids[0], na.Holders)
	}
	h := na.Holders[0]
	if h.Owner != "" || h.Metadata[redislock.MetaReservedForWaiter] != ids[0] {
		t.Fatalf("TryAcquire of a key reserved for waiter %s: holder %q, metadata %v", ids[0], h.Owner, h.Metadata)
	}
	if h.TTL <= 0 || h.TTL > time.Minute {
		t.Fatalf("TTL %v, want the reservation left, within (0, 1m]", h.TTL)
	}
	if msg := err.Error(); !strings.Contains(msg, "reserved it for waiter "+ids[0]) {
		t.Fatalf("message %q does not name the reservation", msg)
	}
	// The reservation is the waiter's: healed, it gets the key.
	px.Heal()
	if err := <-waiting; err != nil {
		t.Fatalf("the waiter the key was reserved for: %v", err)
	}
}

// scriptCounter counts the scripts a client runs outside pipelines.
type scriptCounter struct{ n atomic.Int32 }

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// A TryAcquire of a key another owner holds is answered by one script,
// as is an uncontended Acquire and its Release each.
// Symptom: the cheaper script for a free key handed a held key to the full one, two round trips for every refused TryAcquire.
func TestTryAcquire_HeldKey_OneScript(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	ctx := dlocktest.Context(t)
	holder := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	h, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, srv)
	hook := &scriptCounter{}
	c.AddHook(hook)
	l := redislock.New(c)
	if _, err := l.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v, want ErrNotAcquired", err)
	}
	if n := hook.n.Load(); n != 1 {
		t.Errorf("TryAcquire of a held key ran %d scripts, want 1", n)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	hook.n.Store(0)
	lk, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := hook.n.Load(); n != 2 {
		t.Errorf("an uncontended Acquire and Release ran %d scripts, want 2", n)
	}
}

// Symptom: on a user whose ACL denies scripts, every call failed with
// "NOPERM this user has no permissions to run the 'evalsha' command",
// which does not say that redislock needs scripts.
// The error says what the user must be allowed, at once for a blocking
// Acquire too, and is not a holder.
func TestAcquire_ScriptsDenied_ErrorSaysWhatToAllow(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	if _, err := srv.Do("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@scripting"); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	l := redislock.New(c)
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	for _, acquire := range []func(context.Context, string, ...dlock.Option) (*dlock.Lock, error){l.TryAcquire, l.Acquire} {
		_, err := acquire(ctx, dlocktest.Key(t))
		if err == nil || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "+@scripting") ||
			errors.Is(err, dlock.ErrNotAcquired) || ctx.Err() != nil {
			t.Fatalf("acquire without script permission: %v; want the NOPERM with what to allow, before the deadline", err)
		}
	}
}
