package testserver

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// Red team of issue 16: StartSentinel and its options.

// fatalTB is a TB whose Fatal/Fatalf stop the helper (by panicking with
// fatalStop, recovered by run) and record the message; cleanups run at
// the end of run, as a test's would.
type fatalTB struct {
	t        *testing.T
	msg      string
	cleanups []func()
}

type fatalStop struct{}

func (f *fatalTB) Helper()           {}
func (f *fatalTB) Fatal(args ...any) { f.msg = fmt.Sprint(args...); panic(fatalStop{}) }
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatalStop{})
}
func (f *fatalTB) Errorf(format string, args ...any) { f.t.Errorf(format, args...) }
func (f *fatalTB) Skip(args ...any)                  { f.t.Skip(args...) }
func (f *fatalTB) Cleanup(fn func())                 { f.cleanups = append(f.cleanups, fn) }
func (f *fatalTB) TempDir() string {
	d, err := os.MkdirTemp("", "rt16")
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

// TestRedTeam16Sentinel_BadOptions: options StartSentinel cannot honour
// fail at once with a message naming the option, rather than after
// starting servers and waiting (40s) for a topology that cannot form, or
// returning a group without sentinels whose Primary can never answer.
func TestRedTeam16Sentinel_BadOptions(t *testing.T) {
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

// TestRedTeam16Sentinel_SmallestGroups: the smallest groups the options
// allow form and report their primary: no replica, and one sentinel.
func TestRedTeam16Sentinel_SmallestGroups(t *testing.T) {
	s := StartSentinel(t, WithReplicas(0), WithSentinels(1))
	if p := s.Primary(); p != s.Servers[0] || len(s.Replicas()) != 0 || len(s.Sentinels) != 1 {
		t.Fatalf("primary %s, %d replicas, %d sentinels", p.Addr(), len(s.Replicas()), len(s.Sentinels))
	}
}

// TestRedTeam16Sentinel_FailoverWithSentinelPaused: one sentinel of three
// is paused when the primary dies; the two others (a quorum and a
// majority) fail over, and WaitFailover, which asks only the running
// sentinels, sees it.
func TestRedTeam16Sentinel_FailoverWithSentinelPaused(t *testing.T) {
	s := StartSentinel(t)
	old := s.Primary()
	s.Sentinels[0].Pause()
	defer s.Sentinels[0].Resume()
	old.Stop()
	if p := s.WaitFailover(old); p == old {
		t.Fatalf("WaitFailover returned the old primary")
	}
}
