package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/testserver"
)

// -w 0 is one attempt, like -n (and like flock(1)'s -w 0): on a held key
// it fails at once instead of waiting for ever; on a free key CMD runs.
func TestWaitZeroIsOneAttempt(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	holder, _, _ := background(t, url, "run", "busy", "--", "sh", "-c", "echo started; exec sleep 60")
	for _, w := range []string{"0", "0s", "0.0"} {
		r := runDlock(t, url, "run", "-w", w, "busy", "--", "echo", "should not run")
		if r.code != exitConflict || strings.Contains(r.stdout, "should not run") {
			t.Errorf("-w %s on a held key: exit %d, stdout %q, stderr %q", w, r.code, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, fmt.Sprintf("pid=%d", holder.Process.Pid)) || strings.Contains(r.stderr, "gave up after waiting") {
			t.Errorf("-w %s: want the holder named, as -n does: %q", w, r.stderr)
		}
		if r := runDlock(t, url, "run", "--wait", w, "free", "--", "echo", "ran"); r.code != 0 || !strings.Contains(r.stdout, "ran") {
			t.Errorf("--wait %s on a free key: exit %d %q %q", w, r.code, r.stdout, r.stderr)
		}
	}
}

// A --wait shorter than --connect-timeout still gets one whole attempt,
// bounded by --connect-timeout: -w 1us takes a free key, and on a held key
// reports the holder (exit 1), on every kind of backend.
func TestShortWaitStillMakesOneAttempt(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	for _, url := range []string{fileURL(t), "redis://" + srv.Addr()} {
		for _, w := range []string{"1us", "0.000001", "1ns"} {
			r := runDlock(t, url, "run", "-w", w, "k", "--", "echo", "ran")
			if r.code != 0 || !strings.Contains(r.stdout, "ran") {
				t.Errorf("%s: -w %s on a free key: exit %d %q %q", url, w, r.code, r.stdout, r.stderr)
			}
		}
		holder, _, _ := background(t, url, "run", "k", "--", "sh", "-c", "echo started; exec sleep 60")
		r := runDlock(t, url, "run", "-w", "1us", "k", "--", "echo", "should not run")
		if r.code != exitConflict || strings.Contains(r.stdout, "should not run") || !strings.Contains(r.stderr, fmt.Sprintf("pid=%d", holder.Process.Pid)) {
			t.Errorf("%s: -w 1us on a held key: exit %d %q %q", url, r.code, r.stdout, r.stderr)
		}
		holder.Process.Kill()
		waitExit(t, holder)
	}
}

// Symptom: with -n, unmet ?acks=1 was reported as "no answer ... within --connect-timeout".
// ?acks=1 on a Redis without replicas: with -n and with -w the cause is
// kept; without -w the wait still ends. Every way it is one line, exit
// 3, naming the missing acknowledgement. (One key each: an attempt cut
// short at the end of a wait may leave its lease behind until the lease
// runs out.)
func TestRun_UnmetAcksReportsTheCause(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	url := "redis://" + srv.Addr() + "?acks=1"
	for _, args := range [][]string{
		{"run", "-n", "k1", "--", "true"},
		{"hold", "-n", "k2"},
		{"run", "-w", "3s", "k3", "--", "true"},
		{"hold", "-w", "1s", "k4"},
		// Without -w the wait has no deadline: unmet acks must still
		// end it (a wait for ever, without a word, was the symptom).
		{"run", "k5", "--", "true"},
		{"hold", "k6"},
	} {
		r := runDlock(t, url, args...)
		prefix := "dlock " + args[0] + ": redis://" + srv.Addr() + "?acks=1: "
		if r.code != exitBackend || r.stdout != "" || !strings.HasPrefix(r.stderr, prefix) ||
			!strings.Contains(r.stderr, "0 of 1 replicas acknowledged") || strings.Contains(r.stderr, "no answer to the lock request") ||
			strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") || strings.HasPrefix(r.stderr[len(prefix):], "dlock: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 3, one line naming the unacknowledged attempt", args, r.code, r.stdout, r.stderr)
		}
	}
}
