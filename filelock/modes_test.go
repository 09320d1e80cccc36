package filelock_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/filelock"
)

// fileRecord is a lease record as the test reads it from the file.
type fileRecord struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	Expires  int64             `json:"expires_unix_nano"`
	Metadata map[string]string `json:"metadata"`
	Counter  uint64            `json:"counter"`
	Mode     string            `json:"mode"`
	Limit    int               `json:"limit"`
	Holders  []struct {
		Owner   string `json:"owner"`
		Token   uint64 `json:"token"`
		Expires int64  `json:"expires_unix_nano"`
	} `json:"holders"`
	Writers []struct {
		Waiter  string `json:"waiter"`
		Expires int64  `json:"expires_unix_nano"`
	} `json:"writers"`
}

// readFileRecord reads key's lease record and, into Writers, its waiting
// writers' file.
func readFileRecord(t testing.TB, dir, key string) fileRecord {
	t.Helper()
	b, err := os.ReadFile(recordPath(dir, key))
	if err != nil {
		t.Fatal(err)
	}
	var r fileRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("record %s: %v", b, err)
	}
	if r.Writers != nil {
		t.Fatalf("record %s lists writers: they have a file of their own", b)
	}
	b, err = os.ReadFile(writersPath(dir, key))
	if errors.Is(err, os.ErrNotExist) {
		return r
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("writers file %s: %v", b, err)
	}
	return r
}

// writersPath is key's waiting writers' file.
func writersPath(dir, key string) string {
	return strings.TrimSuffix(recordPath(dir, key), ".lease") + ".writers"
}

// waitUntil polls cond every 5ms until it holds, failing the test after
// hang.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("hang: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitWriterRegistered waits until key's record shows n waiting writers.
func waitWriterRegistered(t testing.TB, dir, key string, n int) {
	t.Helper()
	waitUntil(t, "waiting writer not registered in the record", func() bool {
		return len(readFileRecord(t, dir, key).Writers) == n
	})
}

func tryShared(l dlock.Locker, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	return l.TryAcquire(ctx, key, append([]dlock.Option{dlock.WithShared()}, opts...)...)
}

