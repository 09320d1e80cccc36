package filelock_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// hang bounds every wait; exceeding it is a hang, not slowness.
const hang = 60 * time.Second

func mustNew(t testing.TB, dir string, opts ...filelock.Option) *filelock.Locker {
	t.Helper()
	l, err := filelock.New(dir, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", dir, err)
	}
	return l
}

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	ops := mustNew(t, dir)
	dlocktest.TestLocker(t, dlocktest.Harness{
		New: func(t testing.TB) dlock.Locker { return mustNew(t, dir) },
		Expire: func(t testing.TB, key string) {
			if err := ops.Expire(key); err != nil {
				t.Fatalf("Expire(%q): %v", key, err)
			}
		},
		// A lock held past breakListenDelay watches its record.
		NoticesDeletion: true,
		TellsBroken:     true,
		// No network: the fault section's "server" is the record lock,
		// held by a stopped process.
		Faults: &dlocktest.Faults{
			Pause: func(t testing.TB, keys ...string) func() { return pauseKeys(t, dir, keys...) },
		},
	})
}

// The conformance suite again with inotify off and a short poll: waiters
// are woken in-process or by polling only.
func TestConformanceWithoutInotify(t *testing.T) {
	dir := t.TempDir()
	ops := mustNew(t, dir)
	dlocktest.TestLocker(t, dlocktest.Harness{
		New: func(t testing.TB) dlock.Locker {
			return mustNew(t, dir, filelock.WithInotify(false), filelock.WithPollInterval(20*time.Millisecond))
		},
		Expire: func(t testing.TB, key string) {
			if err := ops.Expire(key); err != nil {
				t.Fatalf("Expire(%q): %v", key, err)
			}
		},
		Contenders:  8,
		TellsBroken: true, // through this process's wake-ups, without inotify
	})
}

func TestTokenSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 3; i++ {
		l := mustNew(t, dir) // a fresh Locker each round, as after a restart
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("round %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	// Expire keeps the counter too.
	l := mustNew(t, dir)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Expire(key); err != nil {
		t.Fatal(err)
	}
	lk2, err := mustNew(t, dir).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("key not free after Expire: %v", err)
	}
	if lk2.Token() <= lk.Token() || lk.Token() <= last {
		t.Fatalf("tokens %d, %d after %d", lk.Token(), lk2.Token(), last)
	}
	if err := lk2.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(dlocktest.Context(t)); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release after Expire = %v, want ErrLockLost", err)
	}
}

func TestList(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t, dir)
	ctx := dlocktest.Context(t)
	var held []*dlock.Lock
	for _, k := range []string{"jobs/b", "jobs/a", "other"} {
		lk, err := l.Acquire(ctx, k, dlock.WithMetadata("job", k))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}
	infos, err := mustNew(t, dir).List(ctx, "jobs/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Key != "jobs/a" || infos[1].Key != "jobs/b" {
		t.Fatalf("List(jobs/) = %+v", infos)
	}
	for i, in := range infos {
		lk := held[1-i]
		if len(in.Holders) != 1 {
			t.Fatalf("%s: holders %+v", in.Key, in.Holders)
		}
		h := in.Holders[0]
		if h.Owner != lk.Owner() || h.Token != lk.Token() || h.TTL <= 0 || h.TTL > dlock.DefaultTTL {
			t.Errorf("info %+v does not match lock owner %s token %d", in, lk.Owner(), lk.Token())
		}
		if h.Metadata["job"] != in.Key || h.Metadata[dlock.MetaPID] != strconv.Itoa(os.Getpid()) {
			t.Errorf("metadata %v", h.Metadata)
		}
	}
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Expire("other"); err != nil {
		t.Fatal(err)
	}
	infos, err = l.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Key != "jobs/a" {
		t.Fatalf("List after release and expire = %+v", infos)
	}
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	held[2].Release(ctx) // lost by Expire
	if infos, err := l.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Fatalf("List after all released = %+v, %v", infos, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.List(cctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("List with cancelled context = %v", err)
	}
}

