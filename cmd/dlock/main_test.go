package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// hang bounds every command the tests run; exceeding it fails as a hang.
const hang = 60 * time.Second

var bin string // the dlock binary under test

// signalledByTests are the signals the tests send to dlock, expecting it to
// act on them.
var signalledByTests = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// defaultSignalsForChildren makes every dlock the tests start begin with
// signalledByTests at their default disposition. dlock keeps ignoring a
// signal it was started with ignored (nohup; "&" in a script ignores
// SIGINT and SIGQUIT), as documented: were `go test` started that way,
// every dlock would inherit it and ignore the signals the tests send. A
// signal this process catches is reset to its default in a child at exec,
// so this process catches the ones it was started with ignored, on a
// channel nobody reads: the signal package drops what a full channel
// cannot take, so this process still ignores them, with no goroutine of
// its own (goleak would report one).
func defaultSignalsForChildren() {
	var ignored []os.Signal
	for _, s := range signalledByTests {
		if signal.Ignored(s) {
			ignored = append(ignored, s)
		}
	}
	if len(ignored) == 0 {
		return
	}
	signal.Notify(make(chan os.Signal, 1), ignored...)
}

// binVersion is the version bin is built with.
const binVersion = "v9.8.7-test.1"

func TestMain(m *testing.M) {
	defaultSignalsForChildren()
	dir, err := os.MkdirTemp("", "dlock-cli-test-")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "dlock")
	// The version the Makefile passes with -X, so that this one build also
	// proves it (TestVersionFromLdflags). -s -w: a quicker link.
	build := exec.Command("go", "build", "-ldflags", "-s -w -X main.version="+binVersion, "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building dlock:", err)
		os.Exit(1)
	}
	testserver.AfterTests(func() error { return os.RemoveAll(dir) })
	testserver.Main(m)
}

// sharedZooKeeper is a ZooKeeper for tests that use paths of their own
// on it.
func sharedZooKeeper(t *testing.T) *testserver.ZooKeeper {
	return testserver.Shared(t, "zookeeper", func(tb testserver.TB) *testserver.ZooKeeper { return testserver.StartZooKeeper(tb) })
}

type result struct {
	code           int
	stdout, stderr string
}

// dlockCmd prepares a dlock invocation with DLOCK_URL pointing at url.
func dlockCmd(ctx context.Context, url string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DLOCK_URL="+url)
	return cmd
}

