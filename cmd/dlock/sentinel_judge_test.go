package main

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// failoverDuringRun is one schedule of the CLI failover judge: `dlock run
// -- sleep 8` holds key through redis+sentinel:// with --ttl ttl; once the
// replicas have its write, fault makes the primary fail (kill it, pause
// it, ...).
type failoverDuringRun struct {
	key   string
	ttl   time.Duration
	fault func(t *testing.T, primary *testserver.Redis)
}

// judge runs the schedule against s and judges the holder: it keeps the
// lock across the failover (exit 0, its command's) or reports it lost
// (exit 4 with LOCK LOST on stderr), and never hangs (waitExit bounds
// it); any other exit fails the test. Afterwards the key must be granted
// again, through the new primary.
func (f failoverDuringRun) judge(t *testing.T, s *testserver.Sentinel) {
	t.Helper()
	url := sentinelURL(s, s.Master(), "", "")
	old := s.Primary()
	holder, errb, _ := background(t, url, "run", "--ttl", f.ttl.String(), f.key, "--", "sh", "-c", "echo started; exec sleep 8")
	s.WaitSynced(old)
	f.fault(t, old)
	start := time.Now()
	p := s.WaitFailover(old)
	t.Logf("failover to %s after %v", p.Addr(), time.Since(start).Round(time.Millisecond))
	code := waitExit(t, holder)
	t.Logf("holder: exit %d after %v: %q", code, time.Since(start).Round(time.Millisecond), errb.String())
	switch code {
	case 0:
	case exitLost:
		if !strings.Contains(errb.String(), "LOCK LOST") {
			t.Fatalf("holder: exit %d without LOCK LOST: %q", code, errb.String())
		}
	default:
		t.Fatalf("holder: exit %d, want 0 or %d: %q", code, exitLost, errb.String())
	}
	if r := runDlock(t, url, "run", "-w", "30s", f.key, "--", "true"); r.code != 0 {
		t.Fatalf("run after the failover: exit %d %q", r.code, r.stderr)
	}
}
