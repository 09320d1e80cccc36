package main

// Metrics of dlock run and dlock hold.
//
// --metrics-file PATH writes them in the text format node_exporter's
// textfile collector reads: when the lock is acquired, after renewals (at
// most once per TTL/3), at once when the lock is lost, and a last time as
// dlock exits, with its exit status. Each write goes to PATH.tmp-<pid> in
// PATH's directory, is synced, and is renamed over PATH: a reader sees
// the last complete file, never part of one.
//
// --metrics ADDR serves the same metrics at http://ADDR/metrics while
// dlock lives, for holds long enough to be scraped.
//
// The metrics are dlockprom's (acquisitions, wait time, locks held, hold
// time, renewals, losses by reason), from the acquisition's own Events
// (dlock.WithCallObserver), and the dlock_run_last_* set below, which says
// how this run went. Every series is labelled by backend, key_class and
// key, both the lock's key: one process holds one key, so the key is a
// label of bounded cardinality here, and dlockprom's alert rules, which
// group by key_class, name the job.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
)

// metricsFlags are --metrics-file and --metrics of run and hold.
type metricsFlags struct {
	file string
	addr string
}

// define adds --metrics-file and --metrics to o, for `dlock cmd`.
func (f *metricsFlags) define(o *optionSet) {
	o.Var(nonEmptyFlag{&f.file, "a path"}, "", "metrics-file", "PATH",
		"write Prometheus metrics to PATH (node_exporter's textfile format, replaced atomically) when the lock is acquired, while it is renewed (at most every TTL/3), when it is lost and on exit: exit status, hold time, lost or not")
	o.Var(nonEmptyFlag{&f.addr, "an address (127.0.0.1:9464)"}, "", "metrics", "ADDR",
		"serve the same metrics at http://ADDR/metrics while dlock "+o.cmd+" runs, waiting included (e.g. 127.0.0.1:9464; with port 0 the address taken is printed on stderr)")
}

// nonEmptyFlag is an option with a text value that must not be empty;
// what names the value wanted in the error.
type nonEmptyFlag struct {
	p    *string
	what string
}

func (f nonEmptyFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}

func (f nonEmptyFlag) Set(s string) error {
	if s == "" {
		return fmt.Errorf("want %s, not an empty value", f.what)
	}
	*f.p = s
	return nil
}

// errMetricsFile marks a failed write of --metrics-file.
var errMetricsFile = errors.New("dlock: writing the metrics file")

// runMetrics is the metrics of one dlock run or hold: a registry with
// dlockprom's Observer and the dlock_run_last_* collector, written to
// --metrics-file and served at --metrics. Its methods do nothing on a nil
// *runMetrics (neither option given).
type runMetrics struct {
	name   string // "dlock run", for messages
	reg    *prometheus.Registry
	prom   *dlockprom.Observer
	file   string        // --metrics-file, "" for none
	every  time.Duration // the least time between two writes after renewals
	stderr io.Writer

	srv    *http.Server
	served chan struct{} // closed once Serve returned

	lostSeen chan struct{} // closed on the lock's EventLost
	capped   bool          // the run ended at --max-hold (capReached)
	urgent   chan struct{} // acquired or lost: write now
	renew    chan struct{} // renewed: write unless written less than every ago
	quit     chan struct{} // closed by exit: the writer returns
	done     chan struct{} // closed once the writer returned

	writeMu sync.Mutex // one write at a time: they share the temporary file
	failing bool       // the last write failed (and said so)
	writes  int        // writes attempted

	mu       sync.Mutex // guards the run's state below
	backend  string
	key      string
	start    time.Time
	acquired time.Time     // zero until the lock is acquired
	held     time.Duration // once ended: how long the lock was held
	ended    bool          // released or lost
	endedAt  time.Time     // when it ended
	lost     bool
	exited   bool
	code     int
	end      time.Time
}

// start checks f and starts what it asks for: listens on --metrics (and
// says where with a port 0 or --verbose), and checks that --metrics-file
// can be written. Anything wrong is a usage error, printed, with ok false,
// before the lock is asked for. With neither option given it returns nil,
// ok.
func (f *metricsFlags) start(o *optionSet, r acquireRequest, rawURL string, stderr io.Writer) (m *runMetrics, ok bool) {
	if f.file == "" && f.addr == "" {
		return nil, true
	}
	if rawURL == "" {
		rawURL = defaultURL()
	}
	m = &runMetrics{
		name: r.name(), file: f.file, every: r.ttl / 3, stderr: stderr,
		reg: prometheus.NewRegistry(), backend: backendLabel(rawURL), key: r.key, start: time.Now(),
		lostSeen: make(chan struct{}), urgent: make(chan struct{}, 1), renew: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
	}
	// Every series gets the key as its key_class and its key label.
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"key": r.key}, m.reg)
	prom, err := dlockprom.New(reg, dlockprom.WithKeyClass(func(k string) string { return k }))
	if err == nil {
		err = reg.Register(runCollector{m})
	}
	if err != nil { // a programming error: fixed names on a new registry
		o.UsageError(stderr, "metrics: %v", err)
		return nil, false
	}
	m.prom = prom
	if f.file != "" {
		if err := checkMetricsFile(f.file); err != nil {
			o.UsageError(stderr, "--metrics-file %s: %v", oneLine(f.file), err)
			return nil, false
		}
	}
	if f.addr != "" {
		ln, err := net.Listen("tcp", f.addr)
		if err != nil {
			o.UsageError(stderr, "--metrics %s: %v", oneLine(f.addr), err)
			return nil, false
		}
		if _, port, _ := net.SplitHostPort(f.addr); port == "0" || r.verbose {
			fmt.Fprintf(stderr, "%s: metrics at http://%s/metrics\n", m.name, ln.Addr())
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
		m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		m.served = make(chan struct{})
		go func() {
			defer close(m.served)
			_ = m.srv.Serve(ln)
		}()
	}
	go m.writer()
	return m, true
}

