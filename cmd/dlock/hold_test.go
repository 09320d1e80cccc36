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

// Symptom: dlock hold started by a script that was killed kept renewing the lock for ever.
// It releases the lock and exits once its parent is gone.
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

// --parent PID: dlock hold releases the lock and exits 0 when that
// process exits, whoever its own parent is. Symptom: a container's
// entrypoint script runs as pid 1, and dlock hold took it for init and
// refused, so only --detach (no release when the script dies) got past.
func TestHold_ParentFlagReleasesWhenThatProcessExits(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	watched := exec.Command("sleep", "60")
	if err := watched.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watched.Process.Kill(); watched.Wait() })
	h := startHold(t, url, "--parent", strconv.Itoa(watched.Process.Pid), "deploy")
	if r := runDlock(t, url, "run", "-n", "deploy", "--", "true"); r.code != exitConflict {
		t.Fatalf("run -n while held: exit %d, stderr %q; want the lock held", r.code, r.stderr)
	}
	if err := watched.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = watched.Wait()
	if code := waitExit(t, h.cmd); code != 0 {
		t.Fatalf("dlock hold after process --parent exited: exit %d, stderr %q; want 0", code, h.stderr.String())
	}
	if r := runDlock(t, url, "run", "-n", "deploy", "--", "true"); r.code != 0 {
		t.Fatalf("run -n after the hold ended: exit %d, stderr %q; want the lock free", r.code, r.stderr)
	}
}

// A script run as pid 1 (a container's entrypoint, here in a PID
// namespace of the test's own) cannot keep dlock hold as its parent: hold
// takes pid 1 for init and refuses, pointing to --parent $$, with which it
// holds. When the namespace ends, hold dies with it and its lease runs
// out. Symptom: only --detach got past the refusal.
func TestHold_ParentFlagHoldsUnderPidOneScript(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace needs root here")
	}
	url := fileURL(t)
	ns := func(script string) *exec.Cmd {
		cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, bin)
		cmd.Env = append(os.Environ(), "DLOCK_URL="+url)
		return cmd
	}
	refused := ns(`"$0" hold k`)
	out, _ := refused.CombinedOutput()
	if code := refused.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(string(out), "--parent $$") {
		t.Fatalf("hold under a pid-1 script: exit %d, output %q; want 2 and a pointer to --parent $$", code, out)
	}
	holder := ns(`"$0" hold --ttl 2s --parent $$ k`)
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errb := &syncBuffer{}
	holder.Stderr = errb
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if !regexp.MustCompile(`^\d+ [0-9a-f]{32}\n$`).MatchString(l) {
			t.Fatalf("hold --parent $$ under a pid-1 script printed %q; stderr %q", l, errb.String())
		}
	case <-time.After(hang):
		t.Fatalf("hang: hold --parent $$ under a pid-1 script printed nothing; stderr %q", errb.String())
	}
	if r := runDlock(t, url, "run", "-n", "k", "--", "true"); r.code != exitConflict {
		t.Fatalf("run -n while held: exit %d, stderr %q; want the lock held", r.code, r.stderr)
	}
	// The container stops: its pid 1 is killed, and every process of the
	// namespace with it.
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	if r := runDlock(t, url, "run", "-w", "60", "k", "--", "true"); r.code != 0 {
		t.Fatalf("run -w 60 after the namespace ended: exit %d, stderr %q; want the lease run out", r.code, r.stderr)
	}
}

