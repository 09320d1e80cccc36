package filelock

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

func testReq(key string, mode driver.Mode, limit int) *driver.Request {
	return &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: 10 * time.Second, Metadata: map[string]string{}, Mode: mode, Limit: limit}
}

func mustGrant(t *testing.T, b *backend, req *driver.Request) driver.Grant {
	t.Helper()
	g, err := b.Try(context.Background(), req)
	if err != nil {
		t.Fatalf("Try(%s): %v", req.Mode, err)
	}
	return g
}

func mustRefuse(t *testing.T, b *backend, req *driver.Request) *dlock.NotAcquiredError {
	t.Helper()
	_, err := b.Try(context.Background(), req)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("Try(%s) = %v, want NotAcquiredError", req.Mode, err)
	}
	return na
}

func stateOf(t *testing.T, b *backend, key string) keyState {
	t.Helper()
	r, err := readRecord(b.recordPath(fileID(key)), key)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixNano()
	s := r.state(now)
	s.withWriters(readWriters(b.writersPath(fileID(key)), key), now)
	return s
}

// A retried attempt (same owner) gets the lease it has, in every mode,
// and adds no holder.
func TestRetrySameOwner(t *testing.T) {
	b := newBackend(t, t.TempDir())
	for _, m := range []struct {
		mode  driver.Mode
		limit int
	}{{driver.Shared, 0}, {driver.Limited, 1}, {driver.Exclusive, 0}} {
		key := "k-" + m.mode.String()
		req := testReq(key, m.mode, m.limit)
		g1 := mustGrant(t, b, req)
		g2 := mustGrant(t, b, req)
		if g1.Token != g2.Token {
			t.Fatalf("%s: retry token %d, first %d", m.mode, g2.Token, g1.Token)
		}
		if s := stateOf(t, b, key); len(s.holders) != 1 || s.mode != m.mode {
			t.Fatalf("%s: state after retry %+v", m.mode, s)
		}
		if err := g1.Lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Refresh, Release and Abort act on their own holder alone, and only while
// it holds.
func TestPerHolderLeaseOps(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, t.TempDir())
	ra, rb := testReq("k", driver.Shared, 0), testReq("k", driver.Shared, 0)
	ga, gb := mustGrant(t, b, ra), mustGrant(t, b, rb)
	before := stateOf(t, b, "k")
	if err := ga.Lease.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	after := stateOf(t, b, "k")
	if after.holders[0].Expires <= before.holders[0].Expires || after.holders[1].Expires != before.holders[1].Expires {
		t.Fatalf("refresh of one reader: %+v -> %+v", before.holders, after.holders)
	}
	stranger := &lease{b: b, key: "k", owner: dlock.NewOwner()}
	if err := stranger.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("refresh by a stranger: %v", err)
	}
	if err := stranger.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("release by a stranger: %v", err)
	}
	// A release of one reader wakes the process's waiters.
	sub, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	select { // drop a poll tick that may already be there
	case <-sub.C():
	default:
	}
	if err := ga.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFire(t, sub, "a reader's release")
	if s := stateOf(t, b, "k"); len(s.holders) != 1 || s.holders[0].Owner != rb.Owner || s.mode != driver.Shared {
		t.Fatalf("after one reader's release: %+v", s)
	}
	if err := ga.Lease.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second release: %v", err)
	}
	if err := ga.Lease.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("refresh after release: %v", err)
	}
	if err := b.Abort(ctx, ra); err != nil {
		t.Fatalf("abort of a released attempt: %v", err)
	}
	if err := b.Abort(ctx, rb); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, b, "k"); len(s.holders) != 0 || s.mode != driver.Exclusive {
		t.Fatalf("after abort of the last reader: %+v", s)
	}
	if err := gb.Lease.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("refresh after abort: %v", err)
	}
}

