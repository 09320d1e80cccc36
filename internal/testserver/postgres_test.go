package testserver_test

import (
	"os/exec"
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
