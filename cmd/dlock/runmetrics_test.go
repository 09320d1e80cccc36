package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// metrics are parsed Prometheus text: the families by name.
type metrics map[string]*dto.MetricFamily

// parseMetrics parses b, Prometheus text format, as node_exporter's
// textfile collector and a scrape would.
func parseMetrics(b []byte) (metrics, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// readMetricsFile parses the metrics file at path.
func readMetricsFile(t *testing.T, path string) metrics {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := parseMetrics(b)
	if err != nil {
		t.Fatalf("%s does not parse: %v\n%s", path, err, b)
	}
	return ms
}

// value returns the value of the series of name whose labels include
// labels ("name=value" each): a gauge's or a counter's value, a
// histogram's sample count.
func (ms metrics) value(name string, labels ...string) (float64, bool) {
	mf := ms[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// want fails the test unless the series of name with labels has value v.
func (ms metrics) want(t *testing.T, v float64, name string, labels ...string) {
	t.Helper()
	got, ok := ms.value(name, labels...)
	if !ok || got != v {
		t.Errorf("%s%v = %v (present %v), want %v", name, labels, got, ok, v)
	}
}

// wantAbsent fails the test if a series of name with labels is present.
func (ms metrics) wantAbsent(t *testing.T, name string, labels ...string) {
	t.Helper()
	if got, ok := ms.value(name, labels...); ok {
		t.Errorf("%s%v = %v, want no such series", name, labels, got)
	}
}

// dirNames lists dir's entries.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// A cron fleet cannot alert on a job's outcome if dlock run exits without
// writing its exit code, hold time and acquisition to --metrics-file.
func TestRun_MetricsFileWrittenOnExit(t *testing.T) {
	t.Parallel()
	url := "redis://" + testserver.StartRedis(t).Addr()
	dir := t.TempDir()
	file := filepath.Join(dir, "nightly.prom")
	r := runDlock(t, url, "run", "--metrics-file", file, "nightly", "--", "sh", "-c", "sleep 0.2; exit 3")
	if r.code != 3 {
		t.Fatalf("exit %d, want CMD's 3; stderr %q", r.code, r.stderr)
	}
	ms := readMetricsFile(t, file)
	l := []string{"backend=redis", "key=nightly", "key_class=nightly"}
	ms.want(t, 3, "dlock_run_last_exit_code", l...)
	ms.want(t, 0, "dlock_run_last_lost", l...)
	ms.want(t, 0, "dlock_locks_held", l...)
	ms.want(t, 1, "dlock_acquire_total", append(l, "result=acquired")...)
	ms.want(t, 1, "dlock_acquire_duration_seconds", append(l, "result=acquired")...)
	ms.want(t, 1, "dlock_hold_duration_seconds", l...)
	held, _ := ms.value("dlock_run_last_held_seconds", l...)
	start, _ := ms.value("dlock_run_last_start_timestamp_seconds", l...)
	acquired, _ := ms.value("dlock_run_last_acquired_timestamp_seconds", l...)
	end, _ := ms.value("dlock_run_last_end_timestamp_seconds", l...)
	if held < 0.2 {
		t.Errorf("dlock_run_last_held_seconds %v; CMD alone held the lock for 0.2s", held)
	}
	if !(start > 0 && start <= acquired && acquired+held <= end) {
		t.Errorf("start %v, acquired %v, held %v, end %v: want start <= acquired, acquired + held <= end", start, acquired, held, end)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"nightly.prom"}) {
		t.Errorf("left in the directory: %v, want only nightly.prom", names)
	}

	// CMD's own status 4 is not a lost lock.
	if r := runDlock(t, url, "run", "--metrics-file", file, "nightly", "--", "sh", "-c", "exit 4"); r.code != 4 {
		t.Fatalf("exit %d, want CMD's 4; stderr %q", r.code, r.stderr)
	}
	ms = readMetricsFile(t, file)
	ms.want(t, 4, "dlock_run_last_exit_code", l...)
	ms.want(t, 0, "dlock_run_last_lost", l...)

	// A run that did not get the lock writes its exit code, and no
	// acquisition.
	background(t, url, "run", "nightly", "--", "sh", "-c", "echo started; exec sleep 60")
	r = runDlock(t, url, "run", "-n", "--metrics-file", file, "nightly", "--", "echo", "ran")
	if r.code != exitConflict || r.stdout != "" {
		t.Fatalf("-n on a held key: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	ms = readMetricsFile(t, file)
	ms.want(t, exitConflict, "dlock_run_last_exit_code", l...)
	ms.want(t, 0, "dlock_run_last_lost", l...)
	ms.want(t, 1, "dlock_acquire_total", append(l, "result=contended")...)
	ms.wantAbsent(t, "dlock_acquire_total", "result=acquired")
	ms.wantAbsent(t, "dlock_run_last_acquired_timestamp_seconds")
	ms.wantAbsent(t, "dlock_run_last_held_seconds")
}

// A lock lost while CMD runs must show in the file: otherwise the fleet
// sees a job that ran under a lock it no longer held as a healthy one.
func TestRun_MetricsFileRecordsLoss(t *testing.T) {
	t.Parallel()
	p := testserver.StartProxy(t, testserver.StartRedis(t).Addr())
	url := "redis://" + p.Addr()
	file := filepath.Join(t.TempDir(), "doomed.prom")
	cmd, errb, _ := background(t, url, "run", "--ttl", "1s", "--grace", "200ms", "--metrics-file", file, "doomed", "--",
		"sh", "-c", "echo started; exec sleep 60")
	// dlock hold exits as soon as it sees the loss.
	holdFile := filepath.Join(t.TempDir(), "held.prom")
	h := startHold(t, url, "--ttl", "1s", "--metrics-file", holdFile, "held")
	// Written at acquisition: held, not lost, no exit yet.
	var ms metrics
	waitFor(t, hang, "the metrics file never said the lock is held", func() bool {
		b, err := os.ReadFile(file)
		if err != nil {
			return false
		}
		if ms, err = parseMetrics(b); err != nil {
			t.Fatalf("%s does not parse: %v\n%s", file, err, b)
		}
		v, ok := ms.value("dlock_locks_held", "key=doomed")
		return ok && v == 1
	})
	ms.want(t, 0, "dlock_run_last_lost", "key=doomed")
	ms.wantAbsent(t, "dlock_run_last_exit_code")

	p.Stall() // renewals get no answer: the lease runs out
	if code := waitExit(t, cmd); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitLost, errb.String())
	}
	ms = readMetricsFile(t, file)
	l := []string{"backend=redis", "key=doomed", "key_class=doomed"}
	// dlock run kills the tree and releases before the local deadline
	// (its kill point): dlock_lost_total, the library's count, may miss
	// that loss; dlock_run_last_lost does not.
	ms.want(t, 1, "dlock_run_last_lost", l...)
	ms.want(t, exitLost, "dlock_run_last_exit_code", l...)
	ms.want(t, 0, "dlock_locks_held", l...)
	ms.want(t, 1, "dlock_hold_duration_seconds", l...)

	if code := waitExit(t, h.cmd); code != exitLost {
		t.Fatalf("hold: exit %d, want %d; stderr %s", code, exitLost, h.stderr.String())
	}
	ms = readMetricsFile(t, holdFile)
	l = []string{"backend=redis", "key=held", "key_class=held"}
	ms.want(t, 1, "dlock_run_last_lost", l...)
	ms.want(t, exitLost, "dlock_run_last_exit_code", l...)
	ms.want(t, 1, "dlock_lost_total", append(l, "reason=deadline")...)
	ms.want(t, 0, "dlock_locks_held", l...)
}

// metricsURL returns the address a dlock started with --metrics
// 127.0.0.1:0 says it serves metrics at, from its stderr.
func metricsURL(t *testing.T, name string, stderr *syncBuffer) string {
	t.Helper()
	re := regexp.MustCompile(`dlock ` + name + `: metrics at (http://127\.0\.0\.1:\d+/metrics)\n`)
	var m []string
	// Said before the lock was asked for; its copy to stderr may lag.
	waitFor(t, hang, "dlock "+name+" did not say where it serves metrics", func() bool {
		m = re.FindStringSubmatch(stderr.String())
		return m != nil
	})
	return m[1]
}

// scrape GETs url and parses the metrics.
func scrape(url string) (metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return parseMetrics(b)
}

// A long hold that only writes its metrics at exit cannot be watched:
// --metrics must serve them, renewals included, while the lock is held.
func TestHold_MetricsServesWhileHeld(t *testing.T) {
	t.Parallel()
	url := "redis://" + testserver.StartRedis(t).Addr()
	file := filepath.Join(t.TempDir(), "deploy.prom")
	h := startHold(t, url, "--ttl", "1s", "--metrics", "127.0.0.1:0", "--metrics-file", file, "deploy")
	at := metricsURL(t, "hold", h.stderr)
	l := []string{"backend=redis", "key=deploy", "key_class=deploy"}
	ms, err := scrape(at)
	if err != nil {
		t.Fatal(err)
	}
	ms.want(t, 1, "dlock_locks_held", l...)
	ms.want(t, 1, "dlock_acquire_total", append(l, "result=acquired")...)
	ms.want(t, 0, "dlock_run_last_lost", l...)
	ms.wantAbsent(t, "dlock_run_last_exit_code")
	if _, ok := ms.value("dlock_run_last_acquired_timestamp_seconds", l...); !ok {
		t.Errorf("no dlock_run_last_acquired_timestamp_seconds while held")
	}
	// The renewals of the hold show while it lasts.
	waitFor(t, hang, "no renewal was ever served", func() bool {
		ms, err := scrape(at)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := ms.value("dlock_renew_total", append(l, "result=ok")...)
		return n >= 2
	})

	h.cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, h.cmd); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, h.stderr.String())
	}
	ms = readMetricsFile(t, file)
	ms.want(t, 0, "dlock_run_last_exit_code", l...)
	ms.want(t, 0, "dlock_locks_held", l...)
	ms.want(t, 0, "dlock_run_last_lost", l...)
	if _, err := scrape(at); err == nil {
		t.Errorf("%s still served after dlock hold exited", at)
	}
}

