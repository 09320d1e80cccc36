package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// The CLI through Redis Sentinel: redis+sentinel:// URLs against a real
// primary, replicas and redis-sentinel processes
// (internal/testserver.StartSentinel).

// sentinelURL is the redis+sentinel:// URL of s with master, and the
// data password and sentinel password given (empty: none).
func sentinelURL(s *testserver.Sentinel, master, password, sentinelPassword string) string {
	u := "redis+sentinel://"
	if password != "" {
		u += ":" + password + "@"
	}
	u += strings.Join(s.Addrs(), ",") + "/" + master
	if sentinelPassword != "" {
		u += "?sentinel_password=" + sentinelPassword
	}
	return u
}

// run, ls and check work through Sentinel, with and without passwords.
func TestSentinelRunLsCheck(t *testing.T) {
	t.Parallel()
	for _, pw := range []bool{false, true} {
		name := "NoPasswords"
		var opts []testserver.SentinelOption
		dataPw, sentinelPw := "", ""
		if pw {
			name, dataPw, sentinelPw = "Passwords", "cliDataPw7", "cliSentinelPw7"
			opts = append(opts, testserver.WithDataPassword(dataPw), testserver.WithSentinelPassword(sentinelPw))
		}
		t.Run(name, func(t *testing.T) {
			s := testserver.StartSentinel(t, append(opts, testserver.WithReplicas(1))...)
			url := sentinelURL(s, s.Master(), dataPw, sentinelPw)
			if r := runDlock(t, url, "run", "sentinel/job", "--", "true"); r.code != 0 {
				t.Fatalf("run: exit %d %q", r.code, r.stderr)
			}
			holder, _, _ := background(t, url, "run", "--ttl", "5s", "sentinel/job", "--", "sh", "-c", "echo started; exec sleep 60")
			r := runDlock(t, url, "ls")
			if r.code != 0 || !strings.Contains(r.stdout, "sentinel/job") || !strings.Contains(r.stdout, strconv.Itoa(holder.Process.Pid)) {
				t.Fatalf("ls: exit %d %q %q", r.code, r.stdout, r.stderr)
			}
			r = runDlock(t, url, "ls", "--json", "sentinel/")
			var infos []lockInfo
			if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 || infos[0].Key != "sentinel/job" || infos[0].Token == 0 {
				t.Fatalf("ls --json: %v %q %q", err, r.stdout, r.stderr)
			}
			if r := runDlock(t, url, "run", "-n", "sentinel/job", "--", "echo", "should not run"); r.code != exitConflict || strings.Contains(r.stdout, "should not run") {
				t.Fatalf("run -n on the held key: exit %d %q %q", r.code, r.stdout, r.stderr)
			}
			r = runDlock(t, url, "check")
			if r.code != 0 || !strings.HasPrefix(r.stdout, "ok: redis-sentinel ") || withoutPersistenceWarning(r.stderr) != "" {
				t.Fatalf("check: exit %d %q %q", r.code, r.stdout, r.stderr)
			}
			if r := runDlock(t, url, "check", "--read-only"); r.code != 0 {
				t.Fatalf("check --read-only: exit %d %q %q", r.code, r.stdout, r.stderr)
			}
			for _, r := range []result{r} {
				for _, secret := range []string{dataPw, sentinelPw} {
					if secret != "" && strings.Contains(r.stdout+r.stderr, secret) {
						t.Fatalf("printed a password: %q %q", r.stdout, r.stderr)
					}
				}
			}
		})
	}
}

// sentinelSlack is how far past --connect-timeout a failing command may
// end (process start and exit, a slow machine): generous, the promise is
// "an error by the deadline", not a latency.
const sentinelSlack = 5 * time.Second

