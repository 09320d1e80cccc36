package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// The demo's metrics. Every worker process reports the Events of its
// acquisitions (dlock.WithCallObserver: the call and the Lock it returns)
// and of its fencing guard, one JSON line each, on a pipe (file
// descriptor 3, named by $DLOCK_DEMO_EVENTS_FD); the demo replays them,
// with those of its own TryAcquire, into one dlockprom.Observer, whose
// registry is what --metrics serves and what the closing summary reads:
// the numbers one process observing every Locker would have exported.

// demoEventsEnv names the file descriptor a worker writes its Events to.
const demoEventsEnv = "DLOCK_DEMO_EVENTS_FD"

// wireEvent is a dlock.Event on the pipe (its Err is not carried: the
// Observer does not use it).
type wireEvent struct {
	Kind     dlock.EventKind  `json:"k"`
	Backend  string           `json:"b,omitempty"`
	Key      string           `json:"key,omitempty"`
	Mode     dlock.Mode       `json:"m,omitempty"`
	Token    uint64           `json:"t,omitempty"`
	Owner    string           `json:"o,omitempty"`
	Result   dlock.Result     `json:"r,omitempty"`
	Attempts int              `json:"a,omitempty"`
	Wait     time.Duration    `json:"w,omitempty"`
	Held     time.Duration    `json:"h,omitempty"`
	Reason   dlock.LossReason `json:"re,omitempty"`
	Highest  uint64           `json:"hi,omitempty"`
}

func toWire(e dlock.Event) wireEvent {
	return wireEvent{e.Kind, e.Backend, e.Key, e.Mode, e.Token, e.Owner, e.Result, e.Attempts, e.Wait, e.Held, e.Reason, e.Highest}
}

func (w wireEvent) event() dlock.Event {
	return dlock.Event{Kind: w.Kind, Backend: w.Backend, Key: w.Key, Mode: w.Mode, Token: w.Token, Owner: w.Owner, Result: w.Result, Attempts: w.Attempts, Wait: w.Wait, Held: w.Held, Reason: w.Reason, Highest: w.Highest}
}

// eventSender is a worker's Observer: it writes each Event to the demo's
// pipe. The demo reads the pipe until the worker exits, so a write does
// not block for long; a failed write is dropped (metrics must never break
// a lock).
type eventSender struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *eventSender) Observe(e dlock.Event) {
	b, err := json.Marshal(toWire(e))
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.w.Write(append(b, '\n'))
}

// workerObserver is the Observer a demo worker gives its acquisitions and
// its guard: the pipe named by $DLOCK_DEMO_EVENTS_FD, or nil when it is unset
// (a worker run by hand).
func workerObserver() dlock.Observer {
	fd, err := strconv.Atoi(os.Getenv(demoEventsEnv))
	if err != nil || fd < 3 {
		return nil
	}
	f := os.NewFile(uintptr(fd), "demo-events")
	if f == nil {
		return nil
	}
	return &eventSender{w: f}
}

// demoMetrics is the demo's registry and the Observer fed by its workers.
type demoMetrics struct {
	reg *prometheus.Registry
	obs *dlockprom.Observer
	srv *http.Server
	url string
}

func newDemoMetrics() (*demoMetrics, error) {
	reg := prometheus.NewRegistry()
	obs, err := dlockprom.New(reg)
	if err != nil {
		return nil, err
	}
	return &demoMetrics{reg: reg, obs: obs}, nil
}

// serve serves the registry at http://addr/metrics until close.
func (m *demoMetrics) serve(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	m.url = "http://" + ln.Addr().String() + "/metrics"
	go func() { _ = m.srv.Serve(ln) }()
	return nil
}

// close stops serving, waiting at most a few seconds for requests in
// flight.
func (m *demoMetrics) close() {
	if m.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if m.srv.Shutdown(ctx) != nil {
		m.srv.Close()
	}
}

// attach gives cmd (not started yet) the pipe for its Events. The
// returned function, called once cmd has exited (or failed to start),
// closes the demo's end and waits until every Event sent was replayed.
func (m *demoMetrics) attach(cmd *exec.Cmd) (done func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, w)
	cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", demoEventsEnv, 2+len(cmd.ExtraFiles)))
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var we wireEvent
			if json.Unmarshal(sc.Bytes(), &we) == nil {
				m.obs.Observe(we.event())
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			w.Close()
			// The worker has exited: the pipe ends once its other copies
			// are closed, which a grandchild could delay; bounded.
			select {
			case <-read:
			case <-time.After(5 * time.Second):
				r.Close()
			}
		})
	}, nil
}

