package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
)

const lsUsage = `Usage: dlock ls [--url URL|--url-file PATH] [--json] [--nodes]
                [--watch [DUR] [--count N]] [--connect-timeout 5s] [--verbose]
                [PREFIX]

Lists the locks currently held (whose key starts with PREFIX), one line per
holder, in columns:
  KEY       the lock's key
  MODE      exclusive; shared: a read lock, from dlock run --shared;
            limited: one of LIMIT permits, from dlock run --limit N
  HOLDER    owner/host/pid: the first 12 hex digits of the holder's owner
            id, the host and the pid of the process holding it
  TOKEN     the holder's fencing token
  HELD-FOR  time since the holder acquired the key: by the server's
            clock on PostgreSQL, else by the holder's clock (metadata
            "acquired") against this machine's; "-" when unknown
  TTL-LEFT  time left on the lease ("-" where other clients cannot know
            it: ZooKeeper's lease is its holder's session)
  WAITERS   clients queued for the key, where the backend keeps a queue
            (ZooKeeper, Redis; "-" where it cannot tell)
  LIMIT     the number of permits of a limited key ("-" otherwise)
  METADATA  the holder's other metadata (key=value,...)
A key held shared or by several permits has a line for each holder, by
token.

redlock:// lists every node and shows a lock held by a majority of them
for one owner. A node that does not answer (within --connect-timeout once
a majority has) gets a warning on stderr ("warning: node H:P unreachable:
...; listing from 2/3 nodes") and the listing goes on; without a majority
nothing can be listed (exit 3). --nodes (or --verbose) adds a table of
each node's leases: which node holds which key for whom, and whether the
lease counts (QUORUM yes) or is a minority's (no). For etcd, ZooKeeper and
Sentinel URLs with several addresses, ls warns about the addresses that
refuse connections, and about the Sentinels that accept connections but
do not answer (a hung process), and lists through the others.

--watch lists again every DUR (default 2s; --watch=DUR, or --watch DUR
when DUR is a duration such as 500ms or a number of seconds) until
interrupted, or --count N times. On a terminal it redraws the screen;
otherwise (a pipe, a file) it prints the tables one after the other, each
after a line "--- <time> ---" (--json: the arrays only, which jq reads as a
stream). A listing that fails is reported on stderr and the watch goes on;
the exit status is the last listing's.

--json prints an array with an object per holder: key, mode, limit (for
limited keys), holders (how many hold the key), owner (in full), token,
ttl_ms (0 where unknown), held_for_ms (-1 where unknown), waiters (-1 where
unknown), metadata, and for redlock nodes (the nodes holding the lease).
ls changes nothing: a file:// lock directory that does not exist is an
error (exit 3), except the default one before its first use (no locks).

Examples:
  dlock ls
  dlock ls --url redis://127.0.0.1:6379 inventory/
  dlock ls --json | jq '.[].key'
  dlock ls --url redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379 --nodes
  dlock ls --watch 1s jobs/

Options:
`

// lsMinInterval is the shortest --watch interval.
const lsMinInterval = 100 * time.Millisecond

// lsDefaultInterval is --watch's interval when none is given.
const lsDefaultInterval = 2 * time.Second

// lsListTimeout bounds one listing.
const lsListTimeout = 30 * time.Second

