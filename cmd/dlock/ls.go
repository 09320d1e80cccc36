package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
)

const lsUsage = `Usage: dlock ls [--url URL] [--json] [--connect-timeout 5s] [--verbose] [PREFIX]

Lists the locks currently held (whose key starts with PREFIX), one line per
holder: key, mode (exclusive; shared: a read lock, from dlock run --shared;
limited: one of LIMIT permits, from dlock run --limit N), the limit ("-"
unless limited), owner, host and pid of the holder, fencing token, time
left on the lease ("-" where other clients cannot know it: ZooKeeper's
lease is its holder's session), the number of clients queued for the key,
where the backend keeps a queue (ZooKeeper, Redis; "-" where it cannot
tell), and the holder's other metadata (key=value,...). A key held shared
or by several permits has a line for each holder, by token.

--json prints an array with an object per holder: key, mode, limit (for
limited keys), holders (how many hold the key), owner (in full), token,
ttl_ms (0 where unknown), waiters (-1 where unknown) and metadata.
ls changes nothing: a file:// lock directory that does not exist is an
error (exit 3), except the default one before its first use (no locks).

Examples:
  dlock ls
  dlock ls --url redis://127.0.0.1:6379 inventory/
  dlock ls --json | jq '.[].key'

Options:
`

func cmdLs(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rawURL := fs.String("url", "", "lock service URL (default $DLOCK_URL, else file:// in the state dir)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	connect := fs.Duration("connect-timeout", defaultConnectTimeout, "bound on connecting to and probing the lock service")
	verbose := fs.Bool("verbose", false, "print the client libraries' logs on stderr")
	fs.Usage = func() { fmt.Fprint(fs.Output(), lsUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if fs.NArg() > 1 {
		fmt.Fprintf(stderr, "dlock ls: at most one PREFIX, got %d arguments\n", fs.NArg())
		return exitUsage
	}
	if *connect <= 0 {
		fmt.Fprintf(stderr, "dlock ls: --connect-timeout must be positive, got %v\n", *connect)
		return exitUsage
	}
	raw := *rawURL
	if raw == "" {
		raw = defaultURL()
	}
	stderr = &scrubWriter{w: stderr, secrets: secretsOf(raw)}
	// ls creates nothing: a lock directory that does not exist is an
	// error, unless it is the default one, where no lock was ever taken.
	var infos []lockInfo
	where := redact(raw)
	b, err := openBackend(raw, openOptions{connectTimeout: *connect, verbose: *verbose, logs: stderr, readOnly: true})
	switch {
	case errors.Is(err, errNoLockDir) && raw == "file://"+stateDir():
	case err != nil:
		return reportOpen(stderr, "ls", err)
	default:
		defer b.close()
		where = b.where
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if infos, err = b.list(ctx, fs.Arg(0)); err != nil {
			fmt.Fprintf(stderr, "dlock ls: %s: %v\n", b.where, err)
			return exitBackend
		}
	}
	return printLocks(stdout, infos, where, *asJSON)
}

// printLocks prints ls's table, or its JSON with asJSON, and returns the
// exit status.
func printLocks(stdout io.Writer, infos []lockInfo, where string, asJSON bool) int {
	if asJSON {
		for i := range infos {
			infos[i].TTLms = infos[i].TTL.Milliseconds()
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
	fmt.Fprintln(tw, "KEY\tMODE\tLIMIT\tOWNER\tHOST\tPID\tTOKEN\tTTL\tWAITERS\tMETADATA")
	for _, in := range infos {
		owner := in.Owner
		if len(owner) > 12 {
			owner = owner[:12]
		}
		// Keys and metadata may hold anything: quote the odd ones (see
		// text.go), so that each lock is one line of plain text.
		ttl, waiters, limit := "-", "-", "-"
		if in.Limit > 0 {
			limit = strconv.Itoa(in.Limit)
		}
		if in.TTL > 0 {
			ttl = in.TTL.Round(time.Millisecond).String()
		}
		if in.Waiters >= 0 {
			waiters = strconv.Itoa(in.Waiters)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", quoteField(in.Key), quoteField(in.Mode), limit, dash(quoteField(owner)),
			dash(quoteField(in.Metadata[dlock.MetaHost])), dash(quoteField(in.Metadata[dlock.MetaPID])), in.Token, ttl, waiters, dash(quoteField(otherMetadata(in.Metadata))))
	}
	tw.Flush()
	return 0
}

// otherMetadata is md without host and pid (ls's own columns), as
// "k=v,k=v" sorted by key.
func otherMetadata(md map[string]string) string {
	var kvs []string
	for k, v := range md {
		if k != dlock.MetaHost && k != dlock.MetaPID {
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
