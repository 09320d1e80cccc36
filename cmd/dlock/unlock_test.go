package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// holdForUnlock starts `dlock run KEY` whose command prints its token and
// owner, and returns the run, its stderr, the token and the owner.
func holdForUnlock(t *testing.T, url, key string, runArgs ...string) (run *exec.Cmd, errb *syncBuffer, token uint64, owner string) {
	t.Helper()
	args := append([]string{"run", "--ttl", "2s"}, runArgs...)
	args = append(args, key, "--", "sh", "-c", `echo "$DLOCK_TOKEN $DLOCK_OWNER"; exec sleep 60`)
	cmd, errb, out := background(t, url, args...)
	f := strings.Fields(out.String())
	if len(f) != 2 {
		t.Fatalf("holder printed %q", out.String())
	}
	tok, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, errb, tok, f[1]
}

func TestUnlockForce(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	run, errb, tok, owner := holdForUnlock(t, url, "stuck")

	// Another owner: refused, exit 1, the real holder named, nothing changes.
	r := runDlock(t, url, "unlock", "--owner", dlock.NewOwner(), "stuck")
	if r.code != exitConflict || !strings.Contains(r.stderr, "pid="+strconv.Itoa(run.Process.Pid)) || !strings.Contains(r.stderr, strconv.FormatUint(tok, 10)) {
		t.Fatalf("unlock --owner OTHER: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "run", "-n", "stuck", "--", "true"); r.code != exitConflict {
		t.Fatalf("after a refused unlock the key must still be held: run -n exit %d %q", r.code, r.stderr)
	}

	// --force: released, naming the holder and its token.
	r = runDlock(t, url, "unlock", "--force", "stuck")
	want := "released stuck held by owner " + owner + " (host="
	if r.code != 0 || !strings.HasPrefix(r.stdout, want) || !strings.Contains(r.stdout, "pid="+strconv.Itoa(run.Process.Pid)+") token "+strconv.FormatUint(tok, 10)) {
		t.Fatalf("unlock --force: %d %q %q; want a line starting %q", r.code, r.stdout, r.stderr, want)
	}
	// The holder notices at its next renewal: its command is stopped, exit 4.
	if code := waitExit(t, run); code != exitLost {
		t.Fatalf("broken holder exited %d, want %d; stderr %s", code, exitLost, errb.String())
	}
	// The next holder's token is higher.
	r = runDlock(t, url, "run", "stuck", "--", "sh", "-c", `echo $DLOCK_TOKEN`)
	next, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
	if r.code != 0 || err != nil || next <= tok {
		t.Fatalf("next run: %d %q %q; want a token above %d", r.code, r.stdout, r.stderr, tok)
	}
	// A free key: nothing to do.
	if r := runDlock(t, url, "unlock", "--force", "stuck"); r.code != 0 || r.stdout != "stuck was not held\n" {
		t.Fatalf("unlock --force of a free key: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "unlock", "--owner", owner, "stuck"); r.code != exitConflict || !strings.Contains(r.stderr, "free") {
		t.Fatalf("unlock --owner of a free key: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// On Redis, by owner, with --json; among shared holders only that one goes.
func TestUnlockOwnerJSON(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	url := "redis://" + srv.Addr()
	runA, errA, tokA, ownerA := holdForUnlock(t, url, "reports", "--shared")
	_, _, tokB, _ := holdForUnlock(t, url, "reports", "--shared")

	r := runDlock(t, url, "unlock", "--json", "--owner", strings.ToUpper(ownerA), "reports")
	var out unlockJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 0 {
		t.Fatalf("unlock --json --owner: %d %q %q (%v)", r.code, r.stdout, r.stderr, err)
	}
	if out.Key != "reports" || len(out.Released) != 1 || out.Released[0].Owner != ownerA || out.Released[0].Token != tokA || out.Released[0].Mode != "shared" {
		t.Fatalf("unlock --json: %+v; want owner %s token %d, shared", out, ownerA, tokA)
	}
	if code := waitExit(t, runA); code != exitLost {
		t.Fatalf("broken reader exited %d, want %d; stderr %s", code, exitLost, errA.String())
	}
	// The other reader still holds: ls shows it alone.
	r = runDlock(t, url, "ls", "--json", "reports")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 || infos[0].Token != tokB {
		t.Fatalf("ls after breaking one reader: %v %q; want the other reader (token %d)", err, r.stdout, tokB)
	}
	// Its owner no longer holds anything: exit 1, JSON naming the holder left.
	r = runDlock(t, url, "unlock", "--json", "--owner", ownerA, "reports")
	out = unlockJSON{}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != exitConflict || len(out.Released) != 0 || len(out.Holders) != 1 || out.Holders[0].Token != tokB {
		t.Fatalf("unlock --owner of a broken reader: %d %q %q (%v)", r.code, r.stdout, r.stderr, err)
	}
}

func TestUnlockUsage(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"unlock", "k"}, "either --owner ID or --force"},
		{[]string{"unlock", "--force", "--owner", dlock.NewOwner(), "k"}, "either --owner ID or --force"},
		{[]string{"unlock", "--force"}, "one KEY"},
		{[]string{"unlock", "--force", "a", "b"}, "one KEY"},
		{[]string{"unlock", "--owner", "nothex", "k"}, "32 hex digits"},
		{[]string{"unlock", "--force", ""}, "key is empty"},
		{[]string{"unlock", "--bogus", "k"}, "bogus"},
	} {
		r := runDlock(t, url, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("dlock %q: exit %d, stderr %q; want exit %d mentioning %q", tc.args, r.code, r.stderr, exitUsage, tc.want)
		}
	}
	if r := runDlock(t, url, "unlock", "--help"); r.code != 0 || !strings.Contains(r.stderr+r.stdout, "--force") {
		t.Errorf("unlock --help: %d %q", r.code, r.stderr)
	}
	if r := runDlock(t, url, "--help"); !strings.Contains(r.stdout, "dlock unlock") {
		t.Errorf("dlock --help lacks unlock: %q", r.stdout)
	}
}

// --timeout: bare seconds or a duration; zero, negative, not-a-number,
// empty and huge values are usage errors (exit 2, the problem on one line
// and the pointer to --help), never an unlock.
func TestUnlockTimeoutUsage(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	_, _, _, owner := holdForUnlock(t, url, "held")
	for _, v := range []string{"0", "0s", "-1s", "-5", "NaN", "nan", "Inf", "-Inf", "", "1e300", "9999999999h", "25h", "soon", "1x"} {
		r := runDlock(t, url, "unlock", "--timeout", v, "--force", "held")
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.code != exitUsage || r.stdout != "" || len(lines) != 2 || !strings.Contains(lines[0], "--timeout") || !strings.HasPrefix(lines[1], "Try 'dlock unlock --help'") {
			t.Errorf("unlock --timeout %q: exit %d, stdout %q, stderr %q; want exit %d, one line naming --timeout and the pointer to --help", v, r.code, r.stdout, r.stderr, exitUsage)
		}
	}
	// None of that broke the lock.
	if r := runDlock(t, url, "run", "-n", "held", "--", "true"); r.code != exitConflict {
		t.Fatalf("after refused --timeout values the key must still be held: run -n exit %d %q", r.code, r.stderr)
	}
	// Seconds and durations, in every option form, are accepted.
	for _, args := range [][]string{
		{"--timeout", "10", "--force", "free"},
		{"--timeout", "2.5", "--force", "free"},
		{"--timeout=1m", "--force", "free"},
		{"-timeout", "24h", "--force", "free"},
		{"--timeout", "45s", "--owner", owner, "held"},
	} {
		r := runDlock(t, url, append([]string{"unlock"}, args...)...)
		if r.code != 0 {
			t.Errorf("unlock %q: exit %d %q %q", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := runDlock(t, url, "unlock", "--help"); r.code != 0 || !strings.Contains(r.stdout, "--timeout DUR|SECS") || !strings.Contains(r.stdout, "[--timeout 30s]") {
		t.Errorf("unlock --help does not show --timeout: %d %q", r.code, r.stdout)
	}
}

// timeoutSlack is how far past --timeout a command may end (process start
// and exit, closing clients, a loaded machine): the promise is an answer
// by the deadline, not a latency.
const timeoutSlack = 5 * time.Second

// checkUnlockTimedOut checks that unlock gave up on a service that does
// not answer: exit 3 within timeout+timeoutSlack, one line on stderr
// naming --timeout (not the longer --connect-timeout), nothing on stdout.
func checkUnlockTimedOut(t *testing.T, r result, took, timeout time.Duration) {
	t.Helper()
	t.Logf("exit %d after %v: %q", r.code, took.Round(time.Millisecond), r.stderr)
	if r.code != exitBackend || r.stdout != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit %d", r.code, r.stdout, r.stderr, exitBackend)
	}
	if took > timeout+timeoutSlack {
		t.Errorf("took %v with --timeout %v", took, timeout)
	}
	if n := strings.Count(strings.TrimSuffix(r.stderr, "\n"), "\n"); n > 0 || !strings.HasPrefix(r.stderr, "dlock unlock: ") {
		t.Errorf("stderr has %d lines, want one starting \"dlock unlock: \": %q", n+1, r.stderr)
	}
	if !strings.Contains(r.stderr, "--timeout "+timeout.String()) || strings.Contains(r.stderr, "--connect-timeout") {
		t.Errorf("stderr %q does not name --timeout %v as the bound that ran out", r.stderr, timeout)
	}
}

// A lock service that looks hung (a stalled link: connections are
// accepted, nothing comes back): unlock --timeout gives up by its
// timeout, even with a longer --connect-timeout.
func TestUnlockTimeoutStalledService(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	url := "redis://" + p.Addr()
	if r := runDlock(t, url, "unlock", "--force", "k"); r.code != 0 { // through the proxy, healthy
		t.Fatalf("unlock through the healthy proxy: exit %d %q", r.code, r.stderr)
	}
	p.Stall()
	defer p.Heal()
	const timeout = time.Second
	for _, args := range [][]string{
		{"unlock", "--timeout", "1s", "--connect-timeout", "30s", "--force", "k"},
		{"unlock", "--timeout", "1", "--owner", dlock.NewOwner(), "k"},
	} {
		r, took := timedRun(t, url, args...)
		checkUnlockTimedOut(t, r, took, timeout)
	}
}

// A service that answers the probe but not the break itself (Redis with
// writes paused: PING is served, the break's script waits): --timeout
// bounds the break, and the message says the lock may have been released
// or not.
func TestUnlockTimeoutBreakHangs(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	url := "redis://" + srv.Addr()
	run, _, _, _ := holdForUnlock(t, url, "paused")
	if _, err := srv.Do("CLIENT", "PAUSE", "60000", "WRITE"); err != nil {
		t.Fatalf("CLIENT PAUSE WRITE: %v", err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if _, err := srv.Do("CLIENT", "UNPAUSE"); err != nil {
				t.Errorf("CLIENT UNPAUSE: %v", err)
			}
		}
	}
	defer unpause()
	const timeout = 2 * time.Second
	r, took := timedRun(t, url, "unlock", "--timeout", timeout.String(), "--connect-timeout", "1m", "--force", "paused")
	checkUnlockTimedOut(t, r, took, timeout)
	if !strings.Contains(r.stderr, "may or may not have been released") {
		t.Errorf("stderr %q does not say the break may have happened", r.stderr)
	}
	// Once writes resume, the service answers again: unlock works.
	unpause()
	if r := runDlock(t, url, "unlock", "--force", "paused"); r.code != 0 {
		t.Fatalf("unlock after CLIENT UNPAUSE: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if code := waitExit(t, run); code != exitLost {
		t.Errorf("broken holder exited %d, want %d", code, exitLost)
	}
}

// Symptom: with --timeout below --connect-timeout, a bad URL (exit 2) and a refused TLS file alike exited 3.
// The message rewrite for a connect that ran out of --timeout keeps the
// open error's kind, not only its text.
func TestUnlockTimeoutKeepsErrorKind(t *testing.T) {
	t.Parallel()
	r := runDlock(t, "redis://bad host:1", "unlock", "--timeout", "1s", "--force", "k")
	if r.code != exitUsage || !strings.Contains(r.stderr, "bad URL") {
		t.Fatalf("bad URL with --timeout 1s: exit %d %q, want %d", r.code, r.stderr, exitUsage)
	}
}

// The 12 digits dlock ls shows must be enough for unlock --owner: a unique
// prefix of at least 8 hex digits releases that holder alone.
func TestUnlock_OwnerPrefixReleasesThatHolder(t *testing.T) {
	t.Parallel()
	url := "redis://" + testserver.StartRedis(t).Addr()
	run, errb, tok, owner := holdForUnlock(t, url, "jobs/a")
	r := runDlock(t, url, "unlock", "--owner", strings.ToUpper(owner[:12]), "jobs/a")
	want := "released jobs/a held by owner " + owner + " "
	if r.code != 0 || !strings.HasPrefix(r.stdout, want) || !strings.Contains(r.stdout, "token "+strconv.FormatUint(tok, 10)) {
		t.Fatalf("unlock --owner %s: exit %d, stdout %q, stderr %q; want a line starting %q", owner[:12], r.code, r.stdout, r.stderr, want)
	}
	if code := waitExit(t, run); code != exitLost {
		t.Fatalf("released holder exited %d, want %d; stderr %s", code, exitLost, errb.String())
	}
}

// A prefix that starts no holder's id must change nothing and name the
// real holders (exit 1), as a full id does; one too short to be safe is a
// usage error.
func TestUnlock_OwnerPrefixNoMatchOrTooShort(t *testing.T) {
	t.Parallel()
	url := "redis://" + testserver.StartRedis(t).Addr()
	run, _, _, owner := holdForUnlock(t, url, "jobs/b")
	other := "0123abcd"
	if strings.HasPrefix(owner, other) {
		other = "fedc9876"
	}
	r := runDlock(t, url, "unlock", "--owner", other, "jobs/b")
	if r.code != exitConflict || !strings.Contains(r.stderr, "pid="+strconv.Itoa(run.Process.Pid)) {
		t.Fatalf("unlock --owner %s (no match): exit %d, stderr %q; want exit 1 naming the holder", other, r.code, r.stderr)
	}
	r = runDlock(t, url, "unlock", "--owner", owner[:7], "jobs/b")
	if r.code != exitUsage || !strings.Contains(r.stderr, "at least 8 hex digits") {
		t.Fatalf("unlock --owner %s (7 digits): exit %d, stderr %q; want a usage error", owner[:7], r.code, r.stderr)
	}
	if r := runDlock(t, url, "run", "-n", "jobs/b", "--", "true"); r.code != exitConflict {
		t.Fatalf("jobs/b must still be held: run -n exit %d %q", r.code, r.stderr)
	}
}

// A prefix that starts several holders' ids must release none of them and
// list every match, so that the operator can pick one.
func TestUnlock_OwnerPrefixAmbiguousListsMatches(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := "file://" + dir
	_, _, _, first := holdForUnlock(t, url, "shared/k", "--shared", "--ttl", "60s")
	_, _, _, second := holdForUnlock(t, url, "shared/k", "--shared", "--ttl", "60s")
	// Owner ids are random: make the second share the first's 8 digits,
	// in the lease record on disk (no renewal rewrites it meanwhile: the
	// leases are 60s, renewed every 20s).
	clash := first[:8] + second[8:]
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	rewritten := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), second) {
			continue
		}
		if err := os.WriteFile(f, []byte(strings.ReplaceAll(string(b), second, clash)), 0o600); err != nil {
			t.Fatal(err)
		}
		rewritten++
	}
	if rewritten == 0 {
		t.Fatalf("no lease file in %s names owner %s", dir, second)
	}
	r := runDlock(t, url, "unlock", "--owner", first[:8], "shared/k")
	if r.code != exitUsage || !strings.Contains(r.stderr, "ambiguous") || !strings.Contains(r.stderr, first) || !strings.Contains(r.stderr, clash) || r.stdout != "" {
		t.Fatalf("unlock --owner %s: exit %d, stdout %q, stderr %q; want exit 2 listing %s and %s", first[:8], r.code, r.stdout, r.stderr, first, clash)
	}
	r = runDlock(t, url, "ls", "--json", "shared/")
	if !strings.Contains(r.stdout, first) || !strings.Contains(r.stdout, clash) {
		t.Fatalf("after a refused ambiguous unlock both holders must remain: ls %q", r.stdout)
	}
}

// Guards against: unlock hanging, or printing a wall of text, on a silent or dead server.
// A lock service that is up but silent, or dead: unlock exits 3 within
// the bound, whatever the backend.
func TestUnlock_HungOrDeadServerExits3InBound(t *testing.T) {
	t.Parallel()
	silent := silentServer(t)
	for _, u := range []string{
		"redis://" + silent,
		"redlock://" + silent + "," + deadAddr(t) + "," + deadAddr(t),
		"etcd://" + silent,
		"zk://" + silent,
		"postgres://dlock@" + silent + "/dlock?sslmode=disable",
		"redis://" + deadAddr(t),
	} {
		t.Run(strings.SplitN(u, ":", 2)[0], func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"unlock", "--connect-timeout", "1s", "--force", "k"},
				{"unlock", "--connect-timeout", "1s", "--owner", dlock.NewOwner(), "k"},
			} {
				r, took := timedRun(t, u, args...)
				if r.code != exitBackend || took > prompt {
					t.Errorf("%s %v: exit %d after %v: %q", u, args, r.code, took, r.stderr)
				}
				if strings.Count(strings.TrimSpace(r.stderr), "\n") > 3 {
					t.Errorf("%s %v: a wall of text on stderr: %q", u, args, r.stderr)
				}
			}
		})
	}
}