// --parent must name a running process, and cannot be combined with
// --detach: both are usage errors, before the lock is taken.
func TestHold_ParentFlagNeedsARunningProcess(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(gone.Process.Pid)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--parent", pid, "k"}, "dlock hold: not holding \"k\": --parent " + pid + ": no running process " + pid},
		{[]string{"--parent", "0", "k"}, "dlock hold: invalid value \"0\" for --parent"},
		{[]string{"--parent", strconv.Itoa(os.Getpid()), "--detach", "k"}, "dlock hold: --detach and --parent " + strconv.Itoa(os.Getpid()) + " cannot be combined"},
	} {
		r := runDlock(t, url, append([]string{"hold"}, c.args...)...)
		if r.code != exitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, c.want) {
			t.Errorf("hold %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
	if r := runDlock(t, url, "run", "-n", "k", "--", "true"); r.code != 0 {
		t.Fatalf("run -n after the refused holds: exit %d, stderr %q; want the lock free", r.code, r.stderr)
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

// orphanHold starts `dlock hold ARGS...` in a process whose parent has
// already exited when dlock starts: a shell starts a second shell in the
// background and exits; the second one, orphaned, execs dlock hold once
// the test writes to a FIFO, with its output in files. It returns hold's
// pid and the files; the test is skipped where orphans go to a subreaper
// rather than to init.
func orphanHold(t *testing.T, url string, args ...string) (pid int, stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	fifo, stdout, stderr := dir+"/go", dir+"/out", dir+"/err"
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	inner := `echo $$; read x <"$1"; shift 3; exec "$@"`
	sh := exec.Command("sh", append([]string{"-c", `s=$1; shift; sh -c "$s" inner "$@" >"$2" 2>"$3" </dev/null & echo $!; exit 0`, "outer", inner, fifo, stdout, stderr, bin, "hold"}, args...)...)
	sh.Env = append(os.Environ(), "DLOCK_URL="+url)
	out, err := sh.Output()
	if err != nil {
		t.Fatalf("sh: %v", err)
	}
	// The inner shell prints its pid to the stdout file; $! is the same.
	pid, err = strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("sh printed %q", out)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	// The outer shell has exited: the inner one is an orphan now.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^PPid:\s+(\d+)$`).FindSubmatch(b); m == nil || string(m[1]) != "1" {
		t.Skipf("an orphan here goes to a subreaper, not to init: %q", m)
	}
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("go\n"))
	f.Close()
	for deadline := time.Now().Add(hang); alive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("hang: orphaned dlock hold %d still runs", pid)
		}
	}
	return pid, stdout, stderr
}

// Symptom: dlock hold started after its starter had exited (its parent already init) kept renewing the lock for ever.
// It refuses to hold the lock, as a usage error that points to --detach.
func TestHold_RefusesWhenParentAlreadyGone(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	_, stdout, stderr := orphanHold(t, url, "deploy")
	out, _ := os.ReadFile(stdout)
	errb, _ := os.ReadFile(stderr)
	want := "dlock hold: not holding \"deploy\": its parent process is pid 1 (init): the process that started it is gone, or is init; use --parent PID to watch the process that should keep it (a script run as pid 1: --parent $$), or --detach to hold it until a signal\n" +
		"Try 'dlock hold --help' for more information.\n"
	// The inner shell's own line ($$) comes first on stdout.
	if lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n"); len(lines) != 1 || string(errb) != want {
		t.Fatalf("orphaned dlock hold: stdout %q, stderr %q; want no token and %q", out, errb, want)
	}
	if r := runDlock(t, url, "run", "-n", "deploy", "--", "true"); r.code != 0 {
		t.Fatalf("run -n after the refused hold: exit %d, stderr %q; want the lock free", r.code, r.stderr)
	}
}

