package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// backend is an opened lock service.
type backend struct {
	locker dlock.Locker
	// probe checks the service answers (PING, a read...).
	probe func(ctx context.Context) error
	close func()
	// where is the URL with every secret redacted, for messages.
	where string
	// nodes are the independent nodes of a redlock:// backend, for ls's
	// per-node state (ls_nodes.go); nil for the others.
	nodes []backendNode
	// redis are the Redis servers that hold the leases (redis[s],
	// redis[s]+sentinel: the master; redlock[s]: each node), for check's
	// configuration warnings; nil for the other backends.
	redis []redisServer
}

// redisServer is a Redis server of a backend, named for messages.
type redisServer struct {
	name string
	c    redis.UniversalClient
}

// openOptions are the connection settings shared by the subcommands.
type openOptions struct {
	// connectTimeout bounds connecting and the first probe of the service.
	connectTimeout time.Duration
	// verbose routes the client libraries' own logs to logs, and the
	// lock's events (acquired, renewal failures, lost, released) through
	// dlock's log/slog Observer.
	verbose bool
	logs    io.Writer
	// readOnly is for commands that change nothing (ls): a file backend's
	// directory must exist already (errNoLockDir); it is not created.
	readOnly bool
	// warnSentinels writes to logs a warning for each Sentinel of a
	// Sentinel URL that does not answer and is left out (ls sets it;
	// with verbose every command does). Those that refuse connections
	// are left to ls's own endpoint warnings when it is set.
	warnSentinels bool
	// start is when openBackend began: connecting and the first probe
	// end by start + connectTimeout.
	start time.Time
}

// lockOptions are the options every backend's New gets: with --verbose,
// dlock's log/slog Observer writing to logs.
func (o openOptions) lockOptions() []driver.Option {
	if !o.verbose || o.logs == nil {
		return nil
	}
	return []driver.Option{dlock.WithObserver(dlock.NewSlogObserver(slog.New(slog.NewTextHandler(o.logs, nil))))}
}

// errNoLockDir: a read-only command was given a lock directory that does
// not exist.
var errNoLockDir = errors.New("no such lock directory")

// defaultConnectTimeout is --connect-timeout's default.
const defaultConnectTimeout = 5 * time.Second

// clientIOTimeout is the CLI's Redis clients' read and write timeout for a
// request without a deadline of its own.
const clientIOTimeout = 3 * time.Second

// openBackend parses raw, connects and probes the service within
// o.connectTimeout. URL errors wrap errBadURL.
func openBackend(raw string, o openOptions) (*backend, error) {
	if raw == "" {
		raw = defaultURL()
	}
	if o.connectTimeout <= 0 {
		o.connectTimeout = defaultConnectTimeout
	}
	o.start = time.Now()
	t, err := parseURL(raw)
	if err != nil {
		return nil, err
	}
	setClientLogs(o, t.secrets)
	b, err := t.open(o)
	if err != nil {
		return nil, err
	}
	b.close = closeWithin(b.close, closeTimeout)
	if b.probe != nil {
		if err := t.probeService(b, o); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// closeTimeout bounds closing a backend's clients: a client still waiting
// on a server that does not answer (a Sentinel asked for its master) may
// block Close for seconds.
const closeTimeout = 250 * time.Millisecond

// closeWithin makes close return after at most d; the rest of the work
// goes on in the background.
func closeWithin(f func(), d time.Duration) func() {
	return func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			f()
		}()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
	}
}

// probeService checks that the service answers, within o.connectTimeout,
// and on failure explains why, within the same bound: the probe, the
// search for a TLS mismatch and closing the clients together end by the
// deadline, whatever the service does. A probe that timed out is not
// followed by a second connection to look for a mismatch. Where a mismatch
// looks like a timeout (rediss:// to a plaintext Redis, which waits for
// the end of a line that never comes; etcd, whose gRPC client retries
// until the deadline) the look starts halfway, while the probe still
// waits.
func (t *target) probeService(b *backend, o openOptions) error {
	if o.start.IsZero() {
		o.start = time.Now()
	}
	deadline := o.start.Add(o.connectTimeout)
	probed := make(chan error, 1)
	go func() { probed <- bounded(o.start, o.connectTimeout, "--connect-timeout", b.probe) }()
	var early <-chan time.Time
	if t.Scheme != "redis" { // a TLS server hangs up on plaintext at once
		tm := time.NewTimer(time.Until(deadline) / 2)
		defer tm.Stop()
		early = tm.C
	}
	var (
		err  error
		look <-chan bool  // the other protocol was found
		diag <-chan error // why a TLS handshake fails, if it does
	)
	for done := false; !done; {
		select {
		case <-early:
			early = nil
			look = t.lookForMismatch(deadline)
			diag = t.diagnoseTLS(deadline)
		case err = <-probed:
			done = true
		}
	}
	if err == nil {
		return nil
	}
	go b.close() // bounded by closeWithin, but nothing to wait for here
	if rerr := redis.Error(nil); errors.As(err, &rerr) {
		// An error reply: the server speaks plaintext Redis (or TLS worked),
		// so there is no mismatch to look for; a look started early ends by
		// the deadline on its own (its channel is buffered).
		return t.explain(err, false, nil)
	}
	var noAnswer errNoAnswer
	if look == nil && !errors.As(err, &noAnswer) {
		look = t.lookForMismatch(deadline)
	}
	if diag == nil && !errors.As(err, &noAnswer) && t.tlsAdvice(err) == "" {
		// The client failed early and its error says nothing of TLS: a
		// server that refused the client's certificate may have reset the
		// connection before the client read the alert saying so, which
		// depends on timing. Look for the alert now.
		diag = t.diagnoseTLS(deadline)
	}
	found := false
	tm := time.NewTimer(time.Until(deadline) + 250*time.Millisecond)
	defer tm.Stop()
	expired := false
	if look != nil {
		select {
		case found = <-look:
		case <-tm.C:
			expired = true
		}
	}
	var tlsErr error
	if diag != nil && !expired {
		select {
		case tlsErr = <-diag:
		case <-tm.C:
		}
	}
	return t.explain(err, found, tlsErr)
}

// bounded runs f with a context that ends d after start, and gives up on
// f shortly after that even if f ignores its context. Timeouts come back
// as errNoAnswer.
func bounded(start time.Time, d time.Duration, flag string, f func(context.Context) error) error {
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(d))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t := time.NewTimer(time.Until(start.Add(d + 250*time.Millisecond)))
	defer t.Stop()
	select {
	case err := <-done:
		var te interface{ Timeout() bool }
		if err != nil && (ctx.Err() != nil || errors.As(err, &te) && te.Timeout()) {
			return errNoAnswer{time.Since(start), d, flag, err}
		}
		return err
	case <-t.C:
		return errNoAnswer{time.Since(start), d, flag, nil}
	}
}

// errNoAnswer: the service did not answer in time.
type errNoAnswer struct {
	after, limit time.Duration
	flag         string
	err          error
}

func (e errNoAnswer) Error() string {
	s := fmt.Sprintf("no answer after %s (%s %s)", e.after.Round(10*time.Millisecond), e.flag, e.limit)
	if e.err != nil {
		s += ": " + e.err.Error()
	}
	return s
}

func (e errNoAnswer) Unwrap() error { return e.err }

// reportOpen prints a backend-open error and returns the exit status.
func reportOpen(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "dlock %s: %v\n", cmd, err)
	if errors.Is(err, errBadURL) || errors.Is(err, dlock.ErrInvalidOption) {
		return exitUsage
	}
	return exitBackend
}