func mustRelease(t testing.TB, lk *dlock.Lock) {
	t.Helper()
	if err := lk.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// Readers are separate leases: each its own owner and token, and one whose
// holder stops renewing expires on its own while another keeps renewing.
func TestSharedReadersExpireIndividually(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	a, b := mustNew(t, dir), mustNew(t, dir)
	crashed, err := tryShared(a, key, dlock.WithTTL(time.Second), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	alive, err := tryShared(b, key, dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer alive.Release(context.Background())
	if crashed.Owner() == alive.Owner() || crashed.Token() >= alive.Token() {
		t.Fatalf("readers share owner or token order: %s/%d, %s/%d", crashed.Owner(), crashed.Token(), alive.Owner(), alive.Token())
	}
	infos, err := a.List(ctx, key)
	if err != nil || len(infos) != 1 || infos[0].Mode != dlock.Shared || len(infos[0].Holders) != 2 {
		t.Fatalf("List = %+v, %v; want the key, shared, with 2 holders", infos, err)
	}
	for i, lk := range []*dlock.Lock{crashed, alive} {
		if h := infos[0].Holders[i]; h.Owner != lk.Owner() || h.Token != lk.Token() || h.Mode != dlock.Shared || h.TTL <= 0 || h.Metadata[dlock.MetaPID] != strconv.Itoa(os.Getpid()) {
			t.Errorf("holder %d = %+v, want owner %s token %d", i, h, lk.Owner(), lk.Token())
		}
	}
	// The crashed reader's lease ends at its own expiry, although the
	// other reader keeps renewing.
	select {
	case <-crashed.Lost():
	case <-time.After(hang):
		t.Fatal("hang: unrenewed reader never lost its lock")
	}
	waitUntil(t, "the unrenewed reader's lease still listed", func() bool {
		infos, err := a.List(ctx, key)
		return err == nil && len(infos) == 1 && len(infos[0].Holders) == 1 && infos[0].Holders[0].Owner == alive.Owner()
	})
	if err := alive.Refresh(ctx); err != nil {
		t.Fatalf("the live reader's refresh: %v", err)
	}
	if _, err := a.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("writer while a reader holds: %v", err)
	}
	mustRelease(t, alive)
	w, err := a.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("writer after the last reader left: %v", err)
	}
	defer mustRelease(t, w)
	if w.Token() <= alive.Token() {
		t.Fatalf("writer token %d not above reader token %d", w.Token(), alive.Token())
	}
}

// A blocking writer keeps new readers out until it has the key; a release
// by one reader of several does not let it in, the last one does.
func TestWriterPreference(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	l := mustNew(t, dir)
	r1, err := tryShared(l, key)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := tryShared(l, key)
	if err != nil {
		t.Fatal(err)
	}
	// TryAcquire does not register: readers keep coming.
	if _, err := mustNew(t, dir).TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("exclusive TryAcquire on a read-locked key: %v", err)
	}
	r3, err := tryShared(l, key)
	if err != nil {
		t.Fatalf("reader after a writer's TryAcquire: %v", err)
	}
	mustRelease(t, r3)
	got := make(chan *dlock.Lock, 1)
	errc := make(chan error, 1)
	go func() {
		lk, err := mustNew(t, dir).Acquire(ctx, key, dlock.WithTTL(2*time.Second))
		if err != nil {
			errc <- err
			return
		}
		got <- lk
	}()
	waitWriterRegistered(t, dir, key, 1)
	_, err = tryShared(mustNew(t, dir), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("reader while a writer waits: %v, want NotAcquiredError", err)
	}
	if n := len(na.Holders); n != 3 || na.Holders[2].Owner != "" || na.Holders[2].Mode != dlock.Exclusive || na.Holders[2].TTL <= 0 {
		t.Errorf("refusal names %+v, want the 2 readers and the waiting writer", na.Holders)
	}
	mustRelease(t, r1)
	select {
	case lk := <-got:
		t.Fatalf("writer granted while reader %s holds (token %d)", r2.Owner(), lk.Token())
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if _, err := tryShared(l, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader after one of two readers left, writer waiting: %v", err)
	}
	mustRelease(t, r2)
	var w *dlock.Lock
	select {
	case w = <-got:
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(hang):
		t.Fatal("hang: writer not granted after the readers left")
	}
	if w.Token() <= r2.Token() {
		t.Fatalf("writer token %d not above readers' %d", w.Token(), r2.Token())
	}
	if rec := readFileRecord(t, dir, key); len(rec.Writers) != 0 || rec.Mode != "" || rec.Owner != w.Owner() {
		t.Fatalf("record after the writer's grant = %+v, want the writer alone, no registration", rec)
	}
	if _, err := tryShared(l, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader while the writer holds: %v", err)
	}
	mustRelease(t, w)
	r4, err := tryShared(l, key)
	if err != nil {
		t.Fatalf("reader after the writer left: %v", err)
	}
	mustRelease(t, r4)
}

// A waiting writer that gives up (its context ends) withdraws its
// registration at once (driver.Leaver): readers need not wait for it to
// expire.
func TestWriterGivesUp(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	l := mustNew(t, dir)
	r, err := tryShared(l, key)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, r)
	wctx, cancel := context.WithCancel(dlocktest.Context(t))
	done := make(chan error, 1)
	go func() {
		_, err := mustNew(t, dir).Acquire(wctx, key, dlock.WithTTL(dlock.MaxTTL))
		done <- err
	}()
	waitWriterRegistered(t, dir, key, 1)
	if _, err := tryShared(l, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("reader while a writer waits: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("writer's Acquire = %v, want context.Canceled", err)
	}
	// The registration would last MaxTTL: it is gone by Leave.
	waitWriterRegistered(t, dir, key, 0)
	r2, err := tryShared(l, key)
	if err != nil {
		t.Fatalf("reader after the writer gave up: %v", err)
	}
	mustRelease(t, r2)
}

// A semaphore of N: N permits, each its own lease; the limit travels with
// the key; other modes and other limits are refused; an unrenewed permit
// frees at its expiry.
func TestSemaphore(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	l := mustNew(t, dir)
	p1, err := l.TryAcquire(ctx, key, dlock.WithLimit(2))
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Release(context.Background())
	p2, err := mustNew(t, dir).TryAcquire(ctx, key, dlock.WithLimit(2), dlock.WithTTL(2*time.Second), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if p2.Token() <= p1.Token() || p1.Owner() == p2.Owner() {
		t.Fatalf("permits %d/%s, %d/%s", p1.Token(), p1.Owner(), p2.Token(), p2.Owner())
	}
	infos, err := l.List(ctx, key)
	if err != nil || len(infos) != 1 || infos[0].Mode != dlock.Limited || infos[0].Limit != 2 || len(infos[0].Holders) != 2 || infos[0].Holders[1].Mode != dlock.Limited {
		t.Fatalf("List = %+v, %v; want limited, limit 2, 2 holders", infos, err)
	}
	_, err = l.TryAcquire(ctx, key, dlock.WithLimit(2))
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) || len(na.Holders) != 2 {
		t.Fatalf("third of 2 permits: %v, want NotAcquiredError naming 2 holders", err)
	}
	_, err = l.TryAcquire(ctx, key, dlock.WithLimit(3))
	if !errors.Is(err, dlock.ErrLimitMismatch) || errors.Is(err, dlock.ErrNotAcquired) || !strings.Contains(err.Error(), "2") || !strings.Contains(err.Error(), "3") {
		t.Fatalf("WithLimit(3) on a semaphore of 2: %v, want ErrLimitMismatch naming both", err)
	}
	if _, err := l.Acquire(ctx, key, dlock.WithLimit(5)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("blocking WithLimit(5) on a semaphore of 2: %v, want ErrLimitMismatch at once", err)
	}
	for _, opts := range [][]dlock.Option{nil, {dlock.WithShared()}} {
		if _, err := l.TryAcquire(ctx, key, opts...); !errors.As(err, &na) || len(na.Holders) != 2 {
			t.Fatalf("another mode on a held semaphore: %v", err)
		}
	}
	// p2 is not renewed: its permit frees at its expiry and a blocking
	// Acquire gets it.
	p3, err := l.Acquire(ctx, key, dlock.WithLimit(2))
	if err != nil {
		t.Fatalf("permit after another expired: %v", err)
	}
	defer mustRelease(t, p3)
	select {
	case <-p2.Lost():
	default:
		t.Fatal("a third permit was granted while the second's holder still holds it")
	}
	if p3.Token() <= p2.Token() {
		t.Fatalf("token %d after %d", p3.Token(), p2.Token())
	}
	if err := p2.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("release of the expired permit: %v", err)
	}
	mustRelease(t, p1)
	mustRelease(t, p3)
	// Free again: a new limit may be set.
	p4, err := l.TryAcquire(ctx, key, dlock.WithLimit(1))
	if err != nil {
		t.Fatalf("permit of a new limit on a free key: %v", err)
	}
	mustRelease(t, p4)
}

