package filelock_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

// Environment of helper processes.
const (
	envMode  = "FILELOCK_TEST_HELPER"   // "increment" or "hold"
	envDir   = "FILELOCK_TEST_DIR"      // lock (and guard) directory
	envData  = "FILELOCK_TEST_DATA"     // increment: directory of the counter files
	envN     = "FILELOCK_TEST_N"        // increment: number of increments
	envKey   = "FILELOCK_TEST_KEY"      // hold: key
	envTTL   = "FILELOCK_TEST_TTL"      // hold: TTL
	envHold  = "FILELOCK_TEST_HOLD"     // hold: "renew" (auto-refresh, then sleep) or "exit" (no refresh, exit at once)
	envKeys  = "FILELOCK_TEST_KEYS"     // flock: JSON list of keys whose record locks to hold
	envMode2 = "FILELOCK_TEST_LOCKMODE" // hold: "shared" for a read lock (default exclusive)
)

// TestHelperProcess is not a test: it is the body of the child processes
// started by the cross-process tests.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envMode)
	if mode == "" {
		t.Skip("helper process only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	switch mode {
	case "increment":
		err = helperIncrement(ctx)
	case "hold":
		err = helperHold(ctx)
	case "flock":
		err = helperFlock(ctx)
	case "wait":
		err = helperWait(ctx)
	case "break":
		err = helperBreak(ctx)
	case "mix":
		err = helperModesMix(ctx)
	case "readers":
		err = helperOverlappingReaders(ctx)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func readCounter(path string) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// slowIncrement reads the counter, sleeps 1ms and writes it back: without
// exclusion, concurrent increments are lost.
func slowIncrement(path string) error {
	c, err := readCounter(path)
	if err != nil {
		return err
	}
	time.Sleep(time.Millisecond)
	return os.WriteFile(path, []byte(strconv.Itoa(c+1)), 0o600)
}

// helperIncrement increments three counters n times under the lock: one
// directly (the lock's exclusion alone protects it), one through the file
// guard's Do with the lock's fence, and one kept by the guard (Get, Put).
// It prints each token.
func helperIncrement(ctx context.Context) error {
	dir, data := os.Getenv(envDir), os.Getenv(envData)
	n, err := strconv.Atoi(os.Getenv(envN))
	if err != nil {
		return err
	}
	l, err := filelock.New(dir)
	if err != nil {
		return err
	}
	g, err := filelock.NewGuard(dir)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		lk, err := l.Acquire(ctx, "counter", dlock.WithTTL(10*time.Second))
		if err != nil {
			return err
		}
		err = slowIncrement(filepath.Join(data, "plain"))
		if err == nil {
			err = g.Do(ctx, "fenced", lk.Fence(), func(context.Context) error {
				return slowIncrement(filepath.Join(data, "fenced"))
			})
		}
		if err == nil {
			err = guardIncrement(ctx, g, lk.Fence())
		}
		fmt.Printf("token %d\n", lk.Token())
		if rerr := lk.Release(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// guardIncrement increments the counter kept by the guard itself (name
// "count" of resource "kept"), a fenced read then a fenced write.
func guardIncrement(ctx context.Context, g *filelock.Guard, f dlock.Fence) error {
	v, ok, err := g.Get(ctx, "kept", f, "count")
	if err != nil {
		return err
	}
	c := 0
	if ok {
		if c, err = strconv.Atoi(v); err != nil {
			return err
		}
	}
	time.Sleep(time.Millisecond)
	return g.Put(ctx, "kept", f, "count", strconv.Itoa(c+1))
}

// helperHold acquires a key, prints "held <token> <owner>" and then either
// keeps renewing it until killed or exits without releasing it.
func helperHold(ctx context.Context) error {
	l, err := filelock.New(os.Getenv(envDir))
	if err != nil {
		return err
	}
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	renew := os.Getenv(envHold) == "renew"
	opts := []dlock.Option{dlock.WithTTL(ttl), dlock.WithAutoRefresh(renew)}
	if os.Getenv(envMode2) == "shared" {
		opts = append(opts, dlock.WithShared())
	}
	lk, err := l.Acquire(ctx, os.Getenv(envKey), opts...)
	if err != nil {
		return err
	}
	fmt.Printf("held %d %s\n", lk.Token(), lk.Owner())
	if !renew {
		os.Exit(0) // abandon the lease: no release, no cleanup
	}
	select {
	case <-lk.Lost():
		return fmt.Errorf("lost the lock while holding it: %v", lk.Err())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// helperWait blocks in an exclusive Acquire of a key (a waiting writer)
// until it gets it, prints "held <token>" and waits to be killed.
func helperWait(ctx context.Context) error {
	l, err := filelock.New(os.Getenv(envDir))
	if err != nil {
		return err
	}
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return err
	}
	lk, err := l.Acquire(ctx, os.Getenv(envKey), dlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	fmt.Printf("held %d\n", lk.Token())
	<-ctx.Done()
	return ctx.Err()
}

// helperBreak breaks a key (every holder) and prints "broken <n>", the
// number of holders it removed.
func helperBreak(ctx context.Context) error {
	l, err := filelock.New(os.Getenv(envDir))
	if err != nil {
		return err
	}
	b, err := dlock.Break(ctx, l, os.Getenv(envKey), "")
	if err != nil {
		return err
	}
	fmt.Printf("broken %d\n", len(b.Holders))
	return nil
}

// helperFlock takes the record locks (flock(2)) of the keys in envKeys,
// prints "locked" and waits to be stopped and killed: a process frozen in
// the middle of an update, the file backend's hung server.
func helperFlock(ctx context.Context) error {
	var keys []string
	if err := json.Unmarshal([]byte(os.Getenv(envKeys)), &keys); err != nil {
		return err
	}
	for _, k := range keys {
		f, err := os.OpenFile(flockPath(os.Getenv(envDir), k), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			return err
		}
	}
	fmt.Println("locked")
	<-ctx.Done()
	return ctx.Err()
}

// pauseKeys starts a process that holds keys' record locks and stops it
// (SIGSTOP): every update of those records hangs until resume, which
// continues and kills it.
func pauseKeys(t testing.TB, dir string, keys ...string) (resume func()) {
	t.Helper()
	js, err := json.Marshal(keys)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd, out, errb := helper(ctx, t, envMode+"=flock", envDir+"="+dir, envKeys+"="+string(js))
	select {
	case line := <-out.lines:
		if line != "locked" {
			t.Fatalf("flock helper: %q", line)
		}
	case <-time.After(hang):
		t.Fatalf("hang: flock helper did not lock: %s", errb)
	}
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	var once sync.Once
	resume = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			cancel()
		})
	}
	t.Cleanup(resume)
	return resume
}

// lineWriter collects a child's stdout and hands out its lines.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func newLineWriter() *lineWriter { return &lineWriter{lines: make(chan string, 1024)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf.Next(i + 1))
		select {
		case w.lines <- strings.TrimSpace(line):
		default:
		}
	}
}

func helper(ctx context.Context, t testing.TB, env ...string) (*exec.Cmd, *lineWriter, *bytes.Buffer) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, errb := newLineWriter(), &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out, errb
}

