package filelock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption, never a panic.
// Symptom: List, Guard.Do and Guard.Highest panicked on a nil context.
func TestNilContext_IsAnErrorNotAPanic(t *testing.T) {
	l, err := filelock.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lk, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	g := mustGuard(t, t.TempDir())
	var nilCtx context.Context
	f := lk.Fence()
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, "x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, "x"); return err }},
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"Guard.Do", func() error { return g.Do(nilCtx, "r", f, fn) }},
		{"Guard.Highest", func() error { _, err := g.Highest(nilCtx, "r"); return err }},
		{"Guard.Put", func() error { return g.Put(nilCtx, "r", f, "n", "v") }},
		{"Guard.Get", func() error { _, _, err := g.Get(nilCtx, "r", f, "n"); return err }},
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("PANIC: %v", r)
				}
			}()
			return c.fn()
		}()
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", c.name, err)
		}
	}
	if ran {
		t.Error("Guard.Do(nil ctx) ran its function")
	}
	if hi, err := g.Highest(context.Background(), "r"); err != nil || hi != (dlock.Fence{}) {
		t.Errorf("after Guard.Do(nil ctx): Highest = %+v, %v; want no fence recorded", hi, err)
	}
}

// Every call of a nil *Locker is an error wrapping dlock.ErrNilClient.
// Symptom: Acquire and TryAcquire of a nil *Locker panicked.
func TestNilLocker_EveryCallIsErrNilClient(t *testing.T) {
	dlocktest.TestNilLocker(t, (*filelock.Locker)(nil))
	var l *filelock.Locker
	if err := l.Expire("k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("nil Locker's Expire = %v, want an error wrapping dlock.ErrNilClient", err)
	}
	// Symptom: the zero Locker's Expire wrote a flock file into the working directory.
	if err := new(filelock.Locker).Expire("k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("zero Locker's Expire = %v, want an error wrapping dlock.ErrNilClient", err)
	}
	if d := l.Dir(); d != "" {
		t.Errorf("nil Locker's Dir = %q, want \"\"", d)
	}
}

// Another backend's option is refused, not silently ignored.
// Symptom: etcdlock.New(c, zklock.WithPrefix("/app")) locked without the prefix.
func TestNew_RefusesAnotherBackendsOption(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	_, err := filelock.New(dir, dlocktest.ForeignOption())
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "dlocktest option") {
		t.Fatalf("filelock.New with another package's option = %v, want an error wrapping dlock.ErrInvalidOption naming the dlocktest option", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused filelock.New created its directory: %v", err)
	}
}