// runDlock runs dlock to completion (bounded by hang).
func runDlock(t *testing.T, url string, args ...string) result {
	t.Helper()
	r, err := runDlockErr(url, args...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runDlockErr is runDlock for goroutines other than the test's: it
// returns what would fail the test.
func runDlockErr(url string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	cmd := dlockCmd(ctx, url, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second // a stray holder of the pipes must not hang the test
	err := cmd.Run()
	if ctx.Err() != nil {
		return result{}, fmt.Errorf("hang: dlock %v did not finish within %v", args, hang)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return result{}, err
	}
	return result{code, out.String(), errb.String()}, nil
}

// syncBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func fileURL(t *testing.T) string { return "file://" + t.TempDir() }

// background starts `dlock run` holding key and waits until the child has
// printed its first line (so the lock is held).
func background(t *testing.T, url string, args ...string) (*exec.Cmd, *syncBuffer, *syncBuffer) {
	t.Helper()
	cmd := dlockCmd(context.Background(), url, args...)
	out, errb := &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd.WaitDelay = 5 * time.Second
	t.Cleanup(func() { stopCmd(t, cmd) }) // its child dies with it (parent-death signal)
	deadline := time.Now().Add(hang)
	for !strings.Contains(out.String(), "\n") {
		if time.Now().After(deadline) {
			t.Fatalf("hang: background dlock never started its child; stderr: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cmd, errb, out
}

// cmdWait is the one Wait of a started command, which waitExit and the
// test's cleanup share: exec.Cmd.Wait may be called once only.
type cmdWait struct {
	once sync.Once
	done chan struct{} // closed once Wait returned
	err  error
}

var cmdWaits sync.Map // *exec.Cmd -> *cmdWait

// waitOf returns cmd's cmdWait, starting its Wait on first use.
func waitOf(cmd *exec.Cmd) *cmdWait {
	v, _ := cmdWaits.LoadOrStore(cmd, &cmdWait{done: make(chan struct{})})
	w := v.(*cmdWait)
	w.once.Do(func() {
		go func() {
			w.err = cmd.Wait()
			close(w.done)
		}()
	})
	return w
}

// stopCmd kills a started command and waits for it (bounded by hang): the
// cleanup of every command a test starts.
func stopCmd(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Kill()
	select {
	case <-waitOf(cmd).done:
	case <-time.After(hang):
		t.Errorf("hang: %v not reaped %v after SIGKILL", cmd.Args, hang)
	}
}

// waitExit waits for a started command and returns its exit code.
func waitExit(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	w := waitOf(cmd)
	select {
	case <-w.done:
		var ee *exec.ExitError
		if errors.As(w.err, &ee) {
			return ee.ExitCode()
		}
		if w.err != nil {
			t.Fatal(w.err)
		}
		return 0
	case <-time.After(hang):
		t.Fatalf("hang: %v did not exit within %v", cmd.Args, hang)
		return -1
	}
}

func TestRunPassesTokenAndIncreasesIt(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	var last uint64
	for i := 0; i < 3; i++ {
		r := runDlock(t, url, "run", "job", "--", "sh", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN ${#DLOCK_OWNER}"`)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		f := strings.Fields(r.stdout)
		if len(f) != 3 || f[0] != "job" || f[2] != "32" {
			t.Fatalf("child saw %q", r.stdout)
		}
		tok, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil || tok <= last {
			t.Fatalf("token %q after %d", f[1], last)
		}
		last = tok
	}
}

func TestRunPropagatesExitStatus(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	if r := runDlock(t, url, "run", "k", "--", "sh", "-c", "exit 3"); r.code != 3 {
		t.Fatalf("exit %d, want 3", r.code)
	}
	if r := runDlock(t, url, "run", "k", "--", "sh", "-c", "kill -KILL $$"); r.code != 128+9 {
		t.Fatalf("killed child: exit %d, want 137", r.code)
	}
	r := runDlock(t, url, "run", "k", "--", "/nonexistent/cmd")
	if r.code != exitNoExec || !strings.Contains(r.stderr, "/nonexistent/cmd") {
		t.Fatalf("missing command: exit %d %q", r.code, r.stderr)
	}
	// The lock was released each time: a non-blocking run succeeds.
	if r := runDlock(t, url, "run", "-n", "k", "--", "true"); r.code != 0 {
		t.Fatalf("lock still held after the child exited: %d %s", r.code, r.stderr)
	}
}

func TestRunConflict(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	holder, _, _ := background(t, url, "run", "busy", "--", "sh", "-c", "echo started; exec sleep 60")
	r := runDlock(t, url, "run", "-n", "busy", "--", "echo", "should not run")
	if r.code != 1 || strings.Contains(r.stdout, "should not run") {
		t.Fatalf("-n on a held key: exit %d, stdout %q", r.code, r.stdout)
	}
	if !strings.Contains(r.stderr, `"busy"`) || !strings.Contains(r.stderr, fmt.Sprintf("pid=%d", holder.Process.Pid)) {
		t.Fatalf("message does not name the key and holder: %q", r.stderr)
	}
	if r := runDlock(t, url, "run", "-n", "-E", "75", "busy", "--", "true"); r.code != 75 {
		t.Fatalf("-E 75: exit %d", r.code)
	}
	if r := runDlock(t, url, "run", "--conflict-exit-code", "9", "--wait", "200ms", "busy", "--", "true"); r.code != 9 || !strings.Contains(r.stderr, "gave up") {
		t.Fatalf("--wait elapsed: exit %d %q", r.code, r.stderr)
	}
	// SIGTERM to dlock reaches the child (sleep dies of it: 128+15).
	holder.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, holder); code != 128+15 {
		t.Fatalf("holder exit %d after SIGTERM, want 143", code)
	}
	if r := runDlock(t, url, "run", "-n", "busy", "--", "true"); r.code != 0 {
		t.Fatalf("lock not released after the holder ended: %d %s", r.code, r.stderr)
	}
}

func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	script := `trap 'echo got-$1; exit 7' INT; echo started; while :; do sleep 0.05; done`
	holder, _, out := background(t, url, "run", "sig", "--", "sh", "-c", strings.ReplaceAll(script, "$1", "INT"))
	holder.Process.Signal(syscall.SIGINT)
	if code := waitExit(t, holder); code != 7 {
		t.Fatalf("exit %d, want the child's 7", code)
	}
	if !strings.Contains(out.String(), "got-INT") {
		t.Fatalf("child did not see SIGINT: %q", out.String())
	}
}

// A killed dlock takes its child with it: nobody would renew the lease, so
// the child must not run on without the lock.
func TestKilledDlockKillsChild(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	holder, _, out := background(t, url, "run", "k", "--", "sh", "-c", "echo $$; exec sleep 60")
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	holder.Process.Kill()
	waitExit(t, holder)
	deadline := time.Now().Add(hang)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("hang: child %d survived its dlock", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestRunWaitsForRelease(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	holder, _, _ := background(t, url, "run", "q", "--", "sh", "-c", "echo started; sleep 0.5")
	r := runDlock(t, url, "run", "q", "--", "echo", "second")
	if r.code != 0 || !strings.Contains(r.stdout, "second") {
		t.Fatalf("waiting run: %d %q %q", r.code, r.stdout, r.stderr)
	}
	waitExit(t, holder)
}

func TestRunLostLockKillsChild(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := "file://" + dir
	// The child ignores SIGTERM, so dlock must escalate to SIGKILL after --grace.
	holder, errb, _ := background(t, url, "run", "--ttl", "3s", "--grace", "500ms", "doomed", "--",
		"sh", "-c", "trap '' TERM; echo started; exec sleep 60")
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Expire("doomed"); err != nil { // behind the holder's back
		t.Fatal(err)
	}
	if code := waitExit(t, holder); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitLost, errb.String())
	}
	for _, want := range []string{"LOCK LOST", "SIGTERM", "SIGKILL"} {
		if !strings.Contains(errb.String(), want) {
			t.Fatalf("stderr lacks %q: %s", want, errb.String())
		}
	}
}

func TestRedisURLAndLs(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithPassword("hunter2"))
	url := "redis://:hunter2@" + srv.Addr()
	holder, _, _ := background(t, url, "run", "--ttl", "5s", "reports/daily", "--", "sh", "-c", "echo started; exec sleep 60")
	r := runDlock(t, url, "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "reports/daily") || !strings.Contains(r.stdout, strconv.Itoa(holder.Process.Pid)) || !strings.Contains(r.stdout, "TOKEN") {
		t.Fatalf("ls: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runDlock(t, url, "ls", "--json", "reports/")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 || infos[0].Key != "reports/daily" || infos[0].Token == 0 || infos[0].TTLms <= 0 {
		t.Fatalf("ls --json: %v %q", err, r.stdout)
	}
	if r := runDlock(t, url, "ls", "--json", "nomatch/"); strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("empty ls --json: %q", r.stdout)
	}
	// Deleting the key behind dlock's back: the child is terminated, exit 4.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "hunter2"})
	defer c.Close()
	if err := c.Del(context.Background(), redislock.New(c).LockKey("reports/daily")).Err(); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, holder); code != exitLost {
		t.Fatalf("exit %d after the key was deleted, want %d", code, exitLost)
	}
	// Wrong password: a backend error that does not echo the password.
	r = runDlock(t, "redis://:wrongpass@"+srv.Addr(), "run", "k", "--", "true")
	if r.code != exitBackend || strings.Contains(r.stderr, "wrongpass") || !strings.Contains(r.stderr, "xxxxx") {
		t.Fatalf("wrong password: %d %q", r.code, r.stderr)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	cases := []struct {
		args []string
		url  string
		code int
		want string
	}{
		{[]string{"bogus"}, url, exitUsage, "unknown command"},
		{nil, url, exitUsage, "Usage"},
		{[]string{"run"}, url, exitUsage, "missing KEY"},
		{[]string{"run", "k"}, url, exitUsage, "missing CMD"},
		{[]string{"run", "--ttl", "abc", "k", "--", "true"}, url, exitUsage, "invalid value"},
		{[]string{"run", "--ttl", "-1s", "k", "--", "true"}, url, exitUsage, "--ttl must be positive"},
		{[]string{"run", "--ttl", "1ms", "k", "--", "true"}, url, exitUsage, "below the minimum"},
		{[]string{"run", "-E", "300", "k", "--", "true"}, url, exitUsage, "0-255"},
		{[]string{"run", "--nosuchflag", "k", "--", "true"}, url, exitUsage, "not defined"},
		{[]string{"run", "", "--", "true"}, url, exitUsage, "key is empty"},
		{[]string{"run", strings.Repeat("k", 2000), "--", "true"}, url, exitUsage, "maximum"},
		{[]string{"run", "k", "--", "true"}, "ftp://x", exitUsage, "supported: file, redis"},
		{[]string{"run", "k", "--", "true"}, "redis://127.0.0.1:99999", exitUsage, "port"},
		{[]string{"run", "k", "--", "true"}, "redis://:s3cr3t@127.0.0.1:notaport", exitUsage, "port"},
		{[]string{"run", "k", "--", "true"}, "redis+sentinel://127.0.0.1:26379", exitUsage, "master name"},
		{[]string{"run", "k", "--", "true"}, "file://otherhost/x", exitUsage, "local directory"},
		{[]string{"run", "k", "--", "true"}, "::bad", exitUsage, "bad URL"},
		{[]string{"run", "k", "--", "true"}, "redis://:s3cr3t@" + deadAddr(t), exitBackend, "connection refused"},
		{[]string{"run", "k", "--", "true"}, "zk://u:s3cr3t@127.0.0.1:2181/a//b", exitUsage, "empty znode name"},
		{[]string{"ls"}, "zk://u:s3cr3t@", exitUsage, "no servers"},
		{[]string{"ls"}, "zk://u@127.0.0.1:2181", exitUsage, "without a password"},
		{[]string{"run", "--connect-timeout", "1s", "k", "--", "true"}, "zk://u:s3cr3t@" + deadAddr(t), exitBackend, "connection refused"},
		{[]string{"ls", "a", "b"}, url, exitUsage, "at most one PREFIX"},
		{[]string{"demo", "extra"}, url, exitUsage, "no arguments"},
	}
	for _, c := range cases {
		r := runDlock(t, c.url, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("dlock %q (url %q): exit %d, stderr %q; want exit %d and %q", c.args, c.url, r.code, r.stderr, c.code, c.want)
		}
		if strings.Contains(r.stderr+r.stdout, "s3cr3t") {
			t.Errorf("dlock %q printed the password: %q", c.args, r.stderr)
		}
		if strings.Contains(r.stderr, "panic") || strings.Contains(r.stderr, "goroutine ") {
			t.Errorf("dlock %q panicked: %s", c.args, r.stderr)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range [][]string{{"run", "--help"}, {"ls", "-h"}, {"demo", "--help"}} {
		r := runDlock(t, url, c...)
		// run's help (GNU style, help_test.go) goes to stdout.
		if r.code != 0 || !strings.Contains(r.stderr+r.stdout, "Usage: dlock "+c[0]) {
			t.Errorf("%v: %d %q", c, r.code, r.stderr)
		}
	}
	if r := runDlock(t, url, "run", "--help"); !strings.Contains(r.stdout, "Exit status") || !strings.Contains(r.stdout, "Examples") {
		t.Errorf("run --help lacks exit codes or examples")
	}
	if r := runDlock(t, url, "help"); r.code != 0 || !strings.Contains(r.stdout, "dlock run") || !strings.Contains(r.stdout, "zk://[user:pass@]h1:p1") || !strings.Contains(r.stdout, "postgres://[user:pass@]host:port/db") {
		t.Errorf("help: %d %q", r.code, r.stdout)
	}
	if r := runDlock(t, url, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "dlock ") {
		t.Errorf("version: %d %q", r.code, r.stdout)
	}
}

func TestLsFileBackend(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	if r := runDlock(t, url, "ls"); r.code != 0 || !strings.Contains(r.stdout, "no locks held") {
		t.Fatalf("empty ls: %d %q %q", r.code, r.stdout, r.stderr)
	}
	background(t, url, "run", "batch/nightly", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, url, "ls", "batch/"); r.code != 0 || !strings.Contains(r.stdout, "batch/nightly") {
		t.Fatalf("ls: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	r := runDlock(t, "", "demo", "--workers", "6", "--rounds", "10")
	if r.code != 0 {
		t.Fatalf("demo exit %d: %s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"updates LOST", "expected 60: correct", "PAUSED with SIGSTOP", "REJECTED by the guard", "with fencing:    balance = 120", "without fencing: balance =  70"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestDemoOnRedis(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	r := runDlock(t, "", "demo", "--url", "redis://"+srv.Addr(), "--workers", "4", "--rounds", "5")
	if r.code != 0 || !strings.Contains(r.stdout, "REJECTED by the guard") {
		t.Fatalf("demo on redis: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestRedlockURL(t *testing.T) {
	t.Parallel()
	var addrs []string
	for i := 0; i < 3; i++ {
		addrs = append(addrs, testserver.StartRedis(t).Addr())
	}
	url := "redlock://" + strings.Join(addrs, ",")
	var last uint64
	for i := 0; i < 2; i++ {
		r := runDlock(t, url, "run", "rl", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
		if r.code != 0 || err != nil || tok <= last {
			t.Fatalf("redlock run: %d %q %q", r.code, r.stdout, r.stderr)
		}
		last = tok
	}
	// A key of its own for the holder: a release reaches a majority of the
	// nodes before dlock exits, and a straggling node may keep a minority
	// lease of the runs above until it expires, as Redlock allows; a -n run
	// that met it as often as the holder's could name either holder.
	holder, _, _ := background(t, url, "run", "rl/held", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, url, "ls", "--json"); !strings.Contains(r.stdout, `"key": "rl/held"`) {
		t.Fatalf("ls: %q %q", r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "run", "-n", "rl/held", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, fmt.Sprintf("pid=%d", holder.Process.Pid)) {
		t.Fatalf("conflict: %d %q", r.code, r.stderr)
	}
	// Redlock offers exclusive locks only: --shared and --limit fail with
	// its error naming the mode (a usage error), and CMD does not run.
	for _, c := range []struct{ flags, mode string }{{"--shared", "shared"}, {"--limit=2", "limited"}} {
		r := runDlock(t, url, "run", c.flags, "rl-modes", "--", "echo", "ran")
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, "the redlock backend does not offer "+c.mode+" locks") || !strings.Contains(r.stderr, url) {
			t.Errorf("redlock %s: exit %d, stdout %q, stderr %q", c.flags, r.code, r.stdout, r.stderr)
		}
	}
	if r := runDlock(t, "redlock://127.0.0.1:1,127.0.0.1:1", "ls"); r.code != exitUsage || !strings.Contains(r.stderr, "listed twice") {
		t.Fatalf("duplicate node: %d %q", r.code, r.stderr)
	}
}

// served is a running `dlock serve`.
type served struct {
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
	url    string
}

// startServe runs `dlock serve` on free loopback ports and waits for it.
func startServe(t testserver.TB) *served {
	t.Helper()
	lastErr := ""
	for attempt := 0; attempt < 20; attempt++ {
		listen := fmt.Sprintf("127.0.0.1:%d", testserver.FreePort(t))
		peer := fmt.Sprintf("127.0.0.1:%d", testserver.FreePort(t))
		cmd := exec.Command(bin, "serve", "--data-dir", t.TempDir(), "--listen", listen, "--peer-listen", peer)
		out, errb := &syncBuffer{}, &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, errb
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s := &served{cmd: cmd, exited: make(chan error, 1), url: "etcd://" + listen}
		go func() { s.exited <- cmd.Wait() }()
		deadline := time.After(hang)
	wait:
		for {
			select {
			case <-s.exited:
				if strings.Contains(errb.String(), "address already in use") {
					lastErr = errb.String()
					break wait // a port was taken meanwhile: try others
				}
				t.Fatalf("dlock serve exited: %s %s", out.String(), errb.String())
			case <-deadline:
				cmd.Process.Kill()
				t.Fatalf("hang: dlock serve not ready: %s %s", out.String(), errb.String())
			case <-time.After(20 * time.Millisecond):
				if serveAnnounced(out.String()) {
					t.Cleanup(func() { cmd.Process.Kill() })
					return s
				}
			}
		}
	}
	t.Fatalf("dlock serve did not start on any free port: %s", lastErr)
	return nil
}

// serveAnnounced reports whether dlock serve's output has its ready line
// and, whole, the line after it, the URL to use.
func serveAnnounced(out string) bool {
	_, after, ok := strings.Cut(out, serveReady)
	if !ok {
		return false
	}
	_, use, ok := strings.Cut(after, "\nuse: ")
	return ok && strings.Contains(use, "\n")
}

func TestServeAndEtcdURL(t *testing.T) {
	t.Parallel()
	srv := startServe(t)
	url := srv.url
	var last uint64
	for i := 0; i < 2; i++ {
		r := runDlock(t, url, "run", "etcdjob", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
		if r.code != 0 || err != nil || tok <= last {
			t.Fatalf("run on dlock serve: %d %q %q", r.code, r.stdout, r.stderr)
		}
		last = tok
	}
	holder, _, _ := background(t, url, "run", "reports/etcd", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, url, "ls"); r.code != 0 || !strings.Contains(r.stdout, "reports/etcd") || !strings.Contains(r.stdout, strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("ls on etcd: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "run", "-n", "reports/etcd", "--", "true"); r.code != 1 {
		t.Fatalf("conflict on etcd: %d %q", r.code, r.stderr)
	}
	holder.Process.Signal(syscall.SIGTERM)
	waitExit(t, holder)
	// SIGTERM stops the server cleanly.
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-srv.exited:
		if err != nil {
			t.Fatalf("dlock serve exit: %v", err)
		}
	case <-time.After(hang):
		t.Fatal("hang: dlock serve ignored SIGTERM")
	}
}

func TestEtcdURLErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url  string
		code int
		want string
	}{
		{"etcd://" + deadAddr(t), exitBackend, "not reachable"},
		{"etcd://", exitUsage, "no endpoints"},
		{"etcd://127.0.0.1:2379?ca=/x", exitUsage, "needs etcds"},
		{"etcds://127.0.0.1:2379?ca=/nonexistent", exitUsage, "ca file"},
	}
	for _, c := range cases {
		r := runDlock(t, c.url, "ls")
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: exit %d %q, want %d %q", c.url, r.code, r.stderr, c.code, c.want)
		}
	}
	if r := runDlock(t, "", "serve", "--listen", "nonsense"); r.code != exitUsage {
		t.Errorf("serve --listen nonsense: %d %q", r.code, r.stderr)
	}
}

// ls is read-only: a lock directory that does not exist is an error (exit
// 3), and is not created. The default directory, before any lock was
// taken there, just holds no locks (and is not created either).
func TestLsCreatesNothing(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	typo := filepath.Join(base, "typo", "locks")
	for _, args := range [][]string{{"ls"}, {"ls", "--json"}, {"ls", "prefix/"}} {
		r := runDlock(t, "file://"+typo, args...)
		if r.code != exitBackend || !strings.Contains(r.stderr, "no such lock directory") || r.stdout != "" {
			t.Errorf("%v on a missing directory: exit %d, stdout %q, stderr %q; want %d and no such lock directory", args, r.code, r.stdout, r.stderr, exitBackend)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "typo")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ls created %s: %v", filepath.Join(base, "typo"), err)
	}

	state := filepath.Join(base, "state")
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	for _, args := range [][]string{{"ls"}, {"ls", "--json"}} {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "DLOCK_URL=", "XDG_STATE_HOME="+state)
		out, err := cmd.Output()
		if err != nil || !(strings.Contains(string(out), "no locks held") || strings.TrimSpace(string(out)) == "[]") {
			t.Errorf("%v with the default URL, never used: %v %q", args, err, out)
		}
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ls created the default state directory: %v", err)
	}
}

// CMD inherits the environment, DLOCK_URL included (documented: CMD may
// run dlock itself against the same service); a URL given with --url is
// not added to it.
func TestCommandInheritsDlockURL(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	nested := `echo "url=$DLOCK_URL"; "$0" run -n inner -- sh -c 'echo "inner $DLOCK_KEY"'`
	r := runDlock(t, url, "run", "outer", "--", "sh", "-c", nested, bin)
	if r.code != 0 || !strings.Contains(r.stdout, "url="+url+"\n") || !strings.Contains(r.stdout, "inner inner") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runDlock(t, "", "run", "--url", url, "k", "--", "sh", "-c", `echo "url=$DLOCK_URL"`)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "url=" {
		t.Fatalf("--url: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// A mistyped command ("runn") must point at the command meant, and only
// when one command is clearly closest.
func TestUnknownCommand_SuggestsClosest(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ typed, want string }{
		{"runn", " (did you mean run?)"},
		{"rnu", " (did you mean run?)"},
		{"unlok", " (did you mean unlock?)"},
		{"chekc", " (did you mean check?)"},
		{"lss", " (did you mean ls?)"},
		{"RUN", " (did you mean run?)"},
		{"bogus", ""},
		{"x", ""},
		{"deploy", ""},
	} {
		var out, errb bytes.Buffer
		code := run([]string{c.typed}, &out, &errb)
		first, _, _ := strings.Cut(errb.String(), "\n")
		if want := "dlock: unknown command " + strconv.Quote(c.typed) + c.want; code != exitUsage || first != want {
			t.Errorf("%q: exit %d, first line %q; want exit 2, %q", c.typed, code, first, want)
		}
	}
}

// Symptom: --ttl 1ms printed "dlock run: dlock: invalid ttl ..." (exit 2 after connecting).
// A --ttl below the minimum is a usage error with one "dlock run: "
// prefix, and so are the other bad durations and an invalid key.
func TestRun_TTLBelowMinimumIsUsageError(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--ttl", "1ms", "k", "--", "true"}, "dlock run: --ttl 1ms is below the minimum, 100ms\n"},
		{[]string{"run", "--ttl", "99ms", "k", "--", "true"}, "dlock run: --ttl 99ms is below the minimum, 100ms\n"},
		{[]string{"hold", "--ttl", "1ms", "k"}, "dlock hold: --ttl 1ms is below the minimum, 100ms\n"},
		{[]string{"run", "--connect-timeout", "-1s", "k", "--", "true"}, "dlock run: --connect-timeout must be positive, got -1s\n"},
		{[]string{"run", "--grace", "-1s", "k", "--", "true"}, "dlock run: --grace must not be negative, got -1s\n"},
		{[]string{"run", "-w", "-1s", "k", "--", "true"}, "dlock run: invalid value \"-1s\" for -w: must not be negative\n"},
		{[]string{"run", "--max-hold", "-1s", "k", "--", "true"}, "dlock run: --max-hold must not be negative, got -1s\n"},
		{[]string{"run", "--max-hold", "50ms", "k", "--", "true"}, "dlock run: --max-hold 50ms is below the minimum, 311ms (with --ttl 30s)\n"},
		// CMD would get SIGTERM before it started.
		{[]string{"run", "--max-hold", "1s", "k", "--", "true"}, "dlock run: --max-hold 1s leaves CMD no time: it gets SIGTERM 6s before the cap (kill margin 1s, term grace 5s); the minimum with --ttl 30s and --grace 5s is 6.311s\n"},
		{[]string{"hold", "--max-hold", "50ms", "--ttl", "1s", "k"}, "dlock hold: --max-hold 50ms is below the minimum, 100ms (with --ttl 1s)\n"},
		{[]string{"run", "--max-hold", "soon", "k", "--", "true"}, "dlock run: invalid value \"soon\" for --max-hold: want a duration such as 500ms, 30s or 2m\n"},
		{[]string{"run", "", "--", "true"}, "dlock run: invalid key: key is empty\n"},
	} {
		r := runDlock(t, url, c.args...)
		cmd := "dlock " + c.args[0]
		if r.code != exitUsage || r.stdout != "" || r.stderr != c.want+"Try '"+cmd+" --help' for more information.\n" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
		if n := strings.Count(r.stderr, "dlock: "); n != 0 {
			t.Errorf("%q: stderr %q has the library's prefix after dlock's", c.args, r.stderr)
		}
	}
}

// CMD must not be handed the lock service's password through DLOCK_URL;
// a DLOCK_URL without a secret still reaches it, for a nested dlock.
func TestRun_CMDDoesNotSeePassword(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithPassword("Pw4CmdEnv"))
	for _, url := range []string{
		"redis://:Pw4CmdEnv@" + srv.Addr(),
		"redis://default:Pw4CmdEnv@" + srv.Addr() + "/0?dial_timeout=2s",
	} {
		r := runDlock(t, url, "run", "k", "--", "env")
		if r.code != 0 || !strings.Contains(r.stdout, "DLOCK_TOKEN=") || strings.Contains(r.stdout, "Pw4CmdEnv") || strings.Contains(r.stdout, "DLOCK_URL=") {
			t.Fatalf("run with DLOCK_URL %s: exit %d, CMD's environment %q: want DLOCK_TOKEN and no DLOCK_URL", redact(url), r.code, r.stdout)
		}
	}
	plain := fileURL(t)
	r := runDlock(t, plain, "run", "k", "--", "env")
	if r.code != 0 || !strings.Contains(r.stdout, "DLOCK_URL="+plain+"\n") {
		t.Fatalf("run with DLOCK_URL %s: exit %d, CMD's environment %q: want DLOCK_URL passed on", plain, r.code, r.stdout)
	}
}

// Symptom: a CMD that exists but cannot be executed exited 127, as if it were not there.
// It exits 126, and 127 stays for a CMD that was not found.
func TestRun_NotExecutableExits126(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	dir := t.TempDir()
	script := dir + "/script.sh"
	if err := os.WriteFile(script, []byte("echo ran\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	garbage := dir + "/garbage"
	if err := os.WriteFile(garbage, []byte("\x7fELF not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd  string
		code int
		want string
	}{
		{script, 126, "permission denied"},
		{dir, 126, "is a directory"},
		{garbage, 126, "exec format error"},
		{dir + "/missing", 127, "no such file or directory"},
		{"dlock-no-such-command", 127, "not found"},
	} {
		r := runDlock(t, url, "run", "k", "--", c.cmd)
		if r.code != c.code || r.stdout != "" || !strings.HasPrefix(r.stderr, "dlock run: ") || !strings.Contains(r.stderr, c.want) {
			t.Errorf("run %s: exit %d, stdout %q, stderr %q; want exit %d and %q", c.cmd, r.code, r.stdout, r.stderr, c.code, c.want)
		}
	}
	// The lock was released: the next run gets it at once.
	if r := runDlock(t, url, "run", "-n", "k", "--", "true"); r.code != 0 {
		t.Fatalf("run -n after the failed starts: exit %d, stderr %q", r.code, r.stderr)
	}
}

// --max-hold on run: at the cap CMD's tree is terminated as on a lost
// lock (dead before dlock exits), dlock exits 4 and names the cap, and the
// lock is free for the next run.
func TestRun_MaxHoldTerminatesTreeAndExits4(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	r := runDlock(t, url, "run", "--ttl", "3s", "--max-hold", "2s", "capped", "--", "sh", "-c", `echo "$$"; exec sleep 60`)
	pid, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil {
		t.Fatalf("CMD printed %q; stderr %q", r.stdout, r.stderr)
	}
	if r.code != exitLost || !strings.Contains(r.stderr, "dlock run: --max-hold 2s reached: the lock was given up and CMD's process tree terminated") {
		t.Fatalf("exit %d, stderr %q; want %d and the cap named", r.code, r.stderr, exitLost)
	}
	if alive(pid) {
		t.Fatalf("CMD (pid %d) still runs after dlock run exited at the cap", pid)
	}
	if r := runDlock(t, url, "run", "-n", "capped", "--", "true"); r.code != 0 {
		t.Fatalf("run -n after the capped run: exit %d, stderr %q; want the lock free", r.code, r.stderr)
	}
}

// A negative --grace is a usage error with -c CMDLINE too, before the
// lock is taken. Symptom: with -c it slipped through, the lock was taken
// and the supervisor failed on the flag.
func TestRun_NegativeGraceIsUsageErrorWithShell(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	r := runDlock(t, url, "run", "--grace", "-1s", "k", "-c", "echo ran")
	if r.code != exitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, "dlock run: --grace must not be negative, got -1s\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want a usage error", r.code, r.stdout, r.stderr)
	}
}

// A dlock that CMD starts without --url, when the outer run withheld a
// DLOCK_URL holding a password, refuses (exit 2) instead of locking on
// the local file backend. Symptom: the nested dlock silently used a
// different lock service.
func TestRun_NestedDlockRefusesWhenURLWithheld(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithPassword("Pw4Nested"))
	r := runDlock(t, "redis://:Pw4Nested@"+srv.Addr(), "run", "outer", "--", bin, "run", "inner", "--", "echo", "inner ran")
	if r.code != exitUsage || strings.Contains(r.stdout, "inner ran") || !strings.Contains(r.stderr, "withheld its DLOCK_URL") || strings.Contains(r.stderr, "Pw4Nested") {
		t.Fatalf("nested dlock: exit %d, stdout %q, stderr %q; want exit 2 saying the URL was withheld", r.code, r.stdout, r.stderr)
	}
}
