package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// holding is a running `dlock hold`.
type holding struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	token  uint64
	owner  string
}

// startHold runs `dlock hold ARGS...` and waits for its one line on
// stdout: the lock is held from then on.
func startHold(t *testing.T, url string, args ...string) *holding {
	t.Helper()
	cmd := dlockCmd(context.Background(), url, append([]string{"hold"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errb := &syncBuffer{}
	cmd.Stderr = errb
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, cmd) })
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- l
		io.Copy(io.Discard, stdout) // nothing more is expected
	}()
	var l string
	select {
	case l = <-line:
	case <-time.After(hang):
		t.Fatalf("hang: dlock hold printed nothing; stderr: %s", errb.String())
	}
	m := regexp.MustCompile(`^(\d+) ([0-9a-f]{32})\n$`).FindStringSubmatch(l)
	if m == nil {
		t.Fatalf("dlock hold printed %q, want \"TOKEN OWNER\\n\"; stderr: %s", l, errb.String())
	}
	tok, _ := strconv.ParseUint(m[1], 10, 64)
	return &holding{cmd: cmd, stderr: errb, token: tok, owner: m[2]}
}

// dlock hold prints the token and holds the lock (others fail with -n,
// name its pid, and wait) until SIGINT, SIGTERM, SIGHUP or SIGQUIT: then
// it releases it and exits 0, and the next holder's token is higher.
// SIGQUIT dumped goroutines and exited 2 without releasing.
func TestHoldUntilSignalled(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	last := uint64(0)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT} {
		h := startHold(t, url, "deploy")
		if h.token <= last {
			t.Fatalf("token %d after %d", h.token, last)
		}
		r := runDlock(t, url, "run", "-n", "deploy", "--", "echo", "should not run")
		if r.code != exitConflict || r.stdout != "" || !strings.Contains(r.stderr, fmt.Sprintf("pid=%d", h.cmd.Process.Pid)) ||
			!strings.Contains(r.stderr, h.owner[:12]) {
			t.Fatalf("run -n while held: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if r := runDlock(t, url, "hold", "-n", "deploy"); r.code != exitConflict || r.stdout != "" || !strings.Contains(r.stderr, "dlock hold: lock \"deploy\" is held") {
			t.Fatalf("hold -n while held: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		h.cmd.Process.Signal(sig)
		if code := waitExit(t, h.cmd); code != 0 {
			t.Fatalf("after %v: exit %d, stderr %s", sig, code, h.stderr.String())
		}
		r = runDlock(t, url, "run", "-n", "deploy", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
		if r.code != 0 || err != nil || tok <= h.token {
			t.Fatalf("after %v released: exit %d, stdout %q, stderr %q; want a token above %d", sig, r.code, r.stdout, r.stderr, h.token)
		}
		last = tok
	}
}

// A waiting run gets the lock once hold releases it.
func TestHoldHandsOverToWaiter(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	h := startHold(t, url, "--verbose", "q")
	waiter := dlockCmd(context.Background(), url, "run", "--verbose", "q", "--", "sh", "-c", `echo "got $DLOCK_TOKEN"`)
	out, werr := &syncBuffer{}, &syncBuffer{}
	waiter.Stdout, waiter.Stderr = out, werr
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, waiter) })
	waitFor(t, hang, "the waiter never said it waits", func() bool { return strings.Contains(werr.String(), `dlock run: waiting for "q"`) })
	if strings.Contains(out.String(), "got") {
		t.Fatalf("the waiter ran while hold held the lock: %q", out.String())
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, h.cmd); code != 0 {
		t.Fatalf("hold: exit %d, stderr %s", code, h.stderr.String())
	}
	if !strings.Contains(h.stderr.String(), `dlock hold: released "q" on terminated`) {
		t.Errorf("hold --verbose did not say it released: %s", h.stderr.String())
	}
	code := waitExit(t, waiter)
	m := regexp.MustCompile(`got (\d+)`).FindStringSubmatch(out.String())
	if code != 0 || m == nil {
		t.Fatalf("waiter: exit %d, output %q", code, out.String())
	}
	if tok, _ := strconv.ParseUint(m[1], 10, 64); tok <= h.token {
		t.Fatalf("waiter's token %d, not above hold's %d", tok, h.token)
	}
}

// A lock lost while held (deleted behind hold's back) ends hold with exit
// 4 and says so.
func TestHoldLostLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := startHold(t, "file://"+dir, "--ttl", "3s", "doomed")
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Expire("doomed"); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, h.cmd); code != exitLost || !strings.Contains(h.stderr.String(), "dlock hold: LOCK LOST") {
		t.Fatalf("exit %d, stderr %q; want %d and LOCK LOST", code, h.stderr.String(), exitLost)
	}
}

// On Redis, hold keeps renewing: held well past its TTL, the key is still
// its own; waiting (-w) and the modes work as for run.
func TestHoldOnRedisRenewsAndWaits(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	url := "redis://" + srv.Addr()
	start := time.Now()
	h := startHold(t, url, "--ttl", "2s", "r")
	// Past the first lease's end (counted from before hold started): only
	// renewals keep the key.
	time.Sleep(time.Until(start.Add(2500 * time.Millisecond)))
	if r := runDlock(t, url, "run", "-n", "r", "--", "true"); r.code != exitConflict {
		t.Fatalf("run -n 2.5s after starting a hold with --ttl 2s: exit %d %q; want the lock still held", r.code, r.stderr)
	}
	if r := runDlock(t, url, "hold", "-w", "0.3", "r"); r.code != exitConflict || !strings.Contains(r.stderr, "gave up after waiting 300ms") {
		t.Fatalf("hold -w 0.3 on a held key: exit %d %q", r.code, r.stderr)
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, h.cmd); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, h.stderr.String())
	}
	// Two shared holds at once.
	a := startHold(t, url, "--shared", "s")
	b := startHold(t, url, "-s", "s")
	if b.token <= a.token {
		t.Fatalf("shared tokens %d then %d", a.token, b.token)
	}
	if r := runDlock(t, url, "hold", "-n", "s"); r.code != exitConflict || !strings.Contains(r.stderr, "held shared") {
		t.Fatalf("exclusive hold -n on a shared-held key: exit %d %q", r.code, r.stderr)
	}
	for _, x := range []*holding{a, b} {
		x.cmd.Process.Signal(syscall.SIGINT)
		if code := waitExit(t, x.cmd); code != 0 {
			t.Fatalf("shared hold: exit %d, stderr %s", code, x.stderr.String())
		}
	}
}

