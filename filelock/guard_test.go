package filelock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
)

var (
	_ guard.Guard = (*filelock.Guard)(nil)
	_ guard.Doer  = (*filelock.Guard)(nil)
)

func mustGuard(t testing.TB, dir string, opts ...filelock.Option) *filelock.Guard {
	t.Helper()
	g, err := filelock.NewGuard(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// do runs g.Do with a function that records that it ran.
func do(t *testing.T, g *filelock.Guard, res string, f dlock.Fence) (ran bool, err error) {
	t.Helper()
	err = g.Do(dlocktest.Context(t), res, f, func(context.Context) error { ran = true; return nil })
	if ran && err != nil {
		t.Fatalf("fn ran but Do returned %v", err)
	}
	return ran, err
}

func wantStale(t *testing.T, g *filelock.Guard, res string, f dlock.Fence, highest uint64) {
	t.Helper()
	ran, err := do(t, g, res, f)
	if ran || !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("Do(%+v): ran=%v err=%v, want ErrStaleToken", f, ran, err)
	}
	var st *dlock.StaleTokenError
	if !errors.As(err, &st) || st.Resource != res || st.Token != f.Token || st.Owner != f.Owner || st.Highest != highest {
		t.Fatalf("error %#v, want StaleTokenError{%q, %d, %q, highest %d}", err, res, f.Token, f.Owner, highest)
	}
}

func wantAdmitted(t *testing.T, g *filelock.Guard, res string, f dlock.Fence) {
	t.Helper()
	if ran, err := do(t, g, res, f); !ran || err != nil {
		t.Fatalf("Do(%+v): ran=%v err=%v, want admitted", f, ran, err)
	}
}

func TestGuard(t *testing.T) {
	dir := t.TempDir()
	g := mustGuard(t, dir)
	const res = "db/table"
	a5 := dlock.Fence{Token: 5, Owner: "a"}

	wantStale(t, g, res, dlock.Fence{}, 0) // token 0 is never admitted
	wantAdmitted(t, g, res, a5)
	wantStale(t, g, res, dlock.Fence{Token: 4, Owner: "b"}, 5)     // older token
	wantAdmitted(t, g, res, a5)                                    // same token, same owner
	wantStale(t, g, res, dlock.Fence{Token: 5, Owner: "b"}, 5)     // same token, other owner
	wantStale(t, g, res, dlock.Fence{Token: 5, Owner: ""}, 5)      // same token, no owner
	wantAdmitted(t, g, "other", dlock.Fence{Token: 1, Owner: "x"}) // resources are independent

	// A fenced read by a newer holder advances the fence: the older
	// holder's later write is refused.
	wantAdmitted(t, g, res, dlock.Fence{Token: 6, Owner: "c"})
	wantStale(t, g, res, a5, 6)

	// A second guard on the same directory (another process, or after a
	// restart) shares the state.
	g2 := mustGuard(t, dir)
	if hi, err := g2.Highest(dlocktest.Context(t), res); err != nil || hi != (dlock.Fence{Token: 6, Owner: "c"}) {
		t.Fatalf("Highest = %+v, %v", hi, err)
	}
	wantStale(t, g2, res, a5, 6)
	wantAdmitted(t, g2, res, dlock.Fence{Token: 9, Owner: "d"})
	wantStale(t, g, res, dlock.Fence{Token: 8, Owner: "e"}, 9)

	// fn's error is returned as is; the fence stays recorded.
	boom := errors.New("boom")
	if err := g.Do(dlocktest.Context(t), res, dlock.Fence{Token: 10, Owner: "f"}, func(context.Context) error { return boom }); err != boom {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if hi, err := g2.Highest(dlocktest.Context(t), res); err != nil || hi.Token != 10 {
		t.Fatalf("Highest after failed fn = %+v, %v", hi, err)
	}
	if hi, err := g.Highest(dlocktest.Context(t), "never-used"); err != nil || hi != (dlock.Fence{}) {
		t.Fatalf("Highest of unused resource = %+v, %v", hi, err)
	}
}

// A Do waiting behind a long one, through either of two guards on one
// directory, gives up when its context ends. (That Do calls never overlap,
// across instances, is guardtest's Doer section, run by TestGuardSuite.)
func TestGuardDoHonoursContext(t *testing.T) {
	dir := t.TempDir()
	guards := []*filelock.Guard{mustGuard(t, dir), mustGuard(t, dir)}
	entered, leave := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- guards[0].Do(dlocktest.Context(t), "r", dlock.Fence{Token: 1000, Owner: "long"}, func(context.Context) error {
			close(entered)
			<-leave
			return nil
		})
	}()
	<-entered
	for _, g := range guards {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := g.Do(ctx, "r", dlock.Fence{Token: 1001, Owner: "next"}, func(context.Context) error { return nil })
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Do behind a running Do = %v, want DeadlineExceeded", err)
		}
	}
	close(leave)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := guards[1].Do(cctx, "r", dlock.Fence{Token: 2000, Owner: "x"}, func(context.Context) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with cancelled context = %v", err)
	}
	if _, err := guards[1].Highest(cctx, "r"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Highest with cancelled context = %v", err)
	}
}

