package main

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
)

// Issue 15's hostile review of `dlock unlock`: attacks kept as tests.

// A lock service that is up but silent, or dead: unlock exits 3 within
// the bound, whatever the backend.
func TestRedTeam15_UnlockHungServer(t *testing.T) {
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

// Misuse: every form is a usage error (exit 2) with one line, never a
// break; bad URLs too.
func TestRedTeam15_UnlockMisuse(t *testing.T) {
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

// Hierarchical keys: unlocking "a" leaves "a/b".
func TestRedTeam15_UnlockHierarchical(t *testing.T) {
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
