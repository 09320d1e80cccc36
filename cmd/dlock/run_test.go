package main

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Symptom: --ttl above dlock.MaxTTL came back from the library after connecting as "dlock run: dlock: invalid ttl", one line without the pointer to --help.
// A --ttl above dlock.MaxTTL is a usage error of the option, found before
// connecting.
func TestRun_TTLAboveMaximumIsUsageErrorBeforeConnecting(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "hold"} {
		args := []string{cmd, "--ttl", "169h", "k"}
		if cmd == "run" {
			args = append(args, "--", "true")
		}
		// An unreachable URL: the error must come before any connecting.
		usageLines(t, runDlock(t, "redis://"+deadAddr(t), args...), cmd, "--ttl 169h0m0s is above the maximum", args)
	}
}

// startTairNoScripts starts a redis-server with the TairString module
// (CAS and CAD) and the ACL user testserver.NoScriptsUser, who may run
// no script, and returns it with the URL that logs in as that user.
func startTairNoScripts(t *testing.T) (*testserver.Redis, string) {
	t.Helper()
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	srv.AddNoScriptsUser(t)
	return srv, "redis://" + testserver.NoScriptsUser + ":" + testserver.NoScriptsPassword + "@" + srv.Addr()
}

// noLease fails the test unless key holds nothing or a release marker
// ("|<token>"), that is, no lease.
func noLease(t *testing.T, srv *testserver.Redis, key string) {
	t.Helper()
	if v, err := srv.Do("GET", key); err != nil || v != "" && !strings.HasPrefix(v, "|") {
		t.Fatalf("%s holds %q (%v), want no lease", key, v, err)
	}
}

// dlock run works on a server that refuses the user's scripts and offers
// CAS and CAD: the command runs under the lock, which is released after.
func TestRun_TairServer_RunsUnderLuaFreeLock(t *testing.T) {
	t.Parallel()
	srv, url := startTairNoScripts(t)
	r := runDlock(t, url, "run", "tk", "--", "echo", "ran")
	if r.code != 0 || r.stdout != "ran\n" {
		t.Fatalf("run on the Tair server: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	noLease(t, srv, redislock.DefaultPrefix+":{tk}")
	// The lock was released, not left to expire: another run takes it at
	// once.
	if r := runDlock(t, url, "run", "-n", "tk", "--", "echo", "again"); r.code != 0 || r.stdout != "again\n" {
		t.Fatalf("second run on the Tair server: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
