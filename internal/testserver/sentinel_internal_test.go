package testserver

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestSentinelFailover(t *testing.T) {
	for _, fault := range []string{"kill", "pause"} {
		t.Run(fault, func(t *testing.T) {
			s := StartSentinel(t, WithDataPassword("data-pw"), WithSentinelPassword("sentinel-pw"))
			old := s.Primary()
			if old != s.Servers[0] {
				t.Fatalf("primary %s, want the first server %s", old.Addr(), s.Servers[0].Addr())
			}
			if _, err := old.Do("SET", "k", "v"); err != nil {
				t.Fatal(err)
			}
			s.WaitSynced(old)
			for _, r := range s.Replicas() {
				if v, err := r.Do("GET", "k"); err != nil || v != "v" {
					t.Fatalf("replica %s: %q %v", r.Addr(), v, err)
				}
			}
			switch fault {
			case "kill":
				old.Stop()
			case "pause":
				old.Pause()
				t.Cleanup(old.Resume)
			}
			p := s.WaitFailover(old)
			if v, err := p.Do("GET", "k"); err != nil || v != "v" {
				t.Fatalf("new primary %s: %q %v", p.Addr(), v, err)
			}
			if _, err := p.Do("SET", "k2", "v2"); err != nil {
				t.Fatalf("new primary %s refuses writes: %v", p.Addr(), err)
			}
			info, _ := p.Do("INFO", "replication")
			if !strings.Contains(info, "role:master") {
				t.Fatalf("new primary: %s", info)
			}
		})
	}
}

// A replica whose replication link is stalled misses the primary's
// writes; a failover to it loses them (what replica acknowledgement is
// for).
func TestSentinelStalledReplicationLink(t *testing.T) {
	s := StartSentinel(t, WithReplicas(1), WithReplicationProxies())
	old := s.Primary()
	restore := s.KeepReplicationLinks()
	s.ReplicationLinks[0].Stall()
	replies, err := old.DoSeq([]string{"SET", "k", "v"}, []string{"WAIT", "1", "200"})
	if err != nil || replies[1] != "0" {
		t.Fatalf("SET, WAIT 1 with the link stalled: %q %v, want 0 replicas", replies, err)
	}
	old.Stop()
	restore()
	p := s.WaitFailover(old)
	if v, err := p.Do("GET", "k"); err != nil || v != "" {
		t.Fatalf("the new primary has the write its link missed: %q %v", v, err)
	}
}

// fatalTB is a TB whose Fatal/Fatalf stop the helper (by panicking with
// fatalStop, recovered by run) and record the message; cleanups run at
// the end of run, as a test's would.
type fatalTB struct {
	t        *testing.T
	msg      string
	cleanups []func()
}

type fatalStop struct{}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatal(args ...any) { f.msg = fmt.Sprint(args...); panic(fatalStop{}) }

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatalStop{})
}

func (f *fatalTB) Errorf(format string, args ...any) { f.t.Errorf(format, args...) }

func (f *fatalTB) Skip(args ...any) { f.t.Skip(args...) }

func (f *fatalTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

func (f *fatalTB) TempDir() string {
	d, err := os.MkdirTemp("", "fataltb")
	if err != nil {
		f.t.Fatal(err)
	}
	f.cleanups = append(f.cleanups, func() { os.RemoveAll(d) })
	return d
}

// run calls fn with f and reports whether it stopped with Fatal.
func (f *fatalTB) run(fn func(TB)) (fataled bool) {
	defer func() {
		for i := len(f.cleanups) - 1; i >= 0; i-- {
			f.cleanups[i]()
		}
		if r := recover(); r != nil {
			if _, ok := r.(fatalStop); !ok {
				panic(r)
			}
			fataled = true
		}
	}()
	fn(f)
	return false
}

// Options StartSentinel cannot honour fail at once with a message naming
// the option.
// Symptom: StartSentinel waited 40s for a topology that could not form, or returned a group whose Primary never answered.
func TestStartSentinel_RefusesBadOptionsAtOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  SentinelOption
		want string
	}{
		{"replicas -1", WithReplicas(-1), "WithReplicas(-1)"},
		{"sentinels 0", WithSentinels(0), "WithSentinels(0)"},
		{"sentinels -2", WithSentinels(-2), "WithSentinels(-2)"},
		{"down-after 0", WithDownAfter(0), "WithDownAfter(0s)"},
		{"down-after 100µs", WithDownAfter(100_000), "WithDownAfter(100µs)"},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			f := &fatalTB{t: t}
			if !f.run(func(tb TB) { StartSentinel(tb, c.opt) }) {
				t.Fatalf("StartSentinel(%s) returned", c.want)
			}
			if !strings.Contains(f.msg, c.want) {
				t.Fatalf("StartSentinel(%s) failed with %q, which does not name the option", c.want, f.msg)
			}
		})
	}
}

// The smallest groups the options allow form and report their primary: no
// replica, and one sentinel.
func TestStartSentinel_SmallestGroupsForm(t *testing.T) {
	s := StartSentinel(t, WithReplicas(0), WithSentinels(1))
	if p := s.Primary(); p != s.Servers[0] || len(s.Replicas()) != 0 || len(s.Sentinels) != 1 {
		t.Fatalf("primary %s, %d replicas, %d sentinels", p.Addr(), len(s.Replicas()), len(s.Sentinels))
	}
}

// One sentinel of three is paused when the primary dies; the two others (a
// quorum and a majority) fail over, and WaitFailover, which asks only the
// running sentinels, sees it.
func TestSentinel_FailsOverWithOneSentinelPaused(t *testing.T) {
	s := StartSentinel(t)
	old := s.Primary()
	s.Sentinels[0].Pause()
	defer s.Sentinels[0].Resume()
	old.Stop()
	if p := s.WaitFailover(old); p == old {
		t.Fatalf("WaitFailover returned the old primary")
	}
}