func cmdLs(args []string, stdout, stderr io.Writer) int {
	o := newOptions("ls", lsUsage)
	var (
		rawURL        string
		asJSON, nodes bool
		watch         watchFlag
		count         int
		connect       = defaultConnectTimeout
		verbose       bool
	)
	urlSrc := defineURL(o, &rawURL, urlHelp)
	o.Bool(&asJSON, "", "json", "print JSON instead of a table")
	o.Bool(&nodes, "", "nodes", "redlock: also print each node's leases")
	o.Var(&watch, "", "watch", "[DUR]", "list again every DUR (default 2s; a duration or seconds, at least 100ms) until interrupted")
	countSet := false
	o.Var(countFlag{&count, &countSet}, "", "count", "N", "with --watch: stop after N listings (N at least 1)")
	o.Duration(&connect, "", "connect-timeout", "DUR", "bound on connecting to and probing the lock service (default 5s)")
	o.Bool(&verbose, "", "verbose", "print the client libraries' logs on stderr, and --nodes")
	rest, code, ok := o.Parse(joinWatchArg(args), stdout, stderr)
	if !ok {
		return code
	}
	if err := urlSrc.check(); err != nil {
		return o.UsageError(stderr, "%v", err)
	}
	if len(rest) > 1 {
		return o.UsageError(stderr, "at most one PREFIX, got %d arguments", len(rest))
	}
	if connect <= 0 {
		return o.UsageError(stderr, "--connect-timeout must be positive, got %v", connect)
	}
	if countSet && (count <= 0 || watch.every == 0) {
		return o.UsageError(stderr, "--count takes a positive number and goes with --watch")
	}
	prefix := ""
	if len(rest) == 1 {
		prefix = rest[0]
	}
	raw := rawURL
	if raw == "" {
		raw = defaultURL()
	}
	stderr = &scrubWriter{w: stderr, secrets: secretsOf(raw)}
	l := lister{prefix: prefix, where: redact(raw), connect: connect}
	if t, err := parseURL(raw); err == nil {
		l.target = t
	}
	// ls creates nothing: a lock directory that does not exist is an
	// error, unless it is the default one, where no lock was ever taken.
	b, err := openBackend(raw, openOptions{connectTimeout: connect, verbose: verbose, logs: stderr, readOnly: true, warnSentinels: true})
	switch {
	case errors.Is(err, errNoLockDir) && raw == "file://"+stateDir():
	case err != nil:
		return reportOpen(stderr, "ls", err)
	default:
		defer b.close()
		l.b, l.where = b, b.where
	}
	if nodes && (b == nil || b.nodes == nil) {
		fmt.Fprintf(stderr, "dlock ls: --nodes: %s has no per-node lock state (only redlock:// has)\n", l.where)
	}
	l.nodes = nodes || verbose
	out := lsOutput{stdout: stdout, stderr: stderr, json: asJSON}
	if watch.every == 0 {
		return out.show(l.list(context.Background()), l.where)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return l.watch(ctx, out, watch.every, count)
}

// lister lists the locks of one backend, again and again with --watch.
type lister struct {
	b       *backend // nil: the default lock directory, not made yet
	target  *target  // nil when parseURL failed (openBackend reported it)
	prefix  string
	where   string
	connect time.Duration
	nodes   bool // print the per-node table (redlock)
}

// lsView is one listing.
type lsView struct {
	rows     []lockInfo
	states   []nodeState // per node (redlock), for the --nodes table
	nodes    bool
	warnings []string
	err      error
}

// list lists once, within lsListTimeout.
func (l *lister) list(ctx context.Context) lsView {
	v := lsView{nodes: l.nodes}
	if l.b == nil {
		return v
	}
	ctx, cancel := context.WithTimeout(ctx, lsListTimeout)
	defer cancel()
	var ends chan []string
	if l.target != nil {
		ends = make(chan []string, 1)
		go func() { ends <- endpointWarnings(l.target, l.connect) }()
	}
	if l.b.nodes != nil {
		v.states = listNodes(ctx, l.prefix, l.b.nodes, l.connect)
		v.rows, v.warnings, v.err = aggregateNodes(v.states)
	} else {
		v.rows, v.err = l.b.list(ctx, l.prefix)
	}
	if ends != nil {
		v.warnings = append(<-ends, v.warnings...)
	}
	return v
}

// lsOutput is where and how ls prints.
type lsOutput struct {
	stdout, stderr io.Writer
	json           bool
}

// show prints a listing: warnings and errors on stderr, the table or JSON
// on stdout. It returns the exit status.
func (o lsOutput) show(v lsView, where string) int {
	for _, w := range v.warnings {
		fmt.Fprintln(o.stderr, w)
	}
	if v.err != nil {
		fmt.Fprintf(o.stderr, "dlock ls: %s: %v\n", where, v.err)
		return exitBackend
	}
	if code := printLocks(o.stdout, v.rows, where, o.json); code != 0 || o.json || !v.nodes || v.states == nil {
		return code
	}
	fmt.Fprintln(o.stdout)
	printNodes(o.stdout, v.states, v.rows)
	return 0
}

// printLocks prints ls's table, or its JSON with asJSON, and returns the
// exit status.
func printLocks(stdout io.Writer, infos []lockInfo, where string, asJSON bool) int {
	if asJSON {
		for i := range infos {
			infos[i].TTLms = infos[i].TTL.Milliseconds()
			infos[i].HeldForMs = -1
			if infos[i].HeldFor > 0 {
				infos[i].HeldForMs = infos[i].HeldFor.Milliseconds()
			}
		}
		if infos == nil {
			infos = []lockInfo{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(infos); err != nil {
			return exitBackend
		}
		return 0
	}
	if len(infos) == 0 {
		fmt.Fprintf(stdout, "no locks held in %s\n", where)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODE\tHOLDER\tTOKEN\tHELD-FOR\tTTL-LEFT\tWAITERS\tLIMIT\tMETADATA")
	for _, in := range infos {
		// Keys and metadata may hold anything: quote the odd ones (see
		// text.go), so that each lock is one line of plain text.
		limit := "-"
		if in.Limit > 0 {
			limit = strconv.Itoa(in.Limit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", quoteField(in.Key), quoteField(in.Mode), holderField(in.Owner, in.Metadata),
			in.Token, fmtDur(in.HeldFor), fmtDur(in.TTL), fmtCount(in.Waiters), limit, dash(quoteField(otherMetadata(in.Metadata))))
	}
	tw.Flush()
	return 0
}

// otherMetadata is md without host, pid and acquired (ls's own columns),
// as "k=v,k=v" sorted by key.
func otherMetadata(md map[string]string) string {
	var kvs []string
	for k, v := range md {
		if k != dlock.MetaHost && k != dlock.MetaPID && k != dlock.MetaAcquired {
			kvs = append(kvs, k+"="+v)
		}
	}
	slices.Sort(kvs)
	return strings.Join(kvs, ",")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
