package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

const checkUsage = `Usage: dlock check [--url URL|--url-file PATH] [--connect-timeout 5s]
                   [--read-only] [--json] [--strict]

Checks that the lock service works, for monitoring and health probes: it
connects, then makes one real lock round trip, taking the lock
"dlock/check/<hostname>" with a 10s lease and releasing it at once (the
lock being held by another check from this host at that moment counts as
an answer too). It prints
  ok: redis 127.0.0.1:6379 in 1.2ms
and exits 0, or prints the error and exits 3 (2 for a bad URL). The whole
check, connecting included, ends within --connect-timeout (and a fraction
of a second), even when a server accepts the connection and never answers.

For a redis[s]://, redis[s]+cluster:// or redis[s]+sentinel:// URL a second
line says which protocol the locks take, and why:
  redis protocol: scripts (the server runs this client's scripts)
tair is the Lua-free protocol on Tair's CAS and CAD (exclusive locks only),
taken when the server refuses the user's scripts and offers CAS and CAD, or
with ?lock_protocol=tair. A server that refuses the scripts and lacks CAS
and CAD fails the lock round trip, and with --read-only gets a warning.

The probe key is one per host, not one per check: services keep a fencing
counter (or a row, a znode) per key, and a probe every few seconds must not
leave a new one behind each time. --read-only lists the keys under
"dlock/check/" instead: it writes nothing, but cannot notice a service that
takes no writes (a read-only replica, a full disk).

Warnings (on stderr; exit status 0, or 1 with --strict) name servers that
did not answer, and settings that put the locks at risk:
  - a Redis that evicts keys (maxmemory above 0 and a maxmemory-policy
    other than noeviction, volatile-* included: lock keys carry TTLs) may
    delete a held lock's key when full, and grant the lock twice;
  - a Redis that persists nothing (appendonly no and no save rules)
    forgets every holder when it restarts and grants their locks again
    while they still run: safe only where the resource checks fencing
    tokens;
  - a Sentinel URL that names one Sentinel loses the master while that
    Sentinel is down;
  - ?acks=N above the replicas the Redis has connected (INFO replication)
    makes every acquisition and renewal fail.
The Redis checks need CONFIG GET (and INFO); a server that refuses them
gets a warning saying so.

--json prints one object: ok (true or false), backend, address, probe
("lock" or "list"), elapsed_ms, error when not ok, warnings, and for Redis
protocol ("scripts" or "tair") and protocol_reason.

Kubernetes exec probe (keep the URL, and its password, in a Secret passed
as $DLOCK_URL):
  readinessProbe:
    exec:
      command: ["dlock", "check", "--connect-timeout", "3s"]
    periodSeconds: 10
    timeoutSeconds: 5
  env:
    - name: DLOCK_URL
      valueFrom: {secretKeyRef: {name: dlock, key: url}}

Options:
`

// checkKeyPrefix starts the key that dlock check locks.
const checkKeyPrefix = "dlock/check/"

// checkTTL is the lease of check's probe lock: released at once, it only
// matters when the check is killed while holding it.
const checkTTL = 10 * time.Second

// checkGrace is how long after --connect-timeout check gives up on a
// round trip that ignores its deadline.
const checkGrace = 250 * time.Millisecond

