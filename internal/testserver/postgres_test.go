package testserver_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

func TestPostgres(t *testing.T) {
	pg := testserver.StartPostgres(t)
	if _, err := pg.Exec("", "CREATE TABLE t (v int); INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	// A paused server hangs queries; a resumed one answers them.
	pg.Pause()
	done := make(chan error, 1)
	go func() { _, err := pg.Exec("", "SELECT 1"); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("a query answered while the server was paused: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	pg.Resume()
	if err := <-done; err != nil {
		t.Fatalf("query after resume: %v", err)
	}
	// A restart keeps committed data.
	pg.Restart()
	if out, err := pg.Exec("", "SELECT v FROM t"); err != nil || out != "42" {
		t.Fatalf("after restart: %q, %v", out, err)
	}
}

func TestPgBouncer(t *testing.T) {
	pg := testserver.StartPostgres(t)
	b := testserver.StartPgBouncer(t, pg)
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal(err)
	}
	// Transaction pooling: a query through pgbouncer reaches the server.
	out, err := exec.Command(psql, "postgres://dlock@"+b.Addr()+"/postgres?sslmode=disable", "-X", "-A", "-t", "-c", "SELECT current_setting('port')").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != strings.TrimPrefix(pg.Addr(), "127.0.0.1:") {
		t.Fatalf("through pgbouncer: %q, %v", out, err)
	}
}

// Stop kills every backend of the server along with the postmaster, so
// that a stop is a crash of the whole server: no backend outlives it to
// finish its statement (logging "terminating connection due to unexpected
// postmaster exit").
// Symptom: backends reparented before Stop looked them up by parent pid survived it.
func TestPostgresStop_KillsEveryBackend(t *testing.T) {
	pg := testserver.StartPostgres(t)
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal(err)
	}
	// Idle sessions: psql waiting on its standard input.
	const sessions = 8
	for range sessions {
		cmd := exec.Command(psql, pg.DSN(""), "-X", "-q")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	}
	var pids []int
	for end := time.Now().Add(10 * time.Second); len(pids) < sessions; time.Sleep(50 * time.Millisecond) {
		out, err := pg.Exec("", "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
		if err != nil {
			t.Fatal(err)
		}
		pids = pids[:0]
		for _, f := range strings.Fields(out) {
			pid, _ := strconv.Atoi(f)
			pids = append(pids, pid)
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d psql sessions connected", len(pids), sessions)
		}
	}
	pg.Stop()
	for _, pid := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z") {
			t.Errorf("backend %d still running after Stop", pid)
		}
	}
	time.Sleep(200 * time.Millisecond)
	log, _ := os.ReadFile(pg.LogPath())
	if n := strings.Count(string(log), "unexpected postmaster exit"); n > 0 {
		t.Errorf("%d backends outlived the postmaster (they noticed its exit and logged it)", n)
	}
}
