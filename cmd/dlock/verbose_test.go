package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// --verbose, when the key is held: "waiting for KEY, held by owner ... on
// HOST pid PID, lease ends in ...", before the wait's outcome; not when
// -n makes no wait; never a progress line (stderr is not a terminal).
func TestRunVerboseSaysWhoHolds(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	for _, url := range []string{fileURL(t), "redis://" + srv.Addr()} {
		holder, _, _ := background(t, url, "run", "k", "--", "sh", "-c", "echo started; exec sleep 60")
		r := runDlock(t, url, "run", "--verbose", "-w", "0.3", "k", "--", "echo", "should not run")
		waiting := regexp.MustCompile(fmt.Sprintf(`(?m)^dlock run: waiting for "k", held by owner [0-9a-f]{12} on \S+ pid %d, lease ends in \d+(\.\d)?s$`, holder.Process.Pid))
		loc := waiting.FindStringIndex(r.stderr)
		gaveUp := strings.Index(r.stderr, "(gave up after waiting 300ms)")
		if r.code != exitConflict || r.stdout != "" || loc == nil || gaveUp < loc[1] {
			t.Errorf("%s: -w 0.3 --verbose: exit %d, stdout %q, stderr:\n%s\nwant %s, then the give-up", url, r.code, r.stdout, r.stderr, waiting)
		}
		if strings.ContainsAny(r.stderr, "\r\x1b") {
			t.Errorf("%s: a progress line without a terminal: %q", url, r.stderr)
		}
		r = runDlock(t, url, "run", "--verbose", "-n", "k", "--", "true")
		if r.code != exitConflict || strings.Contains(r.stderr, "waiting for") {
			t.Errorf("%s: -n --verbose waits for nothing: exit %d, stderr %q", url, r.code, r.stderr)
		}
		holder.Process.Kill()
		waitExit(t, holder)
	}
}

// --verbose, once the lock is held: "acquired KEY after 1.2s, token N",
// N being CMD's DLOCK_TOKEN, after the waiting line if it waited; the
// slog events are still there.
func TestRunVerboseSaysAcquired(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	r := runDlock(t, url, "run", "--verbose", "free", "-c", `echo "token=$DLOCK_TOKEN"`)
	m := regexp.MustCompile(`token=(\d+)`).FindStringSubmatch(r.stdout)
	if r.code != 0 || m == nil || strings.Contains(r.stderr, "waiting for") ||
		!regexp.MustCompile(`(?m)^dlock run: acquired "free" after \d+\.\ds, token `+m[1]+`$`).MatchString(r.stderr) ||
		!strings.Contains(r.stderr, "msg=lock_acquired") || !strings.Contains(r.stderr, "msg=lock_released") {
		t.Fatalf("free key: exit %d, stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
	}

	// The holder ends once the waiting run has said that it waits.
	dir := t.TempDir()
	holder, _, _ := background(t, url, "run", "q", "--", "sh", "-c", "echo started; set -- "+filepath.Join(dir, "go")+"; "+shWaitFor)
	waiter := dlockCmd(t.Context(), url, "run", "--verbose", "q", "-c", `echo "token=$DLOCK_TOKEN"`)
	wout, werr := &syncBuffer{}, &syncBuffer{}
	waiter.Stdout, waiter.Stderr = wout, werr
	waiter.WaitDelay = 5 * time.Second
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, waiter) })
	waitFor(t, hang, "the second run never said it waits", func() bool { return strings.Contains(werr.String(), `dlock run: waiting for "q"`) })
	marker(t, dir, "go")
	code := waitExit(t, waiter)
	m = regexp.MustCompile(`token=(\d+)`).FindStringSubmatch(wout.String())
	if code != 0 || m == nil {
		t.Fatalf("waiting run: exit %d, stdout %q, stderr:\n%s", code, wout.String(), werr.String())
	}
	stderr := werr.String()
	waiting := strings.Index(stderr, `dlock run: waiting for "q", held by owner `)
	acquired := regexp.MustCompile(`(?m)^dlock run: acquired "q" after \d+\.\ds, token ` + m[1] + `$`).FindStringIndex(stderr)
	if waiting < 0 || acquired == nil || acquired[0] < waiting || !strings.Contains(stderr, fmt.Sprintf("pid %d,", holder.Process.Pid)) {
		t.Fatalf("waiting run: stderr lacks the waiting line (holder pid %d), then the acquired line:\n%s", holder.Process.Pid, stderr)
	}
	waitExit(t, holder)
}

// Shared holders are named as such; hold says the same lines.
func TestVerboseNamesModeAndWorksForHold(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	a, _, _ := background(t, url, "run", "--shared", "rw", "--", "sh", "-c", "echo started; exec sleep 60")
	background(t, url, "run", "--shared", "rw", "--", "sh", "-c", "echo started; exec sleep 60")
	r := runDlock(t, url, "run", "--verbose", "-w", "0.2", "rw", "--", "true")
	if r.code != exitConflict || !regexp.MustCompile(`dlock run: waiting for "rw", held shared by owner [0-9a-f]{12} on \S+ pid \d+ and 1 other holder\(s\), lease ends in`).MatchString(r.stderr) {
		t.Errorf("exclusive run against two readers: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	r = runDlock(t, url, "hold", "--verbose", "-w", "0.2", "rw")
	if r.code != exitConflict || !strings.Contains(r.stderr, `dlock hold: waiting for "rw", held shared by owner`) || !strings.Contains(r.stderr, "dlock hold: lock \"rw\" is held shared") {
		t.Errorf("hold against two readers: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	a.Process.Signal(syscall.SIGTERM)
	waitExit(t, a)
}

// --verbose against an unreachable service changes nothing: the same exit
// status as without it (3), and no holder invented.
func TestVerboseOutageIsStillBackendError(t *testing.T) {
	t.Parallel()
	u := "redis://" + deadAddr(t)
	for _, args := range [][]string{
		{"run", "--verbose", "--connect-timeout", "1s", "k", "--", "true"},
		{"run", "--verbose", "-w", "2", "--connect-timeout", "1s", "k", "--", "true"},
		{"hold", "--verbose", "--connect-timeout", "1s", "k"},
	} {
		r := runDlock(t, u, args...)
		if r.code != exitBackend || strings.Contains(r.stderr, "held by") {
			t.Errorf("%q: exit %d, stderr %q; want %d", args, r.code, r.stderr, exitBackend)
		}
	}
}
