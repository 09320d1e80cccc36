package testserver_test

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/testserver"
)

func TestZooKeeperStandalone(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	if m, err := z.Mode(); err != nil || m != "standalone" {
		t.Fatalf("Mode() = %q, %v; want standalone", m, err)
	}
	if out, err := z.FourLetter("ruok"); err != nil || out != "imok" {
		t.Fatalf("ruok = %q, %v", out, err)
	}
	z.Stop()
	if _, err := z.Mode(); err == nil {
		t.Fatal("a stopped server still answers")
	}
	z.Start()
	if m, err := z.Mode(); err != nil || m != "standalone" {
		t.Fatalf("after Start: Mode() = %q, %v", m, err)
	}
}

func TestZooKeeperEnsemble(t *testing.T) {
	nodes := testserver.StartZooKeeperEnsemble(t, 3)
	leaders := 0
	for _, z := range nodes {
		m, err := z.Mode()
		if err != nil {
			t.Fatal(err)
		}
		if m == "leader" {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders, want 1", leaders)
	}
	if got := strings.Join(testserver.ZooKeeperAddrs(nodes), ","); strings.Count(got, "127.0.0.1:") != 3 {
		t.Fatalf("addrs %q", got)
	}
}