// A textfile collector reading while dlock writes must never see part of
// a file: every write replaces the file by a rename (a new inode), the
// only other name ever seen is PATH.tmp-<pid>, and every read parses
// whole.
func TestRun_MetricsFileAtomic(t *testing.T) {
	t.Parallel()
	url := "redis://" + testserver.StartRedis(t).Addr()
	dir := t.TempDir()
	file := filepath.Join(dir, "atomic.prom")
	// --ttl 1s: renewed, and the file written, every 333ms.
	cmd, errb, _ := background(t, url, "run", "--ttl", "1s", "--metrics-file", file, "atomic", "--", "sh", "-c", "echo started; exec sleep 60")
	tmp := fmt.Sprintf("atomic.prom.tmp-%d", cmd.Process.Pid)
	var (
		versions []os.FileInfo // each file read, by its inode, in order
		last     []byte
	)
	deadline := time.Now().Add(hang)
	for reads := 0; len(versions) < 4; reads++ {
		if time.Now().After(deadline) || reads > 1_000_000 {
			t.Fatalf("hang: saw %d versions of the file in %d reads; stderr %s", len(versions), reads, errb.String())
		}
		for _, n := range dirNames(t, dir) {
			if n != "atomic.prom" && n != tmp {
				t.Fatalf("%s in the directory: only atomic.prom and %s may be", n, tmp)
			}
		}
		f, err := os.Open(file)
		if os.IsNotExist(err) {
			continue // not written yet
		} else if err != nil {
			t.Fatal(err)
		}
		fi, err := f.Stat()
		b, rerr := io.ReadAll(f)
		f.Close()
		if err != nil || rerr != nil {
			t.Fatal(err, rerr)
		}
		ms, err := parseMetrics(b)
		if err != nil {
			t.Fatalf("read %d: a partial file: %v\n%s", reads, err, b)
		}
		for _, name := range []string{"dlock_acquire_duration_seconds", "dlock_run_last_start_timestamp_seconds", "dlock_waiters"} {
			if ms[name] == nil {
				t.Fatalf("read %d: a partial file, without %s:\n%s", reads, name, b)
			}
		}
		if bytes.Equal(b, last) {
			continue
		}
		if n := len(versions); n > 0 && os.SameFile(versions[n-1], fi) {
			t.Fatalf("read %d: the file changed in place (same inode), not replaced by a rename:\n%s", reads, b)
		}
		versions, last = append(versions, fi), b
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, cmd); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, want 143; stderr %s", code, errb.String())
	}
	readMetricsFile(t, file).want(t, 128+float64(syscall.SIGTERM), "dlock_run_last_exit_code", "key=atomic")
	if names := dirNames(t, dir); !slices.Equal(names, []string{"atomic.prom"}) {
		t.Errorf("left in the directory: %v, want only atomic.prom", names)
	}
}