// Every grant, in every mode, takes the next value of the one counter.
func TestTokensAcrossModes(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	l := mustNew(t, dir)
	var last uint64
	for i, opts := range [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(3)}, nil, {dlock.WithLimit(1)}, {dlock.WithShared()}, nil} {
		lk, err := l.TryAcquire(ctx, key, opts...)
		if err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
		if lk.Token() != last+1 {
			t.Fatalf("grant %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		mustRelease(t, lk)
	}
	l2 := mustNew(t, dir)
	if lk, err := l2.TryAcquire(ctx, key); err != nil || lk.Token() != last+1 {
		t.Fatalf("after a restart: %v", err)
	} else {
		mustRelease(t, lk)
	}
	if rec := readFileRecord(t, dir, key); rec.Counter != last+1 {
		t.Fatalf("counter %d, want %d", rec.Counter, last+1)
	}
}

// Records of earlier versions (the top-level lease alone) are read as an
// exclusive holder; shared and limited records keep the top-level lease
// covering every holder, which is all an earlier version reads; exclusive
// records are written as before.
func TestRecordCompatibility(t *testing.T) {
	ctx := dlocktest.Context(t)
	t.Run("OldExclusiveRecord", func(t *testing.T) {
		dir := t.TempDir()
		key := dlocktest.Key(t)
		exp := time.Now().Add(time.Hour).UnixNano()
		old := `{"key":` + strconv.Quote(key) + `,"owner":"0123456789abcdef0123456789abcdef","token":7,"expires_unix_nano":` + strconv.FormatInt(exp, 10) + `,"metadata":{"pid":"1"},"counter":7}`
		if err := os.WriteFile(recordPath(dir, key), []byte(old), 0o600); err != nil {
			t.Fatal(err)
		}
		l := mustNew(t, dir)
		for _, opts := range [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(2)}} {
			_, err := l.TryAcquire(ctx, key, opts...)
			var na *dlock.NotAcquiredError
			if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Token != 7 || na.Holders[0].Mode != dlock.Exclusive {
				t.Fatalf("TryAcquire(%d opts) on an old record: %v", len(opts), err)
			}
		}
		infos, err := l.List(ctx, "")
		if err != nil || len(infos) != 1 || infos[0].Mode != dlock.Exclusive || infos[0].Holders[0].Owner != "0123456789abcdef0123456789abcdef" {
			t.Fatalf("List = %+v, %v", infos, err)
		}
		if err := l.Expire(key); err != nil {
			t.Fatal(err)
		}
		lk, err := l.TryAcquire(ctx, key, dlock.WithShared())
		if err != nil || lk.Token() != 8 {
			t.Fatalf("after the old lease expired: %v", err)
		}
		mustRelease(t, lk)
	})
	t.Run("CoverForOldReaders", func(t *testing.T) {
		dir := t.TempDir()
		key := dlocktest.Key(t)
		l := mustNew(t, dir)
		short, err := tryShared(l, key, dlock.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		long, err := tryShared(l, key, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		// What an earlier version reads: the top-level lease, held by the
		// reader whose lease ends last, until the last lease ends.
		rec := readFileRecord(t, dir, key)
		if rec.Mode != "shared" || len(rec.Holders) != 2 || rec.Owner != long.Owner() || rec.Token != long.Token() {
			t.Fatalf("record %+v: want mode shared, 2 holders, top-level lease = the longest", rec)
		}
		for _, h := range rec.Holders {
			if h.Expires > rec.Expires {
				t.Fatalf("holder %+v outlives the top-level lease %d", h, rec.Expires)
			}
		}
		mustRelease(t, long)
		rec = readFileRecord(t, dir, key)
		if rec.Owner != short.Owner() || len(rec.Holders) != 1 || rec.Expires != rec.Holders[0].Expires {
			t.Fatalf("record after the longest reader left: %+v, want the other as top-level lease", rec)
		}
		mustRelease(t, short)
		rec = readFileRecord(t, dir, key)
		if rec.Owner != "" || rec.Mode != "" || len(rec.Holders) != 0 || rec.Counter != long.Token() {
			t.Fatalf("record after both left: %+v", rec)
		}
		// An exclusive holder is written as earlier versions wrote it.
		w, err := l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer mustRelease(t, w)
		b, err := os.ReadFile(recordPath(dir, key))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"mode", "limit", "holders", "writers"} {
			if _, ok := m[f]; ok {
				t.Errorf("exclusive record has %q: %s", f, b)
			}
		}
		if m["owner"] != w.Owner() {
			t.Errorf("exclusive record %s, want owner %s", b, w.Owner())
		}
	})
	t.Run("ForeignRecord", func(t *testing.T) {
		// A record of a mode this version does not know (a newer
		// version's) is held by its top-level lease until that expires,
		// and is not rewritten before.
		dir := t.TempDir()
		key := dlocktest.Key(t)
		exp := time.Now().Add(2 * time.Second).UnixNano()
		rec := `{"key":` + strconv.Quote(key) + `,"owner":"fedcba9876543210fedcba9876543210","token":41,"expires_unix_nano":` + strconv.FormatInt(exp, 10) + `,"counter":41,"mode":"queued","holders":[{"owner":"x","token":40,"expires_unix_nano":1}]}`
		if err := os.WriteFile(recordPath(dir, key), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
		l := mustNew(t, dir)
		for _, opts := range [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(2)}} {
			_, err := l.TryAcquire(ctx, key, opts...)
			var na *dlock.NotAcquiredError
			if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Token != 41 {
				t.Fatalf("TryAcquire(%d opts) on a foreign record: %v", len(opts), err)
			}
		}
		if b, _ := os.ReadFile(recordPath(dir, key)); string(b) != rec {
			t.Fatalf("foreign record rewritten while held: %s", b)
		}
		if infos, err := l.List(ctx, ""); err != nil || len(infos) != 1 || infos[0].Holders[0].Token != 41 {
			t.Fatalf("List = %+v, %v", infos, err)
		}
		lk, err := l.Acquire(ctx, key, dlock.WithShared())
		if err != nil {
			t.Fatalf("after the foreign lease expired: %v", err)
		}
		if lk.Token() != 42 {
			t.Fatalf("token %d, want 42", lk.Token())
		}
		mustRelease(t, lk)
	})
}

// Records that decode but make no sense are never read as free while their
// top-level lease is live, and never make an operation panic.
func TestOddRecords(t *testing.T) {
	ctx := dlocktest.Context(t)
	exp := strconv.FormatInt(time.Now().Add(time.Hour).UnixNano(), 10)
	for name, body := range map[string]string{
		"limited-without-limit": `"mode":"limited","holders":[{"owner":"a","token":1,"expires_unix_nano":` + exp + `}]`,
		"limit-too-big":         `"mode":"limited","limit":99999999999,"holders":[{"owner":"a","token":1,"expires_unix_nano":` + exp + `}]`,
		"shared-no-holders":     `"mode":"shared"`,
		"holder-without-owner":  `"mode":"shared","holders":[{"token":1,"expires_unix_nano":` + exp + `}]`,
		"owner-twice":           `"mode":"shared","holders":[{"owner":"a","token":1,"expires_unix_nano":1},{"owner":"a","token":2,"expires_unix_nano":1}]`,
		"holders-without-mode":  `"holders":[{"owner":"a","token":1,"expires_unix_nano":` + exp + `}]`,
		"writers-junk":          `"mode":"shared","holders":[{"owner":"a","token":1,"expires_unix_nano":` + exp + `}],"writers":[{"waiter":""},{"waiter":"w","expires_unix_nano":-5}]`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			key := "k"
			rec := `{"key":"k","owner":"cover","token":1,"expires_unix_nano":` + exp + `,"counter":1,` + body + `}`
			if err := os.WriteFile(recordPath(dir, key), []byte(rec), 0o600); err != nil {
				t.Fatal(err)
			}
			l := mustNew(t, dir)
			for _, opts := range [][]dlock.Option{nil, {dlock.WithLimit(1)}} {
				if _, err := l.TryAcquire(ctx, key, opts...); !errors.Is(err, dlock.ErrNotAcquired) {
					t.Fatalf("TryAcquire: %v, want ErrNotAcquired (the top-level lease is live)", err)
				}
			}
			if _, err := l.List(ctx, ""); err != nil {
				t.Fatal(err)
			}
			if err := l.Expire(key); err != nil {
				t.Fatal(err)
			}
			lk, err := l.TryAcquire(ctx, key)
			if err != nil || lk.Token() < 2 {
				t.Fatalf("after Expire: %v", err)
			}
			mustRelease(t, lk)
		})
	}
}