func TestTryAcquireHeldReportsHolder(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	lk, err := mustNew(t, dir).Acquire(dlocktest.Context(t), key, dlock.WithMetadata("job", "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	_, err = mustNew(t, dir).TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire = %v", err)
	}
	if h := na.Holders[0]; na.Key != key || h.Owner != lk.Owner() || h.Metadata["job"] != "x" || h.TTL <= 0 || h.TTL > dlock.DefaultTTL {
		t.Fatalf("NotAcquiredError = %+v", na)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := filelock.New(""); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf(`New("") = %v, want ErrInvalidOption`, err)
	}
	if _, err := filelock.NewGuard(""); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf(`NewGuard("") = %v, want ErrInvalidOption`, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{file, filepath.Join(file, "sub")} {
		if _, err := filelock.New(p); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("New(%q) = %v, want ErrInvalidOption", p, err)
		}
		if _, err := filelock.NewGuard(p); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("NewGuard(%q) = %v, want ErrInvalidOption", p, err)
		}
	}
	for _, d := range []time.Duration{0, -time.Second, time.Microsecond} {
		if _, err := filelock.New(t.TempDir(), filelock.WithPollInterval(d)); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("WithPollInterval(%v): %v, want ErrInvalidOption", d, err)
		}
	}
	if _, err := filelock.New(t.TempDir(), nil); err != nil {
		t.Errorf("nil option: %v", err)
	}
	// A missing directory is created, private.
	nested := filepath.Join(t.TempDir(), "a", "b")
	l := mustNew(t, nested)
	if fi, err := os.Stat(nested); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("created %q: %v, %v", nested, fi, err)
	}
	if err := l.Expire(""); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf(`Expire("") = %v, want ErrInvalidKey`, err)
	}
	if err := l.Expire("never-locked"); err != nil {
		t.Errorf("Expire of a free key = %v", err)
	}
	// Relative paths work and name the same directory.
	wd := t.TempDir()
	t.Chdir(wd)
	rel := mustNew(t, "locks")
	if want, _ := filepath.EvalSymlinks(filepath.Join(wd, "locks")); rel.Dir() != want {
		t.Errorf("Dir() = %q, want %q", rel.Dir(), want)
	}
}

func TestNotWritable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root can write anywhere")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	if _, err := filelock.New(dir); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("New(read-only dir) = %v, want ErrInvalidOption", err)
	}
}

// recordPath is the documented location of key's lease record.
func recordPath(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".lease")
}

// flockPath is the file whose flock(2) serializes updates of key's record.
func flockPath(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".flock")
}

func TestCorruptRecordRefused(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t, dir)
	key := dlocktest.Key(t)
	if err := os.WriteFile(recordPath(dir, key), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := l.TryAcquire(dlocktest.Context(t), key)
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a corrupt record = %v, want a storage error", err)
	}
	if infos, err := l.List(dlocktest.Context(t), ""); err != nil || len(infos) != 0 {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	// Removing the record resets the key.
	if err := os.Remove(recordPath(dir, key)); err != nil {
		t.Fatal(err)
	}
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(dlocktest.Context(t))
}

func TestRecordLayout(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	l := mustNew(t, dir)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(recordPath(dir, key))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"key":"` + key + `","counter":` + strconv.FormatUint(lk.Token(), 10) + `}`
	if string(b) != want {
		t.Fatalf("released record = %s, want %s", b, want)
	}
	if _, err := os.Stat(recordPath(dir, key) + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp file left behind: %v", err)
	}
}

// Waiters on one key, spread over Lockers, all get it in turn.
func TestManyWaiters(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	holder, err := mustNew(t, dir).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := mustNew(t, dir).Acquire(dlocktest.Context(t), key)
			if err != nil {
				errs <- err
				return
			}
			errs <- lk.Release(context.Background())
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
