package main

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// Red team of issue 16 (Sentinel): the CLI through redis+sentinel:// URLs.

// TestRedTeam16Sentinel_OneSentinelHung: one Sentinel of three is hung
// (SIGSTOP: its port accepts connections, it never answers), the two
// others and the data servers are fine. Sentinel exists to survive that;
// run, ls and check must work, within --connect-timeout. (go-redis asks
// every Sentinel for the master at once and waits for all of them, so the
// hung one used to take the whole --connect-timeout and every command
// failed with "not reachable".)
func TestRedTeam16Sentinel_OneSentinelHung(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1))
	for _, hung := range []int{0, 2} {
		t.Run(strings.ReplaceAll(s.Sentinels[hung].Addr(), ":", "_"), func(t *testing.T) {
			s.Sentinels[hung].Pause()
			defer s.Sentinels[hung].Resume()
			url := sentinelURL(s, s.Master(), "", "")
			const timeout = 2 * time.Second
			for _, args := range [][]string{
				{"run", "--connect-timeout", timeout.String(), "rt16/hung", "--", "true"},
				{"ls", "--connect-timeout", timeout.String()},
				{"check", "--connect-timeout", timeout.String()},
			} {
				r, took := timedRun(t, url, args...)
				t.Logf("%v: exit %d after %v: %q %q", args, r.code, took.Round(time.Millisecond), r.stdout, r.stderr)
				if r.code != 0 {
					t.Errorf("%v with one Sentinel of three hung: exit %d %q", args, r.code, r.stderr)
				}
				if took > timeout+sentinelSlack {
					t.Errorf("%v: took %v with --connect-timeout %v", args, took, timeout)
				}
			}
		})
	}
}

// TestRedTeam16Sentinel_AllSentinelsHung: with every Sentinel hung the
// commands still fail (exit 3, "not reachable") within --connect-timeout:
// leaving out the Sentinels that do not answer must not add a wait of its
// own to the deadline.
func TestRedTeam16Sentinel_AllSentinelsHung(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1))
	for _, sn := range s.Sentinels {
		sn.Pause()
		defer sn.Resume()
	}
	const timeout = 2 * time.Second
	for _, args := range [][]string{
		{"run", "--connect-timeout", timeout.String(), "rt16/hung", "--", "true"},
		{"check", "--connect-timeout", timeout.String()},
	} {
		r, took := timedRun(t, sentinelURL(s, s.Master(), "", ""), args...)
		t.Logf("%v: exit %d after %v: %q", args, r.code, took.Round(time.Millisecond), r.stderr)
		if r.code != exitBackend || !strings.Contains(r.stderr, "not reachable") {
			t.Errorf("%v with every Sentinel hung: exit %d %q, want %d, not reachable", args, r.code, r.stderr, exitBackend)
		}
		if took > timeout+sentinelSlack {
			t.Errorf("%v: took %v with --connect-timeout %v", args, took, timeout)
		}
	}
}

// TestRedTeam16Sentinel_PausedPrimaryDuringRun: TestSentinelFailoverDuringRun
// with the primary paused (SIGSTOP) instead of killed: requests to it hang
// rather than fail. The holder keeps the lock (exit 0, its command's) or
// reports it lost (exit 4, LOCK LOST), and never hangs; afterwards the key
// is granted on the new primary.
func TestRedTeam16Sentinel_PausedPrimaryDuringRun(t *testing.T) {
	t.Parallel()
	failoverDuringRun{
		key: "rt16/paused", ttl: 3 * time.Second,
		fault: func(t *testing.T, primary *testserver.Redis) {
			primary.Pause()
			t.Cleanup(primary.Resume)
		},
	}.judge(t, testserver.StartSentinel(t))
}

// TestRedTeam16Sentinel_TLSMismatchSeveral: rediss+sentinel:// to several
// plaintext Sentinels (each waits for the end of a line that never comes)
// still names the mismatch, within --connect-timeout: asking the Sentinels
// first (answeringSentinels) must leave the diagnosis its time.
func TestRedTeam16Sentinel_TLSMismatchSeveral(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1))
	url := "rediss+sentinel://" + strings.Join(s.Addrs(), ",") + "/" + s.Master()
	const timeout = 6 * time.Second // the mismatch is looked for from half of it on
	r, took := timedRun(t, url, "run", "--connect-timeout", timeout.String(), "k", "--", "true")
	t.Logf("exit %d after %v: %q", r.code, took.Round(time.Millisecond), r.stderr)
	if r.code != exitBackend || !strings.Contains(r.stderr, "use redis+sentinel:// instead of rediss+sentinel://") {
		t.Errorf("rediss+sentinel:// to plaintext Sentinels: exit %d %q, want %d naming the mismatch", r.code, r.stderr, exitBackend)
	}
	if took > timeout+sentinelSlack {
		t.Errorf("took %v with --connect-timeout %v", took, timeout)
	}
}