// checkResult is check's outcome, and its --json form.
type checkResult struct {
	OK        bool     `json:"ok"`
	Backend   string   `json:"backend"`
	Address   string   `json:"address"`
	Probe     string   `json:"probe"`
	ElapsedMs float64  `json:"elapsed_ms"`
	Error     string   `json:"error,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
	// Protocol is the protocol a redislock Locker's requests take
	// ("scripts" or "tair"), ProtocolReason why; empty for the other
	// backends.
	Protocol       string `json:"protocol,omitempty"`
	ProtocolReason string `json:"protocol_reason,omitempty"`

	busy  bool // the probe lock was held by another check
	usage bool // a bad URL or option: exit 2
}

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	o := newOptions("check", checkUsage)
	var (
		rawURL           string
		connect          = defaultConnectTimeout
		readOnly, asJSON bool
		strict           bool
	)
	urlSrc := defineURL(o, &rawURL, urlHelp)
	o.Duration(&connect, "", "connect-timeout", "DUR", "bound on the whole check (default 5s)")
	o.Bool(&readOnly, "", "read-only", "list instead of taking a lock: writes nothing")
	o.Bool(&asJSON, "", "json", "print JSON")
	o.Bool(&strict, "", "strict", "exit 1 on any warning, unsafe settings of the lock service included")
	rest, code, ok := o.Parse(args, stdout, stderr)
	if !ok {
		return code
	}
	if err := urlSrc.check(); err != nil {
		return o.UsageError(stderr, "%v", err)
	}
	if len(rest) > 0 {
		return o.UsageError(stderr, "no arguments expected, got %s", strconv.Quote(strings.Join(rest, " ")))
	}
	if connect <= 0 {
		return o.UsageError(stderr, "--connect-timeout must be positive, got %v", connect)
	}
	raw := rawURL
	if raw == "" {
		raw = defaultURL()
	}
	secrets := secretsOf(raw)
	stderr = &scrubWriter{w: stderr, secrets: secrets}
	res := checkResult{Probe: "lock"}
	if readOnly {
		res.Probe = "list"
	}
	res.Backend, res.Address = checkTarget(raw)

	start := time.Now()
	done := make(chan checkResult, 1) // buffered: a round trip that ends late never blocks
	go func() {
		r := res
		busy, proto, warnings, err := probeService(raw, connect, readOnly)
		r.busy, r.Warnings = busy, warnings
		r.Protocol, r.ProtocolReason = proto.name, proto.why
		r.setErr(err)
		done <- r
	}()
	t := time.NewTimer(connect + checkGrace)
	defer t.Stop()
	select {
	case res = <-done:
	case <-t.C:
		// The round trip ignored its deadline: do not wait for it.
		res.Error = checkGaveUp(raw, time.Since(start), connect)
	}
	elapsed := time.Since(start)
	res.ElapsedMs = float64(elapsed.Microseconds()) / 1000
	res.OK = res.Error == ""
	res.Error = scrub(res.Error, secrets)
	for i, w := range res.Warnings {
		res.Warnings[i] = scrub(w, secrets)
	}

	code = 0
	switch {
	case res.usage:
		code = exitUsage
	case !res.OK:
		code = exitBackend
	case strict && len(res.Warnings) > 0:
		code = exitConflict
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(res); err != nil {
			return exitBackend
		}
		return code
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(stderr, w)
	}
	if !res.OK {
		fmt.Fprintf(stderr, "dlock check: %s\n", res.Error)
		return code
	}
	busy := ""
	if res.busy {
		busy = " (the probe lock was held by another check)"
	}
	fmt.Fprintf(stdout, "ok: %s %s in %s%s\n", res.Backend, quoteField(res.Address), fmtElapsed(elapsed), busy)
	if res.Protocol != "" {
		fmt.Fprintf(stdout, "redis protocol: %s (%s)\n", res.Protocol, res.ProtocolReason)
	}
	if code != 0 {
		fmt.Fprintf(stderr, "dlock check: --strict: %d warning(s)\n", len(res.Warnings))
	}
	return code
}

// checkGaveUp is check's error when it gave up on the round trip by its
// own bound: worded as the open's own error would have been ("URL: not
// reachable: no answer after ..."), which the round trip's bound, just as
// long, would have given on a machine less loaded.
func checkGaveUp(raw string, after, connect time.Duration) string {
	where := redact(raw)
	if t, err := parseURL(raw); err == nil {
		where = t.where
	}
	return fmt.Sprintf("%s: not reachable: %v", where, errNoAnswer{after, connect, "--connect-timeout", nil})
}

// setErr records err, if any, in r (as text: r is also check's JSON).
func (r *checkResult) setErr(err error) {
	if err == nil {
		return
	}
	r.Error = err.Error()
	r.usage = errors.Is(err, errBadURL) || errors.Is(err, dlock.ErrInvalidOption)
}

// lockProtocol is the protocol a redislock Locker's requests take, by
// name, and why.
type lockProtocol struct{ name, why string }

// probeService opens the service and makes check's round trip: a lock
// taken and released, or with readOnly a listing. busy reports that the
// probe lock was held (by another check): the service answered. proto is
// the protocol a Redis backend's locks take (redisProtocol). After a
// round trip that worked, warnings name the servers that did not answer
// (a Redlock node; an etcd, ZooKeeper or Sentinel address that refuses
// connections): the service works without them, for now. Opening and
// the round trip end by connect, as far as the clients honour their
// context (cmdCheck does not wait longer).
func probeService(raw string, connect time.Duration, readOnly bool) (busy bool, proto lockProtocol, warnings []string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), connect)
	defer cancel()
	// A client that retries a refused connection until the deadline
	// (etcd's) reports "no answer", which sends an operator looking for
	// a hung server rather than a stopped one: a probe still going at
	// half the budget dials the servers (a healthy service gets no extra
	// connection), and a failure names those that refuse.
	t, _ := parseURL(raw)
	dials := make(chan []error, 1) // buffered: the dialer never blocks
	var dialer *time.Timer
	if t != nil && len(t.Addrs) > 0 {
		dialer = time.AfterFunc(connect/2, func() { dials <- dialAll(t.Addrs, connect/2) })
		defer dialer.Stop()
	}
	withRefused := func(err error) error {
		// Unless the error says so already (explain flattens it to text).
		if dialer == nil || strings.Contains(err.Error(), "connection refused") || errors.Is(err, errBadURL) {
			return err
		}
		var errs []error
		if dialer.Stop() {
			errs = dialAll(t.Addrs, checkGrace/3) // failed early: dial now (a refusal is immediate)
		} else {
			select {
			case errs = <-dials:
			case <-time.After(checkGrace / 3): // still dialing: no news
			}
		}
		var refused []string
		for i, e := range errs {
			if errors.Is(e, syscall.ECONNREFUSED) {
				refused = append(refused, t.Addrs[i])
			}
		}
		if len(refused) > 0 {
			return fmt.Errorf("%w; connection refused by %s", err, strings.Join(refused, ", "))
		}
		return err
	}
	b, err := openBackend(raw, openOptions{connectTimeout: connect, readOnly: readOnly})
	if err != nil {
		return false, proto, nil, withRefused(err)
	}
	defer b.close()
	busy, err = roundTrip(ctx, b, connect, readOnly)
	if err != nil {
		return false, proto, nil, withRefused(err)
	}
	proto, warnings = redisProtocol(ctx, b)
	if t != nil {
		if left := time.Until(deadlineOf(ctx)); left > 0 { // 0 would be no bound
			warnings = append(warnings, endpointWarnings(t, left)...)
		}
		warnings = append(warnings, settingsWarnings(ctx, t, b)...)
	}
	if b.nodes != nil {
		// The round trip worked: a node that does not answer soon after
		// the others only gets a warning, without making the check slow
		// (go-redis retries a refused connection for seconds).
		states := listNodes(ctx, checkKeyPrefix, b.nodes, connect/10)
		up := 0
		for _, s := range states {
			if s.err == nil {
				up++
			}
		}
		for _, s := range states {
			if s.err != nil {
				warnings = append(warnings, fmt.Sprintf("warning: node %s %s: %v; %d/%d nodes answered", s.addr, nodeFailure(s.err), s.err, up, len(states)))
			}
		}
	}
	return busy, proto, warnings, nil
}

// redisProtocol asks a redislock backend's Locker which protocol its
// requests take (redislock.Locker.Protocol, within ctx): after the round
// trip it knows whether the server refused a script, and otherwise sends
// one that touches no key. Other backends have no protocol to report. A
// Locker that cannot tell (the server refuses the scripts and lacks CAS
// and CAD) gets a warning instead.
func redisProtocol(ctx context.Context, b *backend) (lockProtocol, []string) {
	l, ok := b.locker.(*redislock.Locker)
	if !ok {
		return lockProtocol{}, nil
	}
	p, why, err := l.Protocol(ctx)
	if err != nil {
		return lockProtocol{}, []string{fmt.Sprintf("warning: %s: cannot tell which protocol the locks take: %s", b.where, oneLine(err.Error()))}
	}
	return lockProtocol{p.String(), why}, nil
}

// dialAll opens (and closes) a TCP connection to each address at once,
// each within timeout, and returns the dial errors, by address.
func dialAll(addrs []string, timeout time.Duration) []error {
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", a, timeout)
			if err == nil {
				c.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errs
}

// deadlineOf is ctx's deadline (ctx has one).
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// roundTrip is check's round trip on an opened backend.
func roundTrip(ctx context.Context, b *backend, connect time.Duration, readOnly bool) (busy bool, err error) {
	fail := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %s: no answer within --connect-timeout %v: %w", b.where, what, connect, err)
		}
		return fmt.Errorf("%s: %s: %w", b.where, what, err)
	}
	if readOnly {
		if _, err := b.list(ctx, checkKeyPrefix); err != nil {
			return false, fail("list", err)
		}
		return false, nil
	}
	key := checkKeyPrefix + checkHost()
	lk, err := b.locker.TryAcquire(ctx, key, dlock.WithTTL(checkTTL), dlock.WithMetadata("cmd", "dlock check"))
	var na *dlock.NotAcquiredError
	switch {
	case errors.As(err, &na) || errors.Is(err, dlock.ErrNotAcquired):
		return true, nil
	case err != nil:
		return false, fail(fmt.Sprintf("lock %q", key), err)
	}
	if err := lk.Release(ctx); err != nil {
		return false, fail(fmt.Sprintf("release %q", key), err)
	}
	return false, nil
}

// checkHost is the host part of check's probe key.
func checkHost() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host"
	}
	return h
}

// checkKinds names the backends for check's line.
var checkKinds = map[string]string{
	"file": "file", "redis": "redis", "rediss": "redis",
	"redis+cluster": "redis-cluster", "rediss+cluster": "redis-cluster",
	"redis+sentinel": "redis-sentinel", "rediss+sentinel": "redis-sentinel",
	"redlock": "redlock", "redlocks": "redlock", "etcd": "etcd", "etcds": "etcd",
	"zk": "zookeeper", "postgres": "postgres", "postgresql": "postgres",
}

// checkTarget returns the backend's kind and address for check's line:
// the servers' host:port, the lock directory, or the redacted URL.
func checkTarget(raw string) (kind, addr string) {
	t, err := parseURL(raw)
	if err != nil {
		return "unknown", redact(raw)
	}
	kind = checkKinds[t.Scheme]
	if kind == "" {
		kind = t.Scheme
	}
	switch {
	case len(t.Addrs) > 0:
		addr = strings.Join(t.Addrs, ",")
	case t.Dir != "":
		addr = t.Dir
	default:
		addr = t.where
	}
	return kind, addr
}

// fmtElapsed formats check's elapsed time: 1.2ms, 350.4ms, 1.204s.
func fmtElapsed(d time.Duration) string {
	if d < time.Second {
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// settingsWarnings names the settings of the lock service that put the
// locks' safety at risk: a Sentinel URL with one Sentinel, and for each
// Redis server that holds leases, eviction, no persistence, and fewer
// connected replicas than ?acks= asks for.
func settingsWarnings(ctx context.Context, t *target, b *backend) []string {
	var w []string
	if strings.HasSuffix(t.Scheme, "+sentinel") && len(t.Addrs) == 1 {
		w = append(w, "warning: the URL names one Sentinel: while it is down no client can find the master, and one Sentinel alone cannot agree a failover; list every Sentinel (three or more)")
	}
	for _, s := range b.redis {
		w = append(w, redisSettingsWarnings(ctx, s, t.Acks)...)
	}
	return w
}

// redisSettingsWarnings checks one Redis server's configuration.
func redisSettingsWarnings(ctx context.Context, s redisServer, acks int) []string {
	var w []string
	cfg := map[string]string{}
	for _, p := range []string{"maxmemory", "maxmemory-policy", "appendonly", "save"} {
		m, err := s.c.ConfigGet(ctx, p).Result()
		if err != nil {
			return append(w, fmt.Sprintf("warning: %s: cannot read its eviction and persistence settings (CONFIG GET %s: %v)", s.name, p, oneLine(err.Error())))
		}
		cfg[p] = m[p]
	}
	if mm, _ := strconv.ParseInt(cfg["maxmemory"], 10, 64); mm > 0 && cfg["maxmemory-policy"] != "noeviction" {
		w = append(w, fmt.Sprintf("warning: %s evicts keys (maxmemory %d, maxmemory-policy %s): when full it may delete a held lock's key (volatile-* policies too: lock keys carry TTLs) and grant the lock to a second holder; set maxmemory-policy noeviction", s.name, mm, cfg["maxmemory-policy"]))
	}
	if cfg["appendonly"] == "no" && strings.TrimSpace(cfg["save"]) == "" {
		w = append(w, fmt.Sprintf("warning: %s persists nothing (appendonly no, no save rules): a restart forgets every holder and grants their locks again while they still run, safe only where the resource checks fencing tokens; set appendonly yes", s.name))
	}
	if acks > 0 {
		info, err := s.c.Info(ctx, "replication").Result()
		if err != nil {
			return append(w, fmt.Sprintf("warning: %s: cannot count its replicas for ?acks=%d (INFO replication: %v)", s.name, acks, oneLine(err.Error())))
		}
		if n := connectedReplicas(info); n < acks {
			w = append(w, fmt.Sprintf("warning: ?acks=%d but %s has %d connected replica(s): every acquisition and renewal fails until %d are connected", acks, s.name, n, acks))
		}
	}
	return w
}

// connectedReplicas reads connected_slaves from INFO replication (-1 if
// absent).
func connectedReplicas(info string) int {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}