// checkMetricsFile checks that path can be replaced the way writes do:
// its directory exists and takes the temporary file, and path is not a
// directory.
func checkMetricsFile(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return errors.New("is a directory")
	}
	f, err := os.OpenFile(tmpName(path), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// tmpName is the temporary file each write of path goes through.
func tmpName(path string) string { return fmt.Sprintf("%s.tmp-%d", path, os.Getpid()) }

// backendLabel names the backend of a lock service URL as its Locker's
// Events do ("redis", "file", ...), for the dlock_run_last_* series of a
// run that never reached the service.
func backendLabel(rawURL string) string {
	scheme, _, _ := strings.Cut(rawURL, "://")
	switch scheme {
	case "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel":
		return "redis"
	case "redlock", "redlocks":
		return "redlock"
	case "etcd", "etcds":
		return "etcd"
	case "zk":
		return "zookeeper"
	case "postgres", "postgresql":
		return "postgres"
	case "file":
		return "file"
	}
	return "unknown"
}

// observer is the Observer to pass to the acquisition
// (dlock.WithCallObserver): nil without metrics.
func (m *runMetrics) observer() dlock.Observer {
	if m == nil {
		return nil
	}
	return m
}

// Observe implements dlock.Observer: dlockprom counts e, and the run's
// state follows it; the writer is woken, never waited for.
func (m *runMetrics) Observe(e dlock.Event) {
	m.prom.Observe(e)
	wake := m.renew
	m.mu.Lock()
	if e.Backend != "" {
		m.backend = e.Backend
	}
	switch e.Kind {
	case dlock.EventAcquire:
		if e.Result != dlock.ResultAcquired {
			m.mu.Unlock()
			return
		}
		m.acquired, wake = time.Now(), m.urgent
	case dlock.EventRenew:
	case dlock.EventLost:
		if !m.lost && e.Reason != dlock.LossHoldCap { // --max-hold: planned
			m.lost = true
			close(m.lostSeen)
		}
		wake = m.urgent
		m.endLocked()
	case dlock.EventRelease:
		m.endLocked() // exit writes next
		m.mu.Unlock()
		return
	default:
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default: // a write is due already
	}
}

// endLocked records the end of the hold, now, once (a lock lost then
// released ended when it was lost). The hold is timed on the clock of the
// acquisition timestamp, so that acquired + held is when it ended.
func (m *runMetrics) endLocked() {
	if m.ended || m.acquired.IsZero() {
		return
	}
	m.ended, m.endedAt = true, time.Now()
	m.held = m.endedAt.Sub(m.acquired)
}

// writer writes the file when woken until exit: at once when the lock is
// acquired or lost, after a renewal once every has passed since the last
// write.
func (m *runMetrics) writer() {
	defer close(m.done)
	if m.file == "" {
		<-m.quit
		return
	}
	var (
		last  time.Time
		timer *time.Timer
		due   <-chan time.Time
	)
	dropTimer := func() {
		if timer != nil {
			timer.Stop()
			timer, due = nil, nil
		}
	}
	defer dropTimer()
	for {
		select {
		case <-m.quit:
			return
		case <-m.urgent:
		case <-due:
			timer, due = nil, nil
		case <-m.renew:
			if wait := m.every - time.Since(last); wait > 0 {
				if timer == nil {
					timer = time.NewTimer(wait)
					due = timer.C
				}
				continue
			}
		}
		dropTimer()
		m.write()
		last = time.Now()
	}
}

// lostEventWait bounds how long exit waits for the EventLost of a lock
// whose Lost() it finds closed: the goroutine that lost the lock reports
// it right after closing Lost().
const lostEventWait = 2 * time.Second

// capReached records that the run ended at --max-hold: a planned end,
// which dlock_run_last_lost does not count.
func (m *runMetrics) capReached() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.capped = true
	m.mu.Unlock()
}

