package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
)

const demoUsage = `Usage: dlock demo [--url URL|--url-file PATH] [--workers 10] [--rounds 20]
                  [--metrics ADDR]

Plays the story of distributed locking with real processes (re-executions of
this binary), on a lock service that needs no set-up (a file backend in a
temporary directory) unless --url names another:

  1. ten workers increment a shared counter without a lock: updates are lost;
  2. the same workers under the lock: the count is right;
  3. a holder is paused with SIGSTOP past its lease (a long GC pause), another
     worker takes the lock and writes; when the first resumes, its late write
     corrupts an unfenced copy of the data but is REJECTED by the fencing
     guard on the fenced copy.

Every worker reports its lock events to the demo, which keeps them as
dlockprom's Prometheus metrics and ends with a summary: acquisitions and
contention, acquire and hold time p99, lost locks, fencing rejections.
With --metrics ADDR (e.g. 127.0.0.1:9464, or 127.0.0.1:0 for any port) it
serves them at http://ADDR/metrics during the demo and after it, until
interrupted (Ctrl-C), so that Prometheus can scrape them and dlockprom's
dashboard and alerts show the demo's contention and fencing rejection.

Options:
`

// demoWorkerCmd is the hidden subcommand the demo re-executes.
const demoWorkerCmd = "__demo-worker"

type demo struct {
	out     io.Writer
	metrics *demoMetrics
	locker  dlock.Locker // the demo's own
	self    string
	dir     string
	url     string
	start   time.Time
	workers int
	rounds  int
}

func cmdDemo(args []string, stdout, stderr io.Writer) int {
	o := newOptions("demo", demoUsage)
	var (
		rawURL, metricsAddr string
		workers             = 10
		rounds              = 20
	)
	urlSrc := defineURL(o, &rawURL, "lock service URL (default: a file backend in a temporary directory)")
	o.Int(&workers, "", "workers", "N", "number of worker processes in acts 1 and 2, 2-64 (default 10)")
	o.Int(&rounds, "", "rounds", "N", "increments per worker, 1-1000 (default 20)")
	o.String(&metricsAddr, "", "metrics", "ADDR", "serve Prometheus metrics at http://ADDR/metrics during the demo and until interrupted")
	rest, code, ok := o.Parse(args, stdout, stderr)
	if !ok {
		return code
	}
	if err := urlSrc.check(); err != nil {
		return o.UsageError(stderr, "%v", err)
	}
	switch {
	case len(rest) > 0:
		return o.UsageError(stderr, "unexpected argument %s (demo takes no arguments)", strconv.Quote(rest[0]))
	case workers < 2 || workers > 64:
		return o.UsageError(stderr, "--workers must be 2-64, got %d", workers)
	case rounds < 1 || rounds > 1000:
		return o.UsageError(stderr, "--rounds must be 1-1000, got %d", rounds)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "dlock demo: %v\n", err)
		return exitBackend
	}
	dir, err := os.MkdirTemp("", "dlock-demo-")
	if err != nil {
		fmt.Fprintf(stderr, "dlock demo: %v\n", err)
		return exitBackend
	}
	defer os.RemoveAll(dir)
	u := rawURL
	if u == "" {
		u = "file://" + filepath.Join(dir, "locks")
	}
	stderr = &scrubWriter{w: stderr, secrets: secretsOf(u)}
	m, err := newDemoMetrics()
	if err != nil {
		fmt.Fprintf(stderr, "dlock demo: %v\n", err)
		return exitBackend
	}
	b, err := openBackend(u, openOptions{}) // check the URL and reachability up front
	if err != nil {
		return reportOpen(stderr, "demo", err)
	}
	defer b.close()
	if metricsAddr != "" {
		if err := m.serve(metricsAddr); err != nil {
			fmt.Fprintf(stderr, "dlock demo: %v\n", err)
			return exitUsage
		}
		defer m.close()
	}
	d := &demo{out: stdout, metrics: m, locker: b.locker, self: self, dir: dir, url: u, start: time.Now(), workers: workers, rounds: rounds}
	d.say("dlock demo — lock service %s, %d worker processes × %d increments", b.where, d.workers, d.rounds)
	if m.url != "" {
		d.say("metrics: %s (Prometheus text format; served until interrupted)", m.url)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for _, act := range []func(context.Context) error{d.actNoLock, d.actLock, d.actFencing} {
		if err := act(ctx); err != nil {
			fmt.Fprintf(stderr, "dlock demo: %v\n", err)
			return exitBackend
		}
	}
	sum, err := m.summary()
	if err != nil {
		fmt.Fprintf(stderr, "dlock demo: metrics: %v\n", err)
		return exitBackend
	}
	d.say("")
	d.say("METRICS — dlockprom, from the lock events of every process (alert rules: dlockprom/alerts.yml):")
	for _, l := range sum.lines() {
		d.say("  %s", l)
	}
	d.say("")
	d.say("done in %s. The lock gives one holder at a time while nothing fails; the fencing token keeps the data right when something does.", time.Since(d.start).Round(100*time.Millisecond))
	if m.url != "" {
		sig, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		d.say("serving %s until interrupted (Ctrl-C)", m.url)
		<-sig.Done()
	}
	return 0
}

