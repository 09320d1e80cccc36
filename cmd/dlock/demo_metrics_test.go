package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	dto "github.com/prometheus/client_model/go"
)

var (
	summaryAcquired  = regexp.MustCompile(`acquisitions: (\d+) acquired, (\d+) contended, (\d+) timed out`)
	summaryRejected  = regexp.MustCompile(`fencing rejections: (\d+)`)
	summaryLost      = regexp.MustCompile(`locks lost: (\d+)`)
	exportedRejected = regexp.MustCompile(`(?m)^dlock_fencing_rejected_total\{backend="file",key_class="all"\} (\S+)$`)
	exportedContend  = regexp.MustCompile(`(?m)^dlock_acquire_total\{backend="file",key_class="all",result="contended"\} (\S+)$`)
)

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkSummary asserts the demo's closing metrics: contention seen, the
// one stale write rejected, worker A's lock lost, every locked increment
// acquired.
func checkSummary(t *testing.T, out string, minAcquired int) {
	t.Helper()
	m := summaryAcquired.FindStringSubmatch(out)
	r := summaryRejected.FindStringSubmatch(out)
	l := summaryLost.FindStringSubmatch(out)
	if m == nil || r == nil || l == nil {
		t.Fatalf("no metrics summary in the demo's output:\n%s", out)
	}
	if got := atoi(t, m[1]); got < minAcquired {
		t.Errorf("summary: %d acquired, want at least %d", got, minAcquired)
	}
	if atoi(t, m[2]) == 0 {
		t.Errorf("summary shows no contention:\n%s", out)
	}
	if got := atoi(t, r[1]); got != 1 {
		t.Errorf("summary: %d fencing rejections, want 1", got)
	}
	if got := atoi(t, l[1]); got != 1 {
		t.Errorf("summary: %d locks lost, want 1 (worker A's)", got)
	}
}

func TestDemoMetricsSummary(t *testing.T) {
	t.Parallel()
	r := runDlock(t, "", "demo", "--workers", "6", "--rounds", "10")
	if r.code != 0 {
		t.Fatalf("demo exit %d: %s\n%s", r.code, r.stdout, r.stderr)
	}
	// 60 locked increments, worker B's deposit, worker A's first lock and
	// its retry.
	checkSummary(t, r.stdout, 63)
	if !strings.Contains(r.stdout, "refused, A holds it") {
		t.Errorf("the demo's own try of A's lock was not refused:\n%s", r.stdout)
	}
}

// With --metrics the demo serves what it counted, keeps serving after the
// summary, and exits 0 when interrupted.
func TestDemoMetricsServe(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	cmd := dlockCmd(ctx, "", "demo", "--workers", "4", "--rounds", "10", "--metrics", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var out strings.Builder
	url := ""
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		l := lines.Text()
		out.WriteString(l + "\n")
		if i := strings.Index(l, "serving http://"); i >= 0 {
			url = strings.Fields(l[i+len("serving "):])[0]
			break
		}
	}
	if url == "" {
		cmd.Wait()
		t.Fatalf("the demo never said it was serving metrics:\n%s\n%s", out.String(), stderr.String())
	}
	checkSummary(t, out.String(), 4*10+3)
	if !strings.Contains(out.String(), "metrics: "+url) {
		t.Errorf("the metrics URL was not announced at the start:\n%s", out.String())
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %v", url, resp.Status, err)
	}
	if m := exportedRejected.FindSubmatch(body); m == nil || string(m[1]) != "1" {
		t.Errorf("scrape: dlock_fencing_rejected_total is not 1:\n%s", body)
	}
	if m := exportedContend.FindSubmatch(body); m == nil || string(m[1]) == "0" {
		t.Errorf("scrape: no contended acquisition:\n%s", body)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("hang: the demo did not exit on SIGINT within %v", hang)
	}
	if err != nil {
		t.Fatalf("demo after SIGINT: %v\n%s", err, stderr.String())
	}
}

func TestDemoMetricsBadAddr(t *testing.T) {
	t.Parallel()
	r := runDlock(t, "", "demo", "--metrics", "not-an-address")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--metrics not-an-address") {
		t.Fatalf("demo --metrics not-an-address: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

// An Event survives the pipe from a worker to the demo (but its Err).
func TestDemoEventWire(t *testing.T) {
	t.Parallel()
	e := dlock.Event{Kind: dlock.EventLost, Backend: "file", Key: "k", Mode: dlock.Shared, Token: 7, Owner: "o",
		Result: dlock.ResultRefused, Attempts: 3, Wait: time.Second, Held: 2 * time.Second, Reason: dlock.LossDeadline, Highest: 9}
	pr, pw := io.Pipe()
	s := &eventSender{w: pw}
	go func() {
		s.Observe(e)
		pw.Close()
	}()
	var got []dlock.Event
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		var we wireEvent
		if err := json.Unmarshal(sc.Bytes(), &we); err != nil {
			t.Fatal(err)
		}
		got = append(got, we.event())
	}
	if len(got) != 1 || got[0] != e {
		t.Fatalf("sent %+v, got %+v", e, got)
	}
}

func TestQuantile(t *testing.T) {
	t.Parallel()
	h := func(counts ...uint64) *dto.Histogram { // cumulative, bounds 1, 2, 4
		var bs []*dto.Bucket
		for i, ub := range []float64{1, 2, 4} {
			bs = append(bs, &dto.Bucket{UpperBound: &ub, CumulativeCount: &counts[i]})
		}
		n := counts[len(counts)-1]
		return &dto.Histogram{SampleCount: &n, Bucket: bs}
	}
	for _, c := range []struct {
		q    float64
		hs   []*dto.Histogram
		want float64
	}{
		{0.5, []*dto.Histogram{h(10, 10, 10)}, 0.5},
		{0.99, []*dto.Histogram{h(0, 10, 10)}, 1.99},
		{0.5, []*dto.Histogram{h(0, 0, 5), h(0, 0, 5)}, 3},
		{0.99, []*dto.Histogram{h(0, 0, 0, 10)}, 4}, // all above the last bound
	} {
		if got := quantile(c.q, c.hs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := quantile(0.99, nil); !math.IsNaN(got) {
		t.Errorf("quantile of nothing = %v, want NaN", got)
	}
}
