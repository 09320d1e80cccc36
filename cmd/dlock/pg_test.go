package main

import (
	"context"
	"encoding/json"
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
	if r.code != 0 || len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "KEY OWNER HOST PID TOKEN TTL WAITERS" {
		t.Fatalf("ls on postgres: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if f := strings.Fields(lines[1]); len(f) != 7 || f[0] != "reports/pg" || f[3] != pid || f[6] != "-" {
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
		waiter := dlockCmd(context.Background(), u, "run", "handoff", "--", "sh", "-c", `echo "got $DLOCK_TOKEN"`)
		wout := &syncBuffer{}
		waiter.Stdout, waiter.Stderr = wout, wout
		waiter.WaitDelay = 5 * time.Second
		if err := waiter.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { waiter.Process.Kill(); waiter.Wait() })
		time.Sleep(300 * time.Millisecond)
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