func (d *demo) say(format string, args ...any) {
	if format == "" {
		fmt.Fprintln(d.out)
		return
	}
	fmt.Fprintf(d.out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// worker builds a re-execution of this binary as a demo worker. The lock
// URL travels in the environment, never on the command line (passwords).
// The worker reports its lock events to d.metrics; done, called once the
// worker has exited (or failed to start), waits until they are counted.
func (d *demo) worker(ctx context.Context, args ...string) (cmd *exec.Cmd, done func(), err error) {
	cmd = exec.CommandContext(ctx, d.self, append([]string{demoWorkerCmd}, args...)...)
	cmd.Env = append(os.Environ(), "DLOCK_URL="+d.url)
	cmd.Stderr = os.Stderr
	if done, err = d.metrics.attach(cmd); err != nil {
		return nil, nil, err
	}
	return cmd, done, nil
}

// runCounters runs the counter workers concurrently and returns the count.
func (d *demo) runCounters(ctx context.Context, file string, locked bool) (int, error) {
	if err := writeInt(file, 0); err != nil {
		return 0, err
	}
	// All workers start, then wait on stdin; closing it releases them
	// together, so they really run concurrently even on a slow machine.
	cmds := make([]*exec.Cmd, d.workers)
	gates := make([]io.WriteCloser, d.workers)
	for i := range cmds {
		args := []string{"counter", "--file", file, "--n", strconv.Itoa(d.rounds), "--gate"}
		if locked {
			args = append(args, "--key", "demo/counter")
		}
		var (
			done func()
			err  error
		)
		if cmds[i], done, err = d.worker(ctx, args...); err != nil {
			return 0, err
		}
		// Runs after the Waits below (or on an early return, once the
		// context's end has killed the started workers).
		defer done()
		if gates[i], err = cmds[i].StdinPipe(); err != nil {
			return 0, err
		}
		if err := cmds[i].Start(); err != nil {
			return 0, err
		}
	}
	for _, g := range gates {
		g.Close()
	}
	var firstErr error
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("counter worker: %v", err)
		}
	}
	if firstErr != nil {
		return 0, firstErr
	}
	return readInt(file)
}

func (d *demo) actNoLock(ctx context.Context) error {
	d.say("")
	d.say("ACT 1 — no lock. Each worker: read counter, think 1ms, write counter+1.")
	t := time.Now()
	n, err := d.runCounters(ctx, filepath.Join(d.dir, "counter-nolock"), false)
	if err != nil {
		return err
	}
	want := d.workers * d.rounds
	d.say("counter = %d, expected %d: %d updates LOST (%.0f%%) in %s", n, want, want-n, 100*float64(want-n)/float64(want), time.Since(t).Round(time.Millisecond))
	return nil
}

func (d *demo) actLock(ctx context.Context) error {
	d.say("")
	d.say("ACT 2 — the same workers under lock \"demo/counter\": each tries it and, when it is busy, waits for it.")
	t := time.Now()
	n, err := d.runCounters(ctx, filepath.Join(d.dir, "counter-locked"), true)
	if err != nil {
		return err
	}
	want := d.workers * d.rounds
	verdict := "correct"
	if n != want {
		verdict = "WRONG"
	}
	d.say("counter = %d, expected %d: %s, %d lock hand-offs in %s", n, want, verdict, want, time.Since(t).Round(time.Millisecond))
	if n != want {
		return fmt.Errorf("locked counter is %d, want %d", n, want)
	}
	return nil
}

