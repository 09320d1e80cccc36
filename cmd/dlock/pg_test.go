package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// postgres:// runs commands under the lock with increasing tokens, lists
// the held key (waiters unknown: "-" in the table, -1 in --json), refuses
// a second run of the held key with the conflict status, and hands the key
// on once the holder ends. ls creates nothing.
func TestPostgresURLAndLs(t *testing.T) {
	t.Parallel()
	pg := testserver.StartPostgres(t)
	url := pg.DSN("") + "&table=cli.locks"
	if _, err := pg.Exec("", "CREATE SCHEMA cli"); err != nil {
		t.Fatal(err)
	}
	// ls before any lock: nothing listed, and no table created.
	if r := runDlock(t, url, "ls", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("ls --json before any lock: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if out, err := pg.Exec("", "SELECT to_regclass('cli.locks') IS NULL"); err != nil || out != "t" {
		t.Fatalf("ls created the table: %q %v", out, err)
	}
	var last uint64
	for i := 0; i < 2; i++ {
		r := runDlock(t, url, "run", "pgjob", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
		if r.code != 0 || err != nil || tok <= last {
			t.Fatalf("run on postgres: %d %q %q", r.code, r.stdout, r.stderr)
		}
		last = tok
	}
	if out, err := pg.Exec("", "SELECT count(*) FROM cli.locks WHERE key = 'pgjob'"); err != nil || out != "1" {
		t.Fatalf("the lease is not in ?table=cli.locks: %q %v", out, err)
	}
	holder, _, _ := background(t, url, "run", "reports/pg", "--", "sh", "-c", "echo started; exec sleep 60")
	pid := strconv.Itoa(holder.Process.Pid)
	r := runDlock(t, url, "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != lsHeader {
		t.Fatalf("ls on postgres: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if f := strings.Fields(lines[1]); len(f) < 10 || f[0] != "reports/pg" || f[1] != "exclusive" || f[7] != "-" || holderPID(f[2]) != pid || f[6] != "-" || !strings.HasSuffix(lines[1], `"cmd=dlock run"`) {
		t.Fatalf("ls row (waiters unknown: -): %q", lines[1])
	}
	r = runDlock(t, url, "ls", "--json", "reports/")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 || infos[0].Key != "reports/pg" || infos[0].Token <= last ||
		infos[0].Metadata["pid"] != pid || infos[0].Waiters != -1 || infos[0].TTLms <= 0 {
		t.Fatalf("ls --json on postgres: %v %q %q", err, r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "ls", "--json", "nomatch/"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("empty ls --json: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// Another table is another lock space.
	if r := runDlock(t, pg.DSN(""), "run", "-n", "reports/pg", "--", "true"); r.code != 0 {
		t.Fatalf("the default table shares keys with ?table=: %d %q", r.code, r.stderr)
	}
	if r := runDlock(t, url, "run", "-n", "reports/pg", "--", "true"); r.code != exitConflict || !strings.Contains(r.stderr, "pid="+pid) {
		t.Fatalf("conflict on postgres: %d %q", r.code, r.stderr)
	}
	if r := runDlock(t, url, "run", "-w", "300ms", "reports/pg", "--", "true"); r.code != exitConflict || !strings.Contains(r.stderr, "gave up") {
		t.Fatalf("-w on a held key on postgres: %d %q", r.code, r.stderr)
	}
	// A waiter gets the key once the holder ends (woken by NOTIFY, or by
	// polling with ?listen=off).
	for _, u := range []string{url, url + "&listen=off"} {
		h, _, _ := background(t, url, "run", "handoff", "--", "sh", "-c", "echo started; exec sleep 60")
		waiter := dlockCmd(context.Background(), u, "run", "--verbose", "handoff", "--", "sh", "-c", `echo "got $DLOCK_TOKEN"`)
		wout := &syncBuffer{}
		waiter.Stdout, waiter.Stderr = wout, wout
		waiter.WaitDelay = 5 * time.Second
		if err := waiter.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopCmd(t, waiter) })
		// The holder ends once the waiter waits.
		// (The URL's user is "dlock", which dlock scrubs from its output
		// like any userinfo without a password: "xxxxx run: waiting".)
		if !waitUntil(hang, func() bool { return strings.Contains(wout.String(), ` run: waiting for "handoff"`) }) {
			t.Fatalf("hang: the waiter (%s) never said it waits: %q", redact(u), wout.String())
		}
		h.Process.Signal(syscall.SIGTERM)
		waitExit(t, h)
		start := time.Now()
		if code := waitExit(t, waiter); code != 0 || !strings.Contains(wout.String(), "got ") {
			t.Fatalf("waiter (%s): exit %d %q", redact(u), code, wout.String())
		}
		t.Logf("%s: the waiter got the key %v after the holder ended", redact(u), time.Since(start).Round(time.Millisecond))
	}
	holder.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, holder); code == exitLost {
		t.Fatalf("holder lost its lock")
	}
}

// Passwords: the right one works; a wrong one is refused (exit 3) with
// PostgreSQL's reason; no password is ever printed, by run, ls, --json or
// --verbose, nor is a ?password= parameter's.
func TestPostgresPassword(t *testing.T) {
	t.Parallel()
	pg := testserver.StartPostgres(t)
	const right, wrong = "rightPw1234", "wrongPw5678"
	for _, sql := range []string{"CREATE ROLE app LOGIN PASSWORD '" + right + "'", "CREATE DATABASE appdb OWNER app"} {
		if _, err := pg.Exec("", sql); err != nil {
			t.Fatal(err)
		}
	}
	good := "postgres://app:" + right + "@" + pg.Addr() + "/appdb?sslmode=disable"
	r := runDlock(t, good, "run", "k", "--", "sh", "-c", `echo "token $DLOCK_TOKEN"`)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "token ") {
		t.Fatalf("right password: %d %q %q", r.code, r.stdout, r.stderr)
	}
	background(t, good, "run", "held", "--", "sh", "-c", "echo started; exec sleep 60")
	cmds := [][]string{
		{"run", "k", "--", "true"},
		{"run", "-n", "--verbose", "held", "--", "true"},
		{"ls"},
		{"ls", "--json", "--verbose"},
	}
	for _, u := range []string{
		"postgres://app:" + wrong + "@" + pg.Addr() + "/appdb?sslmode=disable",
		"postgresql://" + pg.Addr() + "/appdb?sslmode=disable&user=app&password=" + wrong,
	} {
		for _, args := range cmds {
			r := runDlock(t, u, args...)
			if r.code != exitBackend || !strings.Contains(r.stderr, "refused") || !strings.Contains(r.stderr, "password authentication failed") {
				t.Errorf("%s %v: exit %d %q, want %d, refused and password authentication failed", redact(u), args, r.code, r.stderr, exitBackend)
			}
			if out := r.stdout + r.stderr; strings.Contains(out, wrong) || strings.Contains(out, right) {
				t.Errorf("%s %v printed a password:\n%s", redact(u), args, out)
			}
		}
	}
	// Right password, everything printed: no password either.
	for _, args := range append(cmds, []string{"run", "--verbose", "k", "--", "true"}, []string{"ls", "--json"}) {
		r := runDlock(t, good, args...)
		if out := r.stdout + r.stderr; strings.Contains(out, right) {
			t.Errorf("%v printed the password:\n%s", args, out)
		}
	}
	// A bad URL says so without the password (exit 2).
	for _, u := range []string{
		"postgres://app:" + right + "@" + pg.Addr() + "/appdb?sslmode=sometimes",
		"postgres://app:" + right + "@" + pg.Addr() + "/appdb?table=Bad",
		"postgres://app:" + right + "@" + pg.Addr() + "/appdb?listen=maybe",
	} {
		r := runDlock(t, u, "run", "k", "--", "true")
		if r.code != exitUsage || !strings.Contains(r.stderr, "bad URL") || strings.Contains(r.stderr, right) {
			t.Errorf("%s: exit %d %q, want %d and bad URL without the password", redact(u), r.code, r.stderr, exitUsage)
		}
	}
}

// A read-only server (here: the session's default) is refused for locking
// with an error that says so; ls still reads.
func TestPostgresReadOnly(t *testing.T) {
	t.Parallel()
	pg := testserver.StartPostgres(t)
	ro := pg.DSN("") + "&default_transaction_read_only=on"
	r := runDlock(t, ro, "run", "k", "--", "true")
	if r.code != exitBackend || !strings.Contains(r.stderr, "read-only") || !strings.Contains(r.stderr, "primary") {
		t.Fatalf("run on a read-only server: exit %d %q, want %d and read-only", r.code, r.stderr, exitBackend)
	}
	if r := runDlock(t, pg.DSN(""), "run", "k", "--", "true"); r.code != 0 {
		t.Fatalf("run: %d %q", r.code, r.stderr)
	}
	if r := runDlock(t, ro, "ls", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("ls on a read-only server: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// An unreachable server (a closed loopback port) or one that accepts
// connections and never answers is a backend error within
// --connect-timeout, never "held".
func TestPostgresUnreachable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, want string }{
		{"postgres://dlock@" + deadAddr(t) + "/postgres?sslmode=disable", "connection refused"},
		{"postgres://dlock@" + silentServer(t) + "/postgres?sslmode=disable", "no answer"},
		{"postgres://dlock@" + silentServer(t) + "/postgres?sslmode=disable&connect_timeout=60", "no answer"},
	} {
		for i, args := range [][]string{
			{"run", "--connect-timeout", "1s", "k", "--", "true"},
			{"run", "-n", "--connect-timeout", "1s", "k", "--", "true"},
			{"run", "-w", "1s", "--connect-timeout", "1s", "k", "--", "true"},
			{"ls", "--connect-timeout", "1s"},
		} {
			t.Run(fmt.Sprintf("%s/%d", c.want, i), func(t *testing.T) {
				t.Parallel()
				r, took := timedRun(t, c.url, args...)
				if r.code != exitBackend || !strings.Contains(r.stderr, "not reachable") || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, "is held") {
					t.Errorf("%s %v: exit %d %q, want %d, not reachable and %q", c.url, args, r.code, r.stderr, exitBackend, c.want)
				}
				withinBound(t, fmt.Sprintf("%s %v", c.url, args), took, time.Second)
			})
		}
	}
}

// Through PgBouncer in transaction pooling mode (pgx without its statement
// cache, as the URL says; NOTIFY does not cross it: ?listen=off).
func TestPostgresThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pg := testserver.StartPostgres(t)
	pb := testserver.StartPgBouncer(t, pg)
	url := pb.DSN("") + "&listen=off"
	var last uint64
	for i := 0; i < 2; i++ {
		r := runDlock(t, url, "run", "bouncejob", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
		if r.code != 0 || err != nil || tok <= last {
			t.Fatalf("run through pgbouncer: %d %q %q", r.code, r.stdout, r.stderr)
		}
		last = tok
	}
	holder, _, _ := background(t, url, "run", "held", "--", "sh", "-c", "echo started; exec sleep 60")
	pid := strconv.Itoa(holder.Process.Pid)
	r := runDlock(t, url, "ls", "--json")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 || infos[0].Key != "held" || infos[0].Metadata["pid"] != pid {
		t.Fatalf("ls --json through pgbouncer: %v %q %q", err, r.stdout, r.stderr)
	}
	// Seen directly on the server too.
	if r := runDlock(t, pg.DSN(""), "run", "-n", "held", "--", "true"); r.code != exitConflict || !strings.Contains(r.stderr, "pid="+pid) {
		t.Fatalf("conflict seen directly: %d %q", r.code, r.stderr)
	}
	holder.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, holder); code == exitLost {
		t.Fatal("holder lost its lock through pgbouncer")
	}
}

// The demo on PostgreSQL.
func TestDemoOnPostgres(t *testing.T) {
	t.Parallel()
	pg := testserver.StartPostgres(t)
	r := runDlock(t, "", "demo", "--url", pg.DSN(""), "--workers", "4", "--rounds", "5")
	for _, want := range []string{"expected 20: correct", "REJECTED by the guard", "with fencing:    balance = 120"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("demo on postgres: exit %d, no %q\n%s\n%s", r.code, want, r.stdout, r.stderr)
		}
	}
}