// With --detach, a hold whose parent is already init holds the lock (the
// usual way to run it as a service).
func TestHold_DetachHoldsWhenParentAlreadyGone(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	dir := t.TempDir()
	fifo := dir + "/go"
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Hold prints its token to the FIFO: read once the lock is held.
	inner := `exec "$0" hold --detach deploy >"$1" 2>/dev/null </dev/null`
	sh := exec.Command("sh", "-c", `sh -c "$1" "$2" "$3" >/dev/null 2>&1 </dev/null & echo $!; exit 0`, "outer", inner, bin, fifo)
	sh.Env = append(os.Environ(), "DLOCK_URL="+url)
	out, err := sh.Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("sh printed %q", out)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	line := make(chan string, 1)
	go func() {
		f, err := os.Open(fifo)
		if err != nil {
			line <- err.Error()
			return
		}
		defer f.Close()
		l, _ := bufio.NewReader(f).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if !regexp.MustCompile(`^\d+ [0-9a-f]{32}\n`).MatchString(l) {
			t.Fatalf("detached orphaned hold printed %q", l)
		}
	case <-time.After(hang):
		t.Fatal("hang: the detached orphaned hold printed nothing")
	}
	if r := runDlock(t, url, "run", "-n", "deploy", "--", "true"); r.code != exitConflict {
		t.Fatalf("run -n while the detached hold runs: exit %d, stderr %q; want the lock held", r.code, r.stderr)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := runDlock(t, url, "run", "-w", "60", "deploy", "--", "true"); r.code != 0 {
		t.Fatalf("run -w 60 after SIGTERM to the detached hold: exit %d, stderr %q", r.code, r.stderr)
	}
}

// Symptom: dlock hold went on waiting after the script that started it was killed, then held the lock for nobody.
// It stops waiting and exits, and never takes the lock.
func TestHold_StopsWaitingWhenParentDies(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	holder := startHold(t, url, "deploy")
	sh := exec.Command("sh", "-c", `"$0" hold --verbose deploy & echo "$!"; wait`, bin)
	sh.Env = append(os.Environ(), "DLOCK_URL="+url)
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errb := &syncBuffer{}
	sh.Stderr = errb
	sh.WaitDelay = time.Second // the waiting hold keeps the shell's pipes open
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, sh) })
	rest := &syncBuffer{}
	first := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		l, _ := r.ReadString('\n')
		first <- l
		io.Copy(rest, r) // a token line here would be the waiter's
	}()
	var pid int
	select {
	case l := <-first:
		if pid, err = strconv.Atoi(strings.TrimSpace(l)); err != nil {
			t.Fatalf("sh printed %q", l)
		}
	case <-time.After(hang):
		t.Fatal("hang: sh printed no pid")
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	waitFor(t, hang, "the second hold never said it waits", func() bool { return strings.Contains(errb.String(), `dlock hold: waiting for "deploy"`) })
	if err := sh.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = waitOf(sh)
	for deadline := time.Now().Add(hang); alive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("hang: the waiting dlock hold %d still runs after its parent died", pid)
		}
	}
	// sh's Wait returns once its stderr copy has read everything the hold
	// wrote: a hold just exited may have output still in the pipe.
	select {
	case <-waitOf(sh).done:
	case <-time.After(hang):
		t.Fatal("hang: sh not reaped after the waiting hold exited")
	}
	if want := `dlock hold: the process that started dlock hold exited while waiting for "deploy": gave up waiting`; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q; want %q", errb.String(), want)
	}
	// Released now, the lock goes to nobody: the waiter is gone.
	holder.cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, holder.cmd); code != 0 {
		t.Fatalf("holder: exit %d, stderr %s", code, holder.stderr.String())
	}
	if r := runDlock(t, url, "run", "-n", "deploy", "--", "true"); r.code != 0 {
		t.Fatalf("run -n after the holder released: exit %d, stderr %q; want the lock free", r.code, r.stderr)
	}
	if rest.String() != "" {
		t.Errorf("the waiter printed %q after its parent died", rest.String())
	}
}

// --max-hold on hold: once the cap is reached the lock is released (the
// next run gets it at once, long before the 30s lease could run out) and
// hold exits 5, saying why.
func TestHold_MaxHoldReleasesAndExits5(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	h := startHold(t, url, "--max-hold", "1s", "capped")
	if code := waitExit(t, h.cmd); code != exitMaxHold || !strings.Contains(h.stderr.String(), `dlock hold: --max-hold 1s reached: released "capped"`) {
		t.Fatalf("exit %d, stderr %q; want %d and the cap named", code, h.stderr.String(), exitMaxHold)
	}
	if r := runDlock(t, url, "run", "-n", "capped", "--", "true"); r.code != 0 {
		t.Fatalf("run -n after the capped hold exited: exit %d, stderr %q; want the lock released", r.code, r.stderr)
	}
}

// Symptom: with --max-hold at or below --ttl the first deadline was already the cap's, so any loss read as the cap.
// A lock broken under a capped hold is a loss (exit 4), not the planned
// end at the cap (exit 5).
func TestHold_BrokenUnderMaxHoldIsLost(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	h := startHold(t, url, "--ttl", "6s", "--max-hold", "5s", "capbroken")
	if r := runDlock(t, url, "unlock", "--force", "capbroken"); r.code != 0 {
		t.Fatalf("unlock --force: exit %d, stderr %q", r.code, r.stderr)
	}
	if code := waitExit(t, h.cmd); code != exitLost || strings.Contains(h.stderr.String(), "--max-hold 5s reached") {
		t.Fatalf("exit %d, stderr %q; want %d and no claim that the cap was reached", code, h.stderr.String(), exitLost)
	}
}