func (d *demo) actFencing(ctx context.Context) error {
	d.say("")
	d.say("ACT 3 — a paused holder and the fencing guard. Account balance: 100.")
	d.say("        Worker A withdraws 30, worker B deposits 50: the right result is 120.")
	fenced, unfenced := filepath.Join(d.dir, "balance-fenced"), filepath.Join(d.dir, "balance-unfenced")
	for _, f := range []string{fenced, unfenced} {
		if err := writeInt(f, 100); err != nil {
			return err
		}
	}
	guardDir := filepath.Join(d.dir, "guard")
	common := []string{"--key", "demo/account", "--guard", guardDir, "--fenced", fenced, "--unfenced", unfenced}

	a, doneA, err := d.worker(ctx, append([]string{"withdraw", "--amount", "30", "--ttl", "1s"}, common...)...)
	if err != nil {
		return err
	}
	defer doneA()
	stdin, err := a.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := a.StdoutPipe()
	if err != nil {
		return err
	}
	if err := a.Start(); err != nil {
		return err
	}
	defer a.Wait()
	defer a.Process.Kill()
	lines := bufio.NewScanner(stdout)
	readLine := func() (string, error) {
		if lines.Scan() {
			return lines.Text(), nil
		}
		if err := lines.Err(); err != nil {
			return "", err
		}
		return "", errors.New("worker A exited early")
	}
	ready, err := readLine()
	if err != nil {
		return err
	}
	d.say("A (pid %d): %s", a.Process.Pid, ready)
	d.tryHeld(ctx, "demo/account")
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	d.say("A is PAUSED with SIGSTOP between its check of the lock and its write (a long GC pause). Its lease runs out.")

	b, doneB, err := d.worker(ctx, append([]string{"deposit", "--amount", "50", "--ttl", "10s"}, common...)...)
	if err != nil {
		a.Process.Signal(syscall.SIGCONT)
		return err
	}
	out, err := b.Output()
	doneB()
	if err != nil {
		a.Process.Signal(syscall.SIGCONT)
		return fmt.Errorf("worker B: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		d.say("B (another process): %s", l)
	}
	d.say("A is resumed with SIGCONT. It still believes it holds the lock and writes balance 70.")
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return err
	}
	for {
		l, err := readLine()
		if err != nil {
			break
		}
		d.say("A: %s", l)
	}
	if err := a.Wait(); err != nil {
		return fmt.Errorf("worker A: %v", err)
	}
	fb, err := readInt(fenced)
	if err != nil {
		return err
	}
	ub, err := readInt(unfenced)
	if err != nil {
		return err
	}
	d.say("")
	d.say("without fencing: balance = %3d  %s", ub, verdict(ub == 120, "B's deposit was overwritten by A's stale write"))
	d.say("with fencing:    balance = %3d  %s", fb, verdict(fb == 120, "A's stale write was rejected; it retried under a new lock"))
	if fb != 120 {
		return fmt.Errorf("fenced balance is %d, want 120", fb)
	}
	return nil
}

// tryHeld has the demo itself try a key a worker holds: refused, it is
// the contended acquisition the metrics show.
func (d *demo) tryHeld(ctx context.Context, key string) {
	lk, err := d.locker.TryAcquire(ctx, key, dlock.WithCallObserver(d.metrics.obs))
	switch {
	case err == nil:
		// The holder's lease ran out already (a very slow machine).
		_ = lk.Release(ctx)
		d.say("The demo process tries the lock too: it got it, A's lease had already run out.")
	case errors.Is(err, dlock.ErrNotAcquired):
		d.say("The demo process tries the lock too: refused, A holds it (a \"contended\" acquisition in the metrics).")
	default:
		d.say("The demo process tries the lock too: %v", err)
	}
}

func verdict(ok bool, why string) string {
	if ok {
		return "correct — " + why
	}
	return "CORRUPTED — " + why
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// writeInt replaces path atomically, so concurrent readers never see a
// torn value: lost updates in act 1 come from the race, not from I/O.
func writeInt(path string, v int) error {
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(v)+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