// A --metrics address dlock cannot listen on, or a --metrics-file it
// cannot write, must fail as a usage error before the lock is asked for,
// not be found out after a job took (or waited for) the lock.
func TestRun_MetricsBadAddrIsUsageError(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	// KEY is held: a run that asked for it would wait for ever.
	background(t, url, "run", "busy", "--", "sh", "-c", "echo started; exec sleep 60")
	inUse, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inUse.Close()
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--metrics", "127.0.0.1"}, "--metrics 127.0.0.1: "},
		{[]string{"--metrics", "127.0.0.1:99999"}, "--metrics 127.0.0.1:99999: "},
		{[]string{"--metrics", "127.0.0.1:notaport"}, "--metrics 127.0.0.1:notaport: "},
		{[]string{"--metrics", inUse.Addr().String()}, "--metrics " + inUse.Addr().String() + ": "},
		{[]string{"--metrics", ""}, "--metrics"},
		{[]string{"--metrics-file", ""}, "--metrics-file"},
		{[]string{"--metrics-file", filepath.Join(dir, "missing", "x.prom")}, "--metrics-file " + filepath.Join(dir, "missing", "x.prom") + ": "},
		{[]string{"--metrics-file", dir}, "is a directory"},
	} {
		for _, cmd := range []string{"run", "hold"} {
			args := append(append([]string{cmd}, c.args...), "busy")
			if cmd == "run" {
				args = append(args, "--", "echo", "ran")
			}
			r := runDlock(t, url, args...)
			if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, "dlock "+cmd+": ") ||
				!strings.Contains(r.stderr, c.says) || !strings.Contains(r.stderr, "Try 'dlock "+cmd+" --help'") {
				t.Errorf("dlock %v: exit %d, stdout %q, stderr %q; want a usage error (2) saying %q", args[:len(args)-1], r.code, r.stdout, r.stderr, c.says)
			}
		}
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("left in %s: %v", dir, names)
	}
}