// A waiting writer's registration: made by a refused blocking exclusive
// attempt (not by TryAcquire's, which has no Waiter), expiring one TTL
// after the attempt began, renewed only past half, keeping readers out of
// a held or free key, removed by the writer's grant or by Leave, and
// lapsing on its own when the writer stops attempting.
func TestWriterRegistration(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b := newBackend(t, dir)
	reader := mustGrant(t, b, testReq("k", driver.Shared, 0))
	mustRefuse(t, b, testReq("k", driver.Exclusive, 0)) // TryAcquire: no Waiter
	if s := stateOf(t, b, "k"); len(s.writers) != 0 {
		t.Fatalf("TryAcquire registered: %+v", s.writers)
	}
	w := testReq("k", driver.Exclusive, 0)
	w.Waiter = dlock.NewOwner()
	before := time.Now().UnixNano()
	mustRefuse(t, b, w)
	s := stateOf(t, b, "k")
	if len(s.writers) != 1 || s.writers[0].Waiter != w.Waiter || s.writers[0].Expires > time.Now().UnixNano()+int64(w.TTL) || s.writers[0].Expires < before+int64(w.TTL) {
		t.Fatalf("registration %+v, want %s expiring a TTL after the attempt", s.writers, w.Waiter)
	}
	first := s.writers[0].Expires
	// A fresh registration is not rewritten by the next attempt.
	info, err := os.Stat(b.writersPath(fileID("k")))
	if err != nil {
		t.Fatal(err)
	}
	w.Owner = dlock.NewOwner()
	mustRefuse(t, b, w)
	if info2, err := os.Stat(b.writersPath(fileID("k"))); err != nil || !os.SameFile(info, info2) {
		t.Fatalf("a fresh registration was rewritten (%v)", err)
	}
	na := mustRefuse(t, b, testReq("k", driver.Shared, 0))
	if len(na.Holders) != 2 || na.Holders[1].Owner != "" || na.Holders[1].Mode != dlock.Exclusive {
		t.Fatalf("reader's refusal names %+v, want the reader and the waiting writer", na.Holders)
	}
	// Limited requests are not affected by writer preference (they
	// conflict with the readers anyway); another writer is refused too.
	mustRefuse(t, b, testReq("k", driver.Limited, 2))
	// Free key, writer still registered: readers stay out, an exclusive
	// TryAcquire of someone else may take it.
	if err := reader.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, b, testReq("k", driver.Shared, 0))
	other := mustGrant(t, b, testReq("k", driver.Exclusive, 0))
	if s := stateOf(t, b, "k"); len(s.writers) != 1 {
		t.Fatalf("another writer's grant dropped the registration: %+v", s)
	}
	// Past half its length the registration is renewed.
	w.TTL = 2 * time.Duration(first-time.Now().UnixNano()) // remaining < TTL/2 now
	w.TTL += 10 * time.Second
	w.Owner = dlock.NewOwner()
	mustRefuse(t, b, w)
	if s := stateOf(t, b, "k"); len(s.writers) != 1 || s.writers[0].Expires <= first {
		t.Fatalf("registration not renewed: %+v (was %d)", s.writers, first)
	}
	if err := other.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The writer's own grant removes it.
	w.Owner = dlock.NewOwner()
	g := mustGrant(t, b, w)
	if s := stateOf(t, b, "k"); len(s.writers) != 0 {
		t.Fatalf("registration kept after the writer's grant: %+v", s.writers)
	}
	if err := g.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Leave removes a registration; unknown waiters and bad keys are
	// harmless.
	reader = mustGrant(t, b, testReq("k", driver.Shared, 0))
	w.Owner = dlock.NewOwner()
	mustRefuse(t, b, w)
	for _, c := range [][2]string{{"k", ""}, {"k", "nobody"}, {"", "x"}, {"bad\x00key", "x"}, {"never-locked", "x"}} {
		if err := b.Leave(ctx, c[0], c[1]); err != nil {
			t.Fatalf("Leave(%q, %q): %v", c[0], c[1], err)
		}
	}
	if s := stateOf(t, b, "k"); len(s.writers) != 1 {
		t.Fatalf("Leave of another waiter removed the registration: %+v", s.writers)
	}
	if err := b.Leave(ctx, "k", w.Waiter); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, b, "k"); len(s.writers) != 0 {
		t.Fatalf("Leave did not remove the registration: %+v", s.writers)
	}
	mustGrant(t, b, testReq("k", driver.Shared, 0))
	// A writer that stops attempting: its registration lapses one TTL
	// after its last attempt, and readers get in.
	dead := testReq("k", driver.Exclusive, 0)
	dead.Waiter, dead.TTL = dlock.NewOwner(), dlock.MinTTL
	mustRefuse(t, b, dead)
	lapse := stateOf(t, b, "k").writers[0].Expires
	for i := 0; ; i++ {
		_, err := b.Try(ctx, testReq("k", driver.Shared, 0))
		if err == nil {
			if now := time.Now().UnixNano(); now < lapse {
				t.Fatalf("reader admitted %v before the dead writer's registration lapsed", time.Duration(lapse-now))
			}
			break
		}
		if !errors.Is(err, dlock.ErrNotAcquired) || i > 10000 {
			t.Fatalf("reader after the writer died: %v (attempt %d)", err, i)
		}
		time.Sleep(time.Millisecond)
	}
	if s := stateOf(t, b, "k"); len(s.writers) != 0 {
		t.Fatalf("lapsed registration still live: %+v", s.writers)
	}
	if err := reader.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Leave removes every copy of a registration listed twice (a record edited
// by hand).
func TestLeaveDuplicateRegistration(t *testing.T) {
	b := newBackend(t, t.TempDir())
	g := mustGrant(t, b, testReq("k", driver.Shared, 0))
	exp := time.Now().Add(time.Hour).UnixNano()
	if err := writeWriters(b.writersPath(fileID("k")), "k", []writerRec{{"w", exp}, {"x", exp}, {"w", exp}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Leave(context.Background(), "k", "w"); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(t, b, "k"); len(s.writers) != 1 || s.writers[0].Waiter != "x" {
		t.Fatalf("writers after Leave: %+v", s.writers)
	}
	if err := g.Lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A writers file that cannot be decoded (torn by a power loss: it is
// written without fsync) or names another key counts as no registration;
// the next registration replaces it.
func TestJunkWritersFile(t *testing.T) {
	b := newBackend(t, t.TempDir())
	path := b.writersPath(fileID("k"))
	exp := time.Now().Add(time.Hour).UnixNano()
	for _, junk := range []string{"", "{tor", `{"key":"other","writers":[{"waiter":"w","expires_unix_nano":` + strconv.FormatInt(exp, 10) + `}]}`} {
		if err := os.WriteFile(path, []byte(junk), 0o600); err != nil {
			t.Fatal(err)
		}
		g := mustGrant(t, b, testReq("k", driver.Shared, 0))
		w := testReq("k", driver.Exclusive, 0)
		w.Waiter = dlock.NewOwner()
		mustRefuse(t, b, w)
		if s := stateOf(t, b, "k"); len(s.writers) != 1 || s.writers[0].Waiter != w.Waiter {
			t.Fatalf("after %q: writers %+v", junk, s.writers)
		}
		mustRefuse(t, b, testReq("k", driver.Shared, 0))
		if err := b.Leave(context.Background(), "k", w.Waiter); err != nil {
			t.Fatal(err)
		}
		if err := g.Lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Any record that decodes, with any request, gives a decision without a
// panic, and a stored state keeps its promises: the top-level lease
// covers every holder, and the state reads back the same.
func FuzzRecordState(f *testing.F) {
	f.Add([]byte(`{"key":"k","owner":"a","token":3,"expires_unix_nano":100,"counter":3}`), uint8(1), 2, int64(50))
	f.Add([]byte(`{"key":"k","owner":"b","token":2,"expires_unix_nano":200,"counter":2,"mode":"shared","holders":[{"owner":"a","token":1,"expires_unix_nano":100},{"owner":"b","token":2,"expires_unix_nano":200}]}`), uint8(0), 0, int64(150))
	f.Add([]byte(`{"key":"k","owner":"a","token":1,"expires_unix_nano":100,"counter":1,"mode":"limited","limit":2,"holders":[{"owner":"a","token":1,"expires_unix_nano":100}]}`), uint8(2), 3, int64(10))
	f.Add([]byte(`{"key":"k","mode":"queued","owner":"z","expires_unix_nano":9}`), uint8(2), 1, int64(1))
	f.Fuzz(func(t *testing.T, data []byte, mode uint8, limit int, now int64) {
		var r record
		if json.Unmarshal(data, &r) != nil {
			return
		}
		r.Key = "k"
		s := r.state(now)
		s.withWriters([]writerRec{{Waiter: "w", Expires: now + 1}}, now)
		req := &driver.Request{Key: "k", Owner: "o", TTL: time.Second, Metadata: map[string]string{}, Mode: driver.Mode(mode % 3), Limit: limit, Waiter: "w"}
		out, _, err := s.decide("k", req, now, now)
		if (out == refuse || out == register) != (err != nil) {
			t.Fatalf("outcome %d with error %v", out, err)
		}
		if s.foreign {
			return
		}
		r.store(&s)
		for _, h := range r.Holders {
			if h.Expires > r.Expires {
				t.Fatalf("holder %+v outlives the top-level lease %d", h, r.Expires)
			}
		}
		b, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		var back record
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		s2 := back.state(now)
		if s2.foreign || s2.mode != s.mode || s2.limit != s.limit || len(s2.holders) != len(s.holders) {
			t.Fatalf("stored %+v, read back %+v (%s)", s, s2, b)
		}
	})
}