// exit records dlock's exit status, writes the file a last time and ends
// serving; it returns code. lk is the lock taken, nil if none was.
func (m *runMetrics) exit(code int, lk *dlock.Lock) int {
	if m == nil {
		return code
	}
	if lk != nil && errors.Is(lk.Err(), dlock.ErrLockLost) && !errors.Is(lk.Err(), dlock.ErrHoldCapReached) {
		t := time.NewTimer(lostEventWait)
		select {
		case <-m.lostSeen:
		case <-t.C:
		}
		t.Stop()
	}
	close(m.quit)
	<-m.done
	m.mu.Lock()
	m.endLocked() // a lock not released (left to expire) ends now
	switch {
	case lk == nil:
	case m.capped, errors.Is(lk.Err(), dlock.ErrHoldCapReached):
		// --max-hold: a planned end, not a loss to alert on.
	case errors.Is(lk.Err(), dlock.ErrLockLost):
		m.lost = true // even if its Event never came
	case code == exitLost && lk.Deadline().Sub(m.endedAt) <= lk.TTL()/3:
		// dlock run ended CMD because the lease ran short (renewals did
		// not come by the term point, at most TTL/3 before the
		// deadline) and released the lock before the library counted
		// it lost: lost all the same.
		m.lost = true
	}
	m.exited, m.code, m.end = true, code, time.Now()
	m.mu.Unlock()
	if m.file != "" {
		m.write()
	}
	if m.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if m.srv.Shutdown(ctx) != nil {
			m.srv.Close()
		}
		<-m.served
	}
	return code
}

// write replaces the file with the registry's metrics. A failure is said
// on stderr (once until a write succeeds again) and changes nothing else:
// metrics never break a lock.
func (m *runMetrics) write() {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.writes++
	err := m.writeFile()
	switch {
	case err != nil && !m.failing:
		fmt.Fprintf(m.stderr, "%s: --metrics-file: %v\n", m.name, err)
		m.failing = true
	case err == nil:
		m.failing = false
	}
}

// writeFile writes the metrics to the temporary file, syncs it and renames
// it over the file, then syncs the directory (where it can).
func (m *runMetrics) writeFile() (err error) {
	mfs, err := m.reg.Gather()
	if err != nil {
		return fmt.Errorf("%w: %w", errMetricsFile, err)
	}
	tmp := tmpName(m.file)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("%w: %w", errMetricsFile, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("%w: %w", errMetricsFile, err)
		}
	}()
	for _, mf := range mfs {
		if _, err = expfmt.MetricFamilyToText(f, mf); err != nil {
			return err
		}
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, m.file); err != nil {
		return err
	}
	if d, derr := os.Open(filepath.Dir(m.file)); derr == nil {
		_ = d.Sync() // the rename itself: best effort (some file systems refuse)
		d.Close()
	}
	return nil
}

// runCollector exports the dlock_run_last_* series of m.
type runCollector struct{ m *runMetrics }

var (
	runLabels       = []string{"backend", "key_class"}
	runStartDesc    = prometheus.NewDesc("dlock_run_last_start_timestamp_seconds", "When the last dlock run or hold of the key started (before waiting for the lock), in seconds since the epoch.", runLabels, nil)
	runAcquiredDesc = prometheus.NewDesc("dlock_run_last_acquired_timestamp_seconds", "When the last dlock run or hold of the key acquired the lock, in seconds since the epoch; absent if it did not.", runLabels, nil)
	runHeldDesc     = prometheus.NewDesc("dlock_run_last_held_seconds", "How long the last dlock run or hold of the key held the lock: so far while held, else until released or lost; absent if it did not acquire it.", runLabels, nil)
	runLostDesc     = prometheus.NewDesc("dlock_run_last_lost", "1 if the last dlock run or hold of the key lost the lock while holding it (or let its lease run short and ended CMD for it), else 0.", runLabels, nil)
	runExitDesc     = prometheus.NewDesc("dlock_run_last_exit_code", "Exit status of the last dlock run or hold of the key; absent while it runs.", runLabels, nil)
	runEndDesc      = prometheus.NewDesc("dlock_run_last_end_timestamp_seconds", "When the last dlock run or hold of the key exited, in seconds since the epoch; absent while it runs.", runLabels, nil)
)

func (runCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{runStartDesc, runAcquiredDesc, runHeldDesc, runLostDesc, runExitDesc, runEndDesc} {
		ch <- d
	}
}

func (c runCollector) Collect(ch chan<- prometheus.Metric) {
	type sample struct {
		d *prometheus.Desc
		v float64
	}
	seconds := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
	m := c.m
	m.mu.Lock()
	labels := []string{m.backend, m.key}
	samples := []sample{{runStartDesc, seconds(m.start)}, {runLostDesc, 0}}
	if m.lost {
		samples[1].v = 1
	}
	if !m.acquired.IsZero() {
		held := m.held
		if !m.ended {
			held = time.Since(m.acquired)
		}
		samples = append(samples, sample{runAcquiredDesc, seconds(m.acquired)}, sample{runHeldDesc, held.Seconds()})
	}
	if m.exited {
		samples = append(samples, sample{runExitDesc, float64(m.code)}, sample{runEndDesc, seconds(m.end)})
	}
	m.mu.Unlock()
	for _, s := range samples {
		ch <- prometheus.MustNewConstMetric(s.d, prometheus.GaugeValue, s.v, labels...)
	}
}