var _ dlock.Lister = (*filelock.Locker)(nil)

// A process of an earlier version rewrites the record with the fields it
// knows only (here: the renewal of its exclusive lease): a waiting
// writer's registration, in a file of its own, is untouched.
func TestOldVersionWriteKeepsRegistration(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	l := mustNew(t, dir)
	holder, err := l.TryAcquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(dlocktest.Context(t))
	done := make(chan error, 1)
	go func() {
		_, err := mustNew(t, dir).Acquire(ctx, key)
		done <- err
	}()
	waitWriterRegistered(t, dir, key, 1)
	reg := readFileRecord(t, dir, key).Writers[0]
	// The earlier version's write: decode into its struct, re-encode,
	// replace the record whole.
	var old struct {
		Key      string            `json:"key"`
		Owner    string            `json:"owner,omitempty"`
		Token    uint64            `json:"token,omitempty"`
		Expires  int64             `json:"expires_unix_nano,omitempty"`
		Metadata map[string]string `json:"metadata,omitempty"`
		Counter  uint64            `json:"counter"`
	}
	b, err := os.ReadFile(recordPath(dir, key))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	old.Expires = time.Now().Add(time.Minute).UnixNano()
	if b, err = json.Marshal(&old); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(recordPath(dir, key)+".old", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(recordPath(dir, key)+".old", recordPath(dir, key)); err != nil {
		t.Fatal(err)
	}
	if rec := readFileRecord(t, dir, key); len(rec.Writers) != 1 || rec.Writers[0].Waiter != reg.Waiter || rec.Owner != holder.Owner() {
		t.Fatalf("after the old version's write: %+v, want its holder and the registration", rec)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("writer: %v", err)
	}
	// The engine's Leave runs in the background: wait for it, so that it
	// does not write into the directory while the test removes it.
	waitWriterRegistered(t, dir, key, 0)
	if _, err := os.Stat(writersPath(dir, key)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("writers file left with no registration: %v", err)
	}
	mustRelease(t, holder)
}