func TestCrossProcessExclusion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, data := t.TempDir(), t.TempDir()
	const procs, n = 4, 10
	type child struct {
		cmd  *exec.Cmd
		out  *lineWriter
		errb *bytes.Buffer
	}
	var children []child
	for i := 0; i < procs; i++ {
		cmd, out, errb := helper(ctx, t, envMode+"=increment", envDir+"="+dir, envData+"="+data, envN+"="+strconv.Itoa(n))
		children = append(children, child{cmd, out, errb})
	}
	tokens := map[uint64]bool{}
	var maxTok uint64
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child %d: %v\n%s", i, err, c.errb)
			continue
		}
		close(c.out.lines)
		for line := range c.out.lines {
			var tok uint64
			if _, err := fmt.Sscanf(line, "token %d", &tok); err != nil {
				t.Errorf("child %d printed %q", i, line)
				continue
			}
			if tokens[tok] {
				t.Errorf("token %d issued twice", tok)
			}
			tokens[tok] = true
			maxTok = max(maxTok, tok)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if len(tokens) != procs*n {
		t.Errorf("%d tokens, want %d", len(tokens), procs*n)
	}
	for _, name := range []string{"plain", "fenced"} {
		c, err := readCounter(filepath.Join(data, name))
		if err != nil || c != procs*n {
			t.Errorf("%s counter = %d, %v; want %d (lost updates)", name, c, err, procs*n)
		}
	}
	g, err := filelock.NewGuard(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range []string{"fenced", "kept"} {
		if hi, err := g.Highest(ctx, res); err != nil || hi.Token != maxTok {
			t.Errorf("guard highest of %q = %+v, %v; want token %d", res, hi, err, maxTok)
		}
	}
	if v, ok, err := g.Get(ctx, "kept", dlock.Fence{Token: maxTok, Owner: "reader", Shared: true}, "count"); err != nil || !ok || v != strconv.Itoa(procs*n) {
		t.Errorf("guard-kept counter = %q, %v, %v; want %d (lost updates)", v, ok, err, procs*n)
	}
	// Tokens carry on from where the other processes left them.
	lk, err := mustNew(t, dir).TryAcquire(ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	if lk.Token() <= maxTok {
		t.Errorf("token %d after %d", lk.Token(), maxTok)
	}
	lk.Release(ctx)
}

// A lease whose holder stops renewing (killed, or exited without releasing)
// becomes acquirable after its TTL, with a larger token.
func TestExpiryAfterHolderDies(t *testing.T) {
	for _, tc := range []struct {
		name, hold string
		ttl        time.Duration
	}{
		{"killed-while-renewing", "renew", time.Second},
		{"exited-without-release", "exit", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hang)
			defer cancel()
			dir := t.TempDir()
			key := "abandoned"
			cmd, out, errb := helper(ctx, t, envMode+"=hold", envDir+"="+dir, envKey+"="+key, envTTL+"="+tc.ttl.String(), envHold+"="+tc.hold)
			defer func() {
				cmd.Process.Kill()
				cmd.Wait()
			}()
			var (
				tok   uint64
				owner string
			)
			select {
			case line := <-out.lines:
				if _, err := fmt.Sscanf(line, "held %d %s", &tok, &owner); err != nil {
					t.Fatalf("child printed %q", line)
				}
			case <-ctx.Done():
				t.Fatalf("hang: child did not acquire\n%s", errb)
			}
			l := mustNew(t, dir)
			if tc.hold == "renew" {
				// The child is alive and renewing: the key is held, by it.
				_, err := l.TryAcquire(ctx, key)
				var na *dlock.NotAcquiredError
				if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Owner != owner || na.Holders[0].Metadata[dlock.MetaPID] != strconv.Itoa(cmd.Process.Pid) {
					t.Fatalf("TryAcquire while the child holds the key = %v", err)
				}
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			cmd.Wait() // dead now, without having released
			lk, err := l.Acquire(ctx, key)
			if err != nil {
				t.Fatalf("hang: key never expired: %v", err)
			}
			defer lk.Release(context.Background())
			if lk.Token() <= tok {
				t.Fatalf("token %d after the dead holder's %d", lk.Token(), tok)
			}
		})
	}
}

// A waiter in this process is woken by a release in another process.
func TestCrossProcessWaiterWoken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	dir := t.TempDir()
	l := mustNew(t, dir)
	holder, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// The child waits for the key; then it exits without releasing, so
	// nothing but its own acquisition matters.
	cmd, out, errb := helper(ctx, t, envMode+"=hold", envDir+"="+dir, envKey+"=k", envTTL+"=1s", envHold+"=exit")
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	time.Sleep(50 * time.Millisecond)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-out.lines:
		if !strings.HasPrefix(line, "held ") {
			t.Fatalf("child printed %q", line)
		}
	case <-ctx.Done():
		t.Fatalf("hang: waiting child not woken by the release\n%s", errb)
	}
}