// A hold still waiting for the lock ends on a signal with 128+N, holding
// nothing.
func TestHoldInterruptedWhileWaiting(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	h := startHold(t, url, "busy")
	// --verbose says when the first attempt found the key held: hold
	// catches the signals by then.
	waiting := dlockCmd(context.Background(), url, "hold", "--verbose", "busy")
	out, errb := &syncBuffer{}, &syncBuffer{}
	waiting.Stdout, waiting.Stderr = out, errb
	if err := waiting.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, waiting) })
	waitFor(t, hang, "the second hold never said it waits", func() bool { return strings.Contains(errb.String(), `dlock hold: waiting for "busy"`) })
	waiting.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, waiting); code != 128+int(syscall.SIGTERM) || out.String() != "" || !strings.Contains(errb.String(), `dlock hold: interrupted by terminated while waiting for "busy"`) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, h.cmd); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestHoldUsageErrors(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"hold"}, "dlock hold: missing KEY"},
		{[]string{"hold", "k", "--", "true"}, "dlock hold: unexpected argument after KEY: -- true (to run a command under the lock, use dlock run)"},
		{[]string{"hold", "--grace", "1s", "k"}, "dlock hold: option --grace is not defined"},
		{[]string{"hold", "-w", "-1", "k"}, `dlock hold: invalid value "-1" for -w: must not be negative`},
		{[]string{"hold", "--shared", "--limit", "2", "k"}, "dlock hold: --shared and --limit 2 cannot be combined"},
		{[]string{"hold", "--ttl", "0s", "k"}, "dlock hold: --ttl must be positive"},
		{[]string{"hold", ""}, "dlock hold: invalid key: key is empty"},
	} {
		r := runDlock(t, url, c.args...)
		if r.code != exitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, c.want) ||
			!strings.HasSuffix(r.stderr, "\nTry 'dlock hold --help' for more information.\n") || strings.Count(r.stderr, "\n") != 2 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

// holdUnderShell runs `sh -c 'dlock hold ARGS & wait'` and returns the
// shell, and hold's pid once hold printed its token line (the lock is
// held): the shell is hold's parent, as a script's is for coproc.
func holdUnderShell(t *testing.T, url string, args ...string) (sh *exec.Cmd, holdPid int) {
	t.Helper()
	sh = exec.Command("sh", append([]string{"-c", `"$0" hold "$@" & echo "$!"; wait`, bin}, args...)...)
	sh.Env = append(os.Environ(), "DLOCK_URL="+url)
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sh.WaitDelay = time.Second // a detached hold keeps the shell's pipes open
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, sh) })
	lines := make(chan string, 2)
	go func() {
		r := bufio.NewReader(out)
		for range 2 {
			l, err := r.ReadString('\n')
			if err != nil {
				close(lines)
				return
			}
			lines <- l
		}
	}()
	var got []string
	for len(got) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the shell's output ended after %q", got)
			}
			got = append(got, l)
		case <-time.After(hang):
			t.Fatalf("hang: dlock hold under sh printed %q", got)
		}
	}
	pid, err := strconv.Atoi(strings.TrimSpace(got[0]))
	if err != nil || !regexp.MustCompile(`^\d+ [0-9a-f]{32}\n$`).MatchString(got[1]) {
		t.Fatalf("dlock hold under sh printed %q, want its pid and TOKEN OWNER", got)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return sh, pid
}

// dlock hold started by a script that was killed kept renewing the lock
// for ever: it now releases it and exits once its parent is gone.
func TestHold_ReleasesWhenParentDies(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	sh, pid := holdUnderShell(t, url, "deploy")
	if err := sh.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = sh.Wait()
	// A blocking run gets the lock once hold released it.
	if r := runDlock(t, url, "run", "-w", "60", "deploy", "--", "true"); r.code != 0 {
		t.Fatalf("run -w 60 after hold's parent died: exit %d, stderr %q", r.code, r.stderr)
	}
	for deadline := time.Now().Add(hang); alive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("hang: dlock hold %d still runs after its parent died", pid)
		}
	}
}

// With --detach, dlock hold keeps the lock after its parent is gone.
func TestHold_DetachOutlivesParent(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	sh, pid := holdUnderShell(t, url, "--detach", "deploy")
	if err := sh.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = sh.Wait()
	// Ten times the poll of the parent: a hold without --detach has
	// released by then on any machine that runs it at all.
	time.Sleep(10 * parentPoll)
	if r := runDlock(t, url, "run", "-n", "deploy", "--", "true"); r.code != exitConflict {
		t.Fatalf("run -n after a detached hold's parent died: exit %d, stderr %q; want the lock still held", r.code, r.stderr)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := runDlock(t, url, "run", "-w", "60", "deploy", "--", "true"); r.code != 0 {
		t.Fatalf("run -w 60 after SIGTERM to the detached hold: exit %d, stderr %q", r.code, r.stderr)
	}
}