// demoSummary is what the demo's closing lines report, read from the
// registry.
type demoSummary struct {
	acquired, contended, timeout, failed float64
	acquireP99, holdP99                  float64 // seconds; NaN when nothing was observed
	lost                                 map[string]float64
	renewFailed, rejected                float64
}

func (m *demoMetrics) summary() (demoSummary, error) {
	s := demoSummary{lost: map[string]float64{}, acquireP99: math.NaN(), holdP99: math.NaN()}
	mfs, err := m.reg.Gather()
	if err != nil {
		return s, err
	}
	label := func(mt *dto.Metric, name string) string {
		for _, lp := range mt.GetLabel() {
			if lp.GetName() == name {
				return lp.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		var hists []*dto.Histogram
		for _, mt := range mf.GetMetric() {
			switch mf.GetName() {
			case "dlock_acquire_total":
				v := mt.GetCounter().GetValue()
				switch dlock.Result(label(mt, "result")) {
				case dlock.ResultAcquired:
					s.acquired += v
				case dlock.ResultContended:
					s.contended += v
				case dlock.ResultTimeout:
					s.timeout += v
				default:
					s.failed += v
				}
			case "dlock_acquire_duration_seconds":
				if label(mt, "result") == string(dlock.ResultAcquired) {
					hists = append(hists, mt.GetHistogram())
				}
			case "dlock_hold_duration_seconds":
				hists = append(hists, mt.GetHistogram())
			case "dlock_lost_total":
				s.lost[label(mt, "reason")] += mt.GetCounter().GetValue()
			case "dlock_renew_total":
				if label(mt, "result") != string(dlock.ResultOK) {
					s.renewFailed += mt.GetCounter().GetValue()
				}
			case "dlock_fencing_rejected_total":
				s.rejected += mt.GetCounter().GetValue()
			}
		}
		switch mf.GetName() {
		case "dlock_acquire_duration_seconds":
			s.acquireP99 = quantile(0.99, hists)
		case "dlock_hold_duration_seconds":
			s.holdP99 = quantile(0.99, hists)
		}
	}
	return s, nil
}

// quantile estimates the q-quantile of the observations of hs (histograms
// with the same buckets) the way PromQL's histogram_quantile does: linear
// within the bucket the rank falls in, the highest finite bound when it
// falls in the last. NaN when there is no observation.
func quantile(q float64, hs []*dto.Histogram) float64 {
	cum := map[float64]float64{}
	var total float64
	for _, h := range hs {
		total += float64(h.GetSampleCount())
		for _, b := range h.GetBucket() {
			cum[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	if total == 0 {
		return math.NaN()
	}
	bounds := make([]float64, 0, len(cum))
	for ub := range cum {
		bounds = append(bounds, ub)
	}
	sort.Float64s(bounds)
	rank := q * total
	lower, below := 0.0, 0.0
	for _, ub := range bounds {
		if c := cum[ub]; c >= rank {
			if c == below {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/(c-below)
		}
		lower, below = ub, cum[ub]
	}
	if len(bounds) == 0 {
		return math.NaN()
	}
	return bounds[len(bounds)-1]
}

// lines is the summary as the demo prints it.
func (s demoSummary) lines() []string {
	total := s.acquired + s.contended + s.timeout + s.failed
	contention := 0.0
	if total > 0 {
		contention = (s.contended + s.timeout) / total
	}
	var lost []string
	var nlost float64
	for r, v := range s.lost {
		lost = append(lost, fmt.Sprintf("%s %.0f", r, v))
		nlost += v
	}
	sort.Strings(lost)
	lostText := fmt.Sprintf("%.0f", nlost)
	if len(lost) > 0 {
		lostText += " (" + strings.Join(lost, ", ") + ")"
	}
	note := func(cond bool, text string) string {
		if cond {
			return " -> " + text
		}
		return ""
	}
	return []string{
		fmt.Sprintf("acquisitions: %.0f acquired, %.0f contended, %.0f timed out, %.0f failed: contention %.0f%%%s",
			s.acquired, s.contended, s.timeout, s.failed, 100*contention, note(contention > 0.30, "over DlockContentionHigh's 30%")),
		fmt.Sprintf("acquire wait p99 %s, hold time p99 %s (histogram estimates)", seconds(s.acquireP99), seconds(s.holdP99)),
		fmt.Sprintf("locks lost: %s; renewals failed: %.0f%s", lostText, s.renewFailed, note(nlost > 0, "DlockLockLost fires on any")),
		fmt.Sprintf("fencing rejections: %.0f%s", s.rejected, note(s.rejected > 0, "DlockFencingRejected (critical) fires on any")),
	}
}

func seconds(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return time.Duration(v * float64(time.Second)).Round(100 * time.Microsecond).String()
}