// A renewal every TTL/3 must not mean an fsync each time it wakes the
// writer: renewals within TTL/3 of the last write write nothing, while an
// acquisition, a loss and the exit write at once.
func TestRun_MetricsFileRenewalsThrottled(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k.prom")
	f := metricsFlags{file: file}
	m, ok := f.start(newOptions("run", ""), acquireRequest{key: "k", ttl: 3 * time.Hour}, "file:///nowhere", io.Discard)
	if !ok || m.every != time.Hour {
		t.Fatalf("start: ok %v, every %v; want ok, 1h (TTL/3)", ok, m.every)
	}
	ev := dlock.Event{Backend: "file", Key: "k", Token: 1, Owner: "o"}
	// fileSays waits until the file has series name = v.
	fileSays := func(name string, v float64) {
		t.Helper()
		waitFor(t, hang, fmt.Sprintf("the file never had %s %v", name, v), func() bool {
			b, err := os.ReadFile(file)
			if err != nil {
				return false
			}
			ms, err := parseMetrics(b)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := ms.value(name)
			return ok && got == v
		})
	}
	acq := ev
	acq.Kind, acq.Result = dlock.EventAcquire, dlock.ResultAcquired
	m.Observe(acq)
	fileSays("dlock_locks_held", 1)
	renew := ev
	renew.Kind, renew.Result = dlock.EventRenew, dlock.ResultOK
	for range 10 {
		m.Observe(renew)
	}
	// The writer has taken the last wake-up of the renewals before the
	// loss comes: it writes the loss after whatever it did with them.
	waitFor(t, hang, "the writer never took the renewals' wake-up", func() bool { return len(m.renew) == 0 })
	lost := ev
	lost.Kind, lost.Reason = dlock.EventLost, dlock.LossDeadline
	m.Observe(lost)
	fileSays("dlock_run_last_lost", 1)
	m.exit(exitLost, nil)
	readMetricsFile(t, file).want(t, 10, "dlock_renew_total", "result=ok")
	if m.writes != 3 {
		t.Errorf("%d writes, want 3: acquired, lost, exit (no renewal within TTL/3 of the acquisition)", m.writes)
	}
}

// A run or hold ended at --max-hold is a planned end: dlock_run_last_lost
// stays 0, so the lost-lock alert does not fire. Symptom: the cap was
// recorded as a lost lock.
func TestRun_MetricsMaxHoldIsNotLost(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	dir := t.TempDir()
	runFile, holdFile := filepath.Join(dir, "run.prom"), filepath.Join(dir, "hold.prom")
	if r := runDlock(t, url, "run", "--ttl", "3s", "--max-hold", "2s", "--metrics-file", runFile, "capm", "--", "sleep", "60"); r.code != exitLost {
		t.Fatalf("run: exit %d, stderr %q; want %d at the cap", r.code, r.stderr, exitLost)
	}
	readMetricsFile(t, runFile).want(t, 0, "dlock_run_last_lost", "key=capm")
	h := startHold(t, url, "--max-hold", "1s", "--metrics-file", holdFile, "capmh")
	if code := waitExit(t, h.cmd); code != exitMaxHold {
		t.Fatalf("hold: exit %d, stderr %q; want %d", code, h.stderr.String(), exitMaxHold)
	}
	readMetricsFile(t, holdFile).want(t, 0, "dlock_run_last_lost", "key=capmh")
}