// Bad input through Sentinel: exit 3 with one clear line, within
// --connect-timeout, and never a password printed.
func TestSentinelBadInput(t *testing.T) {
	t.Parallel()
	const dataPw, sentinelPw = "rightDataPw3", "rightSentinelPw3"
	const wrongPw = "wrongSecretPw3"
	s := testserver.StartSentinel(t, testserver.WithReplicas(1),
		testserver.WithDataPassword(dataPw), testserver.WithSentinelPassword(sentinelPw))
	dead := []string{deadAddr(t), deadAddr(t), deadAddr(t)}
	cases := []struct {
		name, url string
		want      []string // one of them in the message
	}{
		{"unknown master", sentinelURL(s, "nosuchmaster", dataPw, sentinelPw), []string{`unknown master: no Sentinel that answered knows a master named "nosuchmaster"`}},
		{"wrong sentinel password", sentinelURL(s, s.Master(), dataPw, wrongPw), []string{"refused by the Sentinels: WRONGPASS"}},
		{"no sentinel password", sentinelURL(s, s.Master(), dataPw, ""), []string{"refused by the Sentinels: NOAUTH"}},
		{"wrong data password", sentinelURL(s, s.Master(), wrongPw, sentinelPw), []string{"refused by the master: WRONGPASS"}},
		{"sentinels unreachable", "redis+sentinel://" + strings.Join(dead, ",") + "/" + s.Master(), []string{"not reachable"}},
	}
	const timeout = 2 * time.Second
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"run", "--connect-timeout", timeout.String(), "k", "--", "true"},
				{"run", "-n", "--connect-timeout", timeout.String(), "k", "--", "true"},
				{"ls", "--connect-timeout", timeout.String()},
				{"check", "--connect-timeout", timeout.String()},
			} {
				r, took := timedRun(t, c.url, args...)
				t.Logf("%v: exit %d after %v: %q", args, r.code, took.Round(time.Millisecond), r.stderr)
				if r.code != exitBackend {
					t.Errorf("%v: exit %d, want %d: %q", args, r.code, exitBackend, r.stderr)
				}
				if took > timeout+sentinelSlack {
					t.Errorf("%v: took %v with --connect-timeout %v", args, took, timeout)
				}
				if n := strings.Count(strings.TrimSuffix(r.stderr, "\n"), "\n"); n > 0 {
					t.Errorf("%v: %d lines, want one: %q", args, n+1, r.stderr)
				}
				found := false
				for _, w := range c.want {
					found = found || strings.Contains(r.stderr, w)
				}
				if !found {
					t.Errorf("%v: %q names none of %q", args, r.stderr, c.want)
				}
				for _, secret := range []string{dataPw, sentinelPw, wrongPw} {
					if strings.Contains(r.stdout+r.stderr, secret) {
						t.Errorf("%v printed the password %q: %q %q", args, secret, r.stdout, r.stderr)
					}
				}
			}
		})
	}
}

// The primary is killed while dlock run holds a lock through Sentinel: the
// sentinels promote a replica; dlock either keeps the lock across the
// failover (exit 0, the command's) or reports it lost (exit 4, LOCK LOST),
// and never hangs. Afterwards the key can be taken again.
func TestSentinelFailoverDuringRun(t *testing.T) {
	t.Parallel()
	failoverDuringRun{
		key: "sentinel/failover", ttl: 5 * time.Second,
		fault: func(t *testing.T, primary *testserver.Redis) { primary.Stop() },
	}.judge(t, testserver.StartSentinel(t))
}

// One Sentinel of three hung (SIGSTOP: its port accepts, it never
// answers): ls lists through the two others (exit 0) and warns, on one
// line of stderr, naming the hung Sentinel's address; run says so with
// --verbose only. A Sentinel that refuses connections gets ls's one
// warning, not two. No password is ever printed.
func TestSentinelLsWarnsHungSentinel(t *testing.T) {
	t.Parallel()
	const dataPw, sentinelPw = "hungDataPw5", "hungSentinelPw5"
	s := testserver.StartSentinel(t, testserver.WithReplicas(1),
		testserver.WithDataPassword(dataPw), testserver.WithSentinelPassword(sentinelPw))
	url := sentinelURL(s, s.Master(), dataPw, sentinelPw)
	if r := runDlock(t, url, "run", "sentinel/hung", "--", "true"); r.code != 0 {
		t.Fatalf("run with every Sentinel up: exit %d %q", r.code, r.stderr)
	}
	noSecrets := func(r result) {
		t.Helper()
		for _, secret := range []string{dataPw, sentinelPw} {
			if strings.Contains(r.stdout+r.stderr, secret) {
				t.Errorf("printed a password: %q %q", r.stdout, r.stderr)
			}
		}
	}
	// warnings are the stderr lines warning about the sentinel at addr
	// (with --verbose, go-redis's own logs name it too).
	warnings := func(stderr, addr string) []string {
		var ws []string
		for _, l := range strings.Split(stderr, "\n") {
			if strings.HasPrefix(l, "warning: ") && strings.Contains(l, addr) {
				ws = append(ws, l)
			}
		}
		return ws
	}
	hung := s.Sentinels[1]
	hung.Pause()
	defer hung.Resume()
	holder, _, _ := background(t, url, "run", "--ttl", "10s", "sentinel/hung", "--", "sh", "-c", "echo started; exec sleep 60")
	const timeout = 3 * time.Second
	for _, args := range [][]string{
		{"ls", "--connect-timeout", timeout.String()},
		{"ls", "--json", "--connect-timeout", timeout.String()},
	} {
		r, took := timedRun(t, url, args...)
		t.Logf("%v: exit %d after %v: %q %q", args, r.code, took.Round(time.Millisecond), r.stdout, r.stderr)
		noSecrets(r)
		if r.code != 0 || !strings.Contains(r.stdout, "sentinel/hung") || !strings.Contains(r.stdout, strconv.Itoa(holder.Process.Pid)) {
			t.Errorf("%v with one Sentinel of three hung: exit %d %q %q; want the listing", args, r.code, r.stdout, r.stderr)
		}
		if took > timeout+sentinelSlack {
			t.Errorf("%v: took %v with --connect-timeout %v", args, took, timeout)
		}
		ws := warnings(r.stderr, hung.Addr())
		if len(ws) != 1 || !strings.HasPrefix(ws[0], "warning: sentinel "+hung.Addr()+" ") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: stderr %q; want one line warning about the hung sentinel %s", args, r.stderr, hung.Addr())
		}
		for _, other := range []*testserver.Redis{s.Sentinels[0], s.Sentinels[2]} {
			if w := warnings(r.stderr, other.Addr()); len(w) != 0 {
				t.Errorf("%v: a warning about %s, which answers: %q", args, other.Addr(), w)
			}
		}
	}
	// Other commands: silent, unless --verbose.
	r := runDlock(t, url, "run", "--connect-timeout", timeout.String(), "sentinel/other", "--", "true")
	noSecrets(r)
	if r.code != 0 || len(warnings(r.stderr, hung.Addr())) != 0 {
		t.Errorf("run without --verbose: exit %d %q; want 0 and no warning", r.code, r.stderr)
	}
	r = runDlock(t, url, "run", "--verbose", "--connect-timeout", timeout.String(), "sentinel/other", "--", "true")
	noSecrets(r)
	if ws := warnings(r.stderr, hung.Addr()); r.code != 0 || len(ws) != 1 || !strings.HasPrefix(ws[0], "warning: sentinel ") {
		t.Errorf("run --verbose: exit %d %q; want 0 and one warning naming %s", r.code, r.stderr, hung.Addr())
	}

	// A Sentinel that refuses connections: ls's own warning, once.
	hung.Resume()
	gone := s.Sentinels[2]
	gone.Stop()
	r = runDlock(t, url, "ls", "--connect-timeout", timeout.String())
	t.Logf("ls with %s stopped: exit %d %q", gone.Addr(), r.code, r.stderr)
	noSecrets(r)
	if ws := warnings(r.stderr, gone.Addr()); r.code != 0 || len(ws) != 1 {
		t.Errorf("ls with a stopped Sentinel: exit %d %q; want 0 and one warning naming %s", r.code, r.stderr, gone.Addr())
	}
}

