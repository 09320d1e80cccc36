package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A failing module's report says why it failed. Each case is a
// one-package module whose go test fails; its report (what make test
// prints) must contain the cause, not only "FAIL pkg": build errors,
// a panic in a goroutine and a test timeout were not shown.
func TestReport_ShowsWhyAPackageFailed(t *testing.T) {
	t.Setenv("GOWORK", "off")
	t.Setenv("GOFLAGS", "")
	cases := []struct {
		name, src, want string
	}{
		{"buildfail", `package a
import "testing"
func TestX(t *testing.T) { var x int = "oops"; _ = x }
`, `cannot use "oops"`},
		{"panicking", `package a
import ("testing";"time")
func TestCrash(t *testing.T) { go func(){ panic("boom in a goroutine") }(); time.Sleep(time.Second) }
`, "boom in a goroutine"},
		{"timeout", `package a
import ("testing";"time")
func TestHangs(t *testing.T) { time.Sleep(time.Hour) }
`, "test timed out"},
		{"plainfail", `package a
import "testing"
func TestFails(t *testing.T) { t.Fatal("plain failure") }
`, "plain failure"}, // control: reported today
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/"+tc.name+"\n\ngo 1.25\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "a_test.go"), []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			r := test(module{name: tc.name, dir: dir}, []string{"test", "-count=1", "-json", "-timeout", "5s", "./..."})
			var b strings.Builder
			r.report(&b)
			if r.ok() {
				t.Fatalf("a failing module reported ok:\n%s", b.String())
			}
			if !strings.Contains(b.String(), tc.want) {
				t.Errorf("the report of a failing module does not say why (%q):\n%s", tc.want, b.String())
			}
		})
	}
}

// A suite's parent test lasts as long as all its subtests: the slow list
// names the subtests that took the time, which can be split or moved.
func TestLeaves_NameTheSubtestsThatTookTheTime(t *testing.T) {
	tests := []tcase{
		{pkg: "p", name: "TestSuite/Faults/Stall", elapsed: 40 * time.Second},
		{pkg: "p", name: "TestSuite/Faults", elapsed: 45 * time.Second},
		{pkg: "p", name: "TestSuite/Basic", elapsed: time.Second},
		{pkg: "p", name: "TestSuite", elapsed: 50 * time.Second},
		{pkg: "p", name: "TestPlain", elapsed: 2 * time.Second},
		{pkg: "q", name: "TestSuite", elapsed: 3 * time.Second}, // another package's, a leaf there
	}
	var got []string
	for _, tc := range leaves(tests) {
		got = append(got, tc.pkg+" "+tc.name)
	}
	want := []string{"p TestSuite/Faults/Stall", "p TestSuite/Basic", "p TestPlain", "q TestSuite"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("leaves = %q, want %q", got, want)
	}
}

// gorace.supp suppresses go-zookeeper's lastZxid race and nothing else: a
// race in a function that the suppressed one starts (go-zookeeper's
// SetWatches goroutine calls the connection's logger, which may be
// dlock's) is still reported. Symptom: an unanchored pattern matched
// every frame of both stacks and hid such a race.
func TestRaceSuppressions_HideOnlyTheListedAccess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a race-enabled fixture (a few seconds)")
	}
	supp, err := filepath.Abs("gorace.supp")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module github.com/go-zookeeper/zk\n\ngo 1.26\n",
		"conn.go": `package zk

type Conn struct {
	lastZxid int64
	logger   func()
}

//go:noinline
func (c *Conn) recvLoop() { c.lastZxid = 7 }

//go:noinline
func (c *Conn) sendSetWatches(done chan bool) int64 {
	z := c.lastZxid
	go func() { c.logger(); done <- true }()
	return z
}
`,
		"conn_test.go": `package zk

import "testing"

var logged int

//go:noinline
func ownLogger() { logged++ }

func TestBoth(t *testing.T) {
	c := &Conn{logger: ownLogger}
	done := make(chan bool, 2)
	go func() { c.recvLoop(); done <- true }()
	c.sendSetWatches(done)
	_ = logged
	<-done
	<-done
}
`,
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-race", "-count=1", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GORACE=suppressions="+supp)
	out, _ := cmd.CombinedOutput()
	races := strings.Count(string(out), "WARNING: DATA RACE")
	if races != 1 || !strings.Contains(string(out), "ownLogger") {
		t.Fatalf("%d races reported, want the logger's only:\n%s", races, out)
	}
	if strings.Contains(string(out), "recvLoop") {
		t.Fatalf("the lastZxid race was reported:\n%s", out)
	}
}