// A lock's fence through the file guard: after the key changes hands, the
// old holder is refused.
func TestGuardWithLocks(t *testing.T) {
	dir := t.TempDir()
	l, g := mustNew(t, dir), mustGuard(t, dir)
	old, err := l.Acquire(dlocktest.Context(t), "job", dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	wantAdmitted(t, g, "out", old.Fence())
	if err := l.Expire("job"); err != nil {
		t.Fatal(err)
	}
	lk, err := mustNew(t, dir).Acquire(dlocktest.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	wantAdmitted(t, g, "out", lk.Fence())
	wantStale(t, g, "out", old.Fence(), lk.Token())
	old.Release(context.Background())
}

// The guard suite, on a fresh directory per guard, and with second
// instances on the first one's directory (another process, a restart).
func TestGuardSuite(t *testing.T) {
	newGuard := func(t *testing.T, opts ...driver.Option) guard.Guard { return mustGuard(t, t.TempDir(), opts...) }
	t.Run("OneInstance", func(t *testing.T) { guardtest.Run(t, newGuard) })
	t.Run("Shared", func(t *testing.T) {
		guardtest.Run(t, newGuard, guardtest.Shared(func(t *testing.T, g guard.Guard, opts ...driver.Option) guard.Guard {
			return mustGuard(t, g.(*filelock.Guard).Dir(), opts...)
		}))
	})
}

// Put's values are files of their own, durable and checked on read: a
// value file that belongs to another resource or name, or cannot be
// decoded, is an error naming the file, not a missing or wrong value.
func TestGuardValueFiles(t *testing.T) {
	dir := t.TempDir()
	g := mustGuard(t, dir)
	f := dlock.Fence{Token: 1, Owner: "a"}
	if err := g.Put(dlocktest.Context(t), "r", f, "n", "v"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(dlocktest.Context(t), "r", f, "m", "w"); err != nil {
		t.Fatal(err)
	}
	data, err := filepath.Glob(filepath.Join(dir, "*.data"))
	if err != nil || len(data) != 2 {
		t.Fatalf("value files %v, %v; want 2", data, err)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(tmp) != 0 {
		t.Fatalf("temp files left: %v", tmp)
	}
	// Swap the two files: each now names the other's name.
	a, _ := os.ReadFile(data[0])
	b, _ := os.ReadFile(data[1])
	if err := os.WriteFile(data[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data[1], a, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n", "m"} {
		if v, ok, err := g.Get(dlocktest.Context(t), "r", f, n); err == nil || !strings.Contains(err.Error(), ".data") {
			t.Errorf("Get(%q) of a swapped file = %q, %v, %v; want an error naming the file", n, v, ok, err)
		}
	}
	if err := os.WriteFile(data[0], []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data[1], []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n", "m"} {
		if v, ok, err := g.Get(dlocktest.Context(t), "r", f, n); err == nil || !strings.Contains(err.Error(), ".data") {
			t.Errorf("Get(%q) of an undecodable file = %q, %v, %v; want an error naming the file", n, v, ok, err)
		}
	}
	// Put replaces a bad file whole.
	if err := g.Put(dlocktest.Context(t), "r", f, "n", "again"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(dlocktest.Context(t), "r", f, "m", "again"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n", "m"} {
		if v, ok, err := g.Get(dlocktest.Context(t), "r", f, n); err != nil || !ok || v != "again" {
			t.Errorf("Get(%q) after Put repaired the file = %q, %v, %v", n, v, ok, err)
		}
	}
}