// Symptom: one hung Sentinel of three made every redis+sentinel:// command fail with "not reachable" after the whole --connect-timeout.
// One Sentinel of three is hung (SIGSTOP: its port accepts connections,
// it never answers), the two others and the data servers are fine.
// Sentinel exists to survive that; run, ls and check must work, within
// --connect-timeout. (go-redis asks every Sentinel for the master at once
// and waits for all of them, so the hung one would take the whole
// --connect-timeout.)
func TestSentinel_OneHungOfThreeStillWorks(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1))
	for _, hung := range []int{0, 2} {
		t.Run(strings.ReplaceAll(s.Sentinels[hung].Addr(), ":", "_"), func(t *testing.T) {
			s.Sentinels[hung].Pause()
			defer s.Sentinels[hung].Resume()
			url := sentinelURL(s, s.Master(), "", "")
			const timeout = 2 * time.Second
			for _, args := range [][]string{
				{"run", "--connect-timeout", timeout.String(), "hung-sentinel/k", "--", "true"},
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

// Guards against: leaving out the Sentinels that do not answer adding a wait of its own to the deadline.
// With every Sentinel hung the commands still fail (exit 3, "not
// reachable") within --connect-timeout.
func TestSentinel_AllHungFailsWithinConnectTimeout(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1))
	for _, sn := range s.Sentinels {
		sn.Pause()
		defer sn.Resume()
	}
	const timeout = 2 * time.Second
	for _, args := range [][]string{
		{"run", "--connect-timeout", timeout.String(), "hung-sentinel/k", "--", "true"},
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

// Guards against: dlock run hanging through a failover whose primary is paused rather than killed.
// TestSentinelFailoverDuringRun with the primary paused (SIGSTOP) instead
// of killed: requests to it hang rather than fail. The holder keeps the
// lock (exit 0, its command's) or reports it lost (exit 4, LOCK LOST), and
// never hangs; afterwards the key is granted on the new primary.
func TestSentinelFailoverDuringRun_PausedPrimary(t *testing.T) {
	t.Parallel()
	failoverDuringRun{
		key: "paused-primary/k", ttl: 3 * time.Second,
		fault: func(t *testing.T, primary *testserver.Redis) {
			primary.Pause()
			t.Cleanup(primary.Resume)
		},
	}.judge(t, testserver.StartSentinel(t))
}

// Symptom: asking the Sentinels first used up --connect-timeout, so rediss+sentinel:// to plaintext Sentinels no longer named the mismatch.
// rediss+sentinel:// to several plaintext Sentinels (each waits for the
// end of a line that never comes) names the mismatch, within
// --connect-timeout: asking the Sentinels first (answeringSentinels)
// leaves the diagnosis its time.
func TestSentinel_TLSMismatchNamedWithSeveralSentinels(t *testing.T) {
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
