package main

// Regression tests from the hostile pass over the CLI's options (issue 15).

import (
	"net"
	"strings"
	"sync"
	"testing"
)

// usageLines asserts a usage error: exit 2, nothing on stdout, and on
// stderr exactly "dlock CMD: ...want..." and the pointer to --help.
func usageLines(t *testing.T, r result, cmd, want string, args []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if r.code != exitUsage || r.stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "dlock "+cmd+": ") ||
		!strings.Contains(lines[0], want) || lines[1] != "Try 'dlock "+cmd+" --help' for more information." {
		t.Errorf("dlock %q: exit %d, stdout %q, stderr %q; want exit 2, a line with %q and the pointer to --help", args, r.code, r.stdout, r.stderr, want)
	}
}

// "--watch 1e9" (or 0, -1, 86401) is a bad interval, not a bare --watch
// followed by PREFIX "1e9" (which then made --count an extra argument);
// an explicit --count 0 is an error, not "no bound". A PREFIX that starts
// with a digit but is no number stays a PREFIX.
func TestRedTeam15_LsWatchOutOfRange(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--watch", "1e9", "--count", "1"}, `invalid value "1e9" for --watch: want a positive duration`},
		{[]string{"--watch", "86401"}, "at most 86400"},
		{[]string{"--watch", "0"}, `invalid value "0" for --watch`},
		{[]string{"--watch", "-1", "jobs/"}, `invalid value "-1" for --watch`},
		{[]string{"--watch", "1e999"}, `invalid value "1e999" for --watch`},
		{[]string{"--watch", "--count", "0"}, "--count takes a positive number"},
		{[]string{"--watch", "--count", "99999999999999999999"}, `invalid value "99999999999999999999" for --count`},
		{[]string{"--count=1"}, "goes with --watch"},
	} {
		args := append([]string{"ls"}, c.args...)
		usageLines(t, runDlock(t, url, args...), "ls", c.want, args)
	}
	if r := runDlock(t, url, "ls", "--count", "1", "--watch", "2024/"); r.code != 0 || !strings.Contains(r.stdout, "no locks held") {
		t.Errorf("ls --count 1 --watch 2024/: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// A --ttl above dlock.MaxTTL is a usage error of the option, found before
// connecting (it used to come back from the library as "dlock run: dlock:
// invalid ttl", one line without the pointer to --help).
func TestRedTeam15_TTLAboveMax(t *testing.T) {
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

// Every command's usage errors are the two lines, for the checks made
// after parsing too (not only for unknown options).
func TestRedTeam15_UsageErrorsTwoLines(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "a", "b"}, "at most one PREFIX"},
		{[]string{"ls", "--connect-timeout", "0"}, "--connect-timeout must be positive"},
		{[]string{"ls", "--connect-timeout", "-1s"}, "--connect-timeout must be positive"},
		{[]string{"ls", "--bogus"}, "option --bogus is not defined"},
		{[]string{"check", "extra"}, `no arguments expected, got "extra"`},
		{[]string{"check", "--connect-timeout", "0s"}, "--connect-timeout must be positive"},
		{[]string{"check", "--json=maybe"}, `invalid boolean value "maybe" for --json`},
		{[]string{"demo", "x"}, "unexpected argument"},
		{[]string{"demo", "--workers", "1"}, "--workers must be 2-64"},
		{[]string{"demo", "--workers", "65"}, "--workers must be 2-64"},
		{[]string{"demo", "--rounds", "0"}, "--rounds must be 1-1000"},
		{[]string{"demo", "--metrics"}, "option --metrics needs a value (ADDR)"},
		{[]string{"serve", "x"}, "unexpected argument"},
		{[]string{"serve", "--cert", "c.pem"}, "--cert without --key"},
		{[]string{"unlock"}, "one KEY expected"},
		{[]string{"unlock", "k"}, "either --owner ID or --force"},
		{[]string{"unlock", "--force", "--owner", "0123456789abcdef0123456789abcdef", "k"}, "either --owner ID or --force"},
		{[]string{"unlock", "--owner", "nothex", "k"}, "--owner"},
		{[]string{"unlock", "--force", ""}, "key"},
		{[]string{"unlock", "--force", "a", "b"}, "one KEY expected"},
		{[]string{"unlock", "--force", "--connect-timeout", "0s", "k"}, "--connect-timeout must be positive"},
	} {
		usageLines(t, runDlock(t, url, c.args...), c.args[0], c.want, c.args)
	}
}

// dlock check against a server that refuses connections says so, even
// when the client library only reports that no answer came in time
// (etcd's retries until the deadline); against one that accepts and
// never answers it does not claim a refusal. Both exit 3, in bounded time.
func TestRedTeam15_CheckRefusedVersusHung(t *testing.T) {
	t.Parallel()
	dead := deadAddr(t)
	// The refusal is found by dialling from half the timeout on: time for
	// that on a loaded machine.
	r := runDlock(t, "", "check", "--url", "etcd://"+dead, "--connect-timeout", "4s")
	if r.code != exitBackend || !strings.Contains(r.stderr, "refused") || !strings.Contains(r.stderr, dead) {
		t.Errorf("check on a refusing etcd: exit %d %q; want %d naming the refusal by %s", r.code, r.stderr, exitBackend, dead)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	for _, scheme := range []string{"etcd", "redis"} {
		r := runDlock(t, "", "check", "--url", scheme+"://"+ln.Addr().String(), "--connect-timeout", "1s")
		if r.code != exitBackend || strings.Contains(r.stderr, "refused") || !strings.Contains(r.stderr, "no answer") {
			t.Errorf("check on a hung %s: exit %d %q; want %d, no answer, no refusal", scheme, r.code, r.stderr, exitBackend)
		}
	}
}