// Guards against: a misused unlock breaking the lock instead of failing as a usage error.
// Misuse: every form is a usage error (exit 2) with one line, never a
// break; bad URLs too.
func TestUnlock_MisuseIsUsageErrorAndBreaksNothing(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	_, _, _, owner := holdForUnlock(t, url, "held")
	for _, tc := range []struct {
		url  string
		args []string
		want string
	}{
		{url, []string{"unlock"}, "one KEY"},
		{url, []string{"unlock", "--owner", owner}, "one KEY"},
		{url, []string{"unlock", "--owner", "", "held"}, "either --owner ID or --force"},
		{url, []string{"unlock", "--owner", owner, "--force", "held"}, "either --owner ID or --force"},
		{url, []string{"unlock", "--owner", owner[:7], "held"}, "at least 8 hex digits"},
		{url, []string{"unlock", "--owner", owner + "0", "held"}, "32 hex digits"},
		{url, []string{"unlock", "--owner", strings.Repeat("g", 32), "held"}, "32 hex digits"},
		{url, []string{"unlock", "--force", "bad\xff"}, "dlock unlock"},
		{url, []string{"unlock", "--force", strings.Repeat("k", dlock.MaxKeyLen+1)}, "dlock unlock"},
		{url, []string{"unlock", "--force", "--connect-timeout", "-1s", "held"}, "connect-timeout"},
		{"bogus://x", []string{"unlock", "--force", "held"}, "dlock unlock"},
		{"redis://127.0.0.1:notaport", []string{"unlock", "--force", "held"}, "dlock unlock"},
	} {
		r := runDlock(t, tc.url, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s dlock %q: exit %d, stderr %q; want exit %d mentioning %q", tc.url, tc.args, r.code, r.stderr, exitUsage, tc.want)
		}
		if r.stdout != "" {
			t.Errorf("dlock %q printed %q on stdout", tc.args, r.stdout)
		}
	}
	// None of that broke the lock.
	if r := runDlock(t, url, "run", "-n", "held", "--", "true"); r.code != exitConflict {
		t.Fatalf("after misuse the key must still be held: run -n exit %d %q", r.code, r.stderr)
	}
	// An upper-case owner id names the holder.
	if r := runDlock(t, url, "unlock", "--owner", strings.ToUpper(owner), "held"); r.code != 0 || !strings.Contains(r.stdout, owner) {
		t.Fatalf("unlock --owner UPPER: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// Guards against: unlocking a parent key breaking a lock on a key under it.
// Hierarchical keys: unlocking "a" leaves "a/b".
func TestUnlock_ParentKeyLeavesChildHeld(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	_, _, _, child := holdForUnlock(t, url, "a/b")
	if r := runDlock(t, url, "unlock", "--force", "a"); r.code != 0 || r.stdout != "a was not held\n" {
		t.Fatalf("unlock --force a: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "unlock", "--owner", child, "a"); r.code != exitConflict {
		t.Fatalf("unlock --owner CHILD a: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "run", "-n", "a/b", "--", "true"); r.code != exitConflict {
		t.Fatalf("a/b must still be held: run -n exit %d %q", r.code, r.stderr)
	}
}
