package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

const unlockUsage = `Usage: dlock unlock [--url URL|--url-file PATH] (--owner ID | --force)
                    [--json] [--connect-timeout 5s] [--timeout 30s] [--verbose]
                    KEY

Releases KEY on another holder's behalf. With --owner ID it releases only
the lease of that owner (DLOCK_OWNER in the holder's command, the OWNER of
dlock ls --json): for a shared or limited key, that holder alone. ID is
the owner id's 32 hex digits, or its first 8 or more (the 12 dlock ls
shows) when they start the id of exactly one holder of KEY; a prefix
shared by several holders is refused, naming their ids. With
--force it breaks the lock, whoever holds it: the exclusive holder, or
every shared or limited holder. Clients waiting for KEY stay queued and
the next one gets it, with a fencing token above every broken holder's, so
guards keep refusing the broken holder's writes once the next holder has
written. The broken holder finds out at its next renewal at the latest:
a dlock run holding it stops its command and exits 4.

It prints, for each lease removed,
  released KEY held by owner OWNER (host=HOST pid=PID) token N
or "KEY was not held" when --force finds it free. --json prints an object:
key, released (an array of owner, token, mode, ttl_ms, metadata) and, for
Redlock, nodes (owner and node of each removal) and node_errors.

--timeout bounds the whole command, connecting included (which
--connect-timeout bounds too): a lock service that does not answer within
it is exit 3, and the lock may or may not have been broken (dlock ls tells).

Exit status: 0 released (or, with --force, nothing held); 1 the owner given
does not hold KEY (its holders are named; nothing changes); 2 usage (an
ambiguous owner id prefix included); 3 the
lock service failed, did not answer within --timeout, or cannot break locks.

Examples:
  dlock unlock --force nightly-batch
  dlock unlock --owner 3f2a9c0d4e5b6a7f8091a2b3c4d5e6f7 reports/daily

Options:
`

// defaultUnlockTimeout is --timeout's default.
const defaultUnlockTimeout = 30 * time.Second

// maxUnlockTimeout is the longest --timeout: unlock is an operator's
// one-off command, and a bound of more than a day is a slip (a unit left
// out, a value meant for another option), not a wish.
const maxUnlockTimeout = 24 * time.Hour

// unlockJSON is unlock's --json output.
type unlockJSON struct {
	Key        string       `json:"key"`
	Released   []unlockedJS `json:"released"`
	Holders    []unlockedJS `json:"holders,omitempty"` // the real holders, when --owner does not hold KEY
	Nodes      []nodeJS     `json:"nodes,omitempty"`
	NodeErrors []string     `json:"node_errors,omitempty"`
}

type unlockedJS struct {
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	Mode     string            `json:"mode"`
	TTLms    int64             `json:"ttl_ms"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

type nodeJS struct {
	Node  string `json:"node"`
	Owner string `json:"owner"`
	Token uint64 `json:"token"`
}

func holdersJS(hs []dlock.Holder) []unlockedJS {
	out := []unlockedJS{}
	for _, h := range hs {
		out = append(out, unlockedJS{Owner: h.Owner, Token: h.Token, Mode: h.Mode.String(), TTLms: h.TTL.Milliseconds(), Metadata: h.Metadata})
	}
	return out
}

func cmdUnlock(args []string, stdout, stderr io.Writer) int {
	o := newOptions("unlock", unlockUsage)
	rawURL, owner, force, asJSON, verbose := new(string), new(string), new(bool), new(bool), new(bool)
	connect := new(time.Duration)
	*connect = defaultConnectTimeout
	urlSrc := defineURL(o, rawURL, urlHelp)
	o.String(owner, "", "owner", "ID", "release only the lease of this owner id: its 32 hex digits, or the first 8 or more of them if they name one holder of KEY")
	o.Bool(force, "", "force", "break the lock whoever holds it")
	o.Bool(asJSON, "", "json", "print JSON")
	o.Duration(connect, "", "connect-timeout", "DUR", "bound on connecting to and probing the lock service (default 5s)")
	timeout := new(time.Duration)
	*timeout = defaultUnlockTimeout
	o.Var(waitFlag{timeout, new(bool)}, "", "timeout", "DUR|SECS", "give up after this long: a duration (1m, 1.5s) or seconds (10); at most 24h (default 30s)")
	o.Bool(verbose, "", "verbose", "print the client libraries' logs on stderr")
	rest, code, ok := o.Parse(args, stdout, stderr)
	if !ok {
		return code
	}
	if err := urlSrc.check(); err != nil {
		return o.UsageError(stderr, "%v", err)
	}
	start := time.Now()
	switch {
	case len(rest) != 1:
		return o.UsageError(stderr, "one KEY expected, got %d arguments", len(rest))
	case *force == (*owner != ""):
		return o.UsageError(stderr, "give either --owner ID or --force")
	case *connect <= 0:
		return o.UsageError(stderr, "--connect-timeout must be positive, got %v", *connect)
	case *timeout <= 0:
		return o.UsageError(stderr, "--timeout must be positive, got %v", *timeout)
	case *timeout > maxUnlockTimeout:
		return o.UsageError(stderr, "--timeout %v is above the maximum, %v", *timeout, maxUnlockTimeout)
	}
	key := rest[0]
	if err := dlock.ValidateKey(key); err != nil {
		return o.UsageError(stderr, "%s", oneLine(err.Error()))
	}
	prefix := false
	switch n := len(*owner); {
	case n > 0 && n < minOwnerPrefix && isHex(*owner):
		return o.UsageError(stderr, "--owner: %q is too short: give at least %d hex digits of the owner id (dlock ls shows %d)", *owner, minOwnerPrefix, lsOwnerDigits)
	case n >= minOwnerPrefix && n < 32 && isHex(*owner):
		prefix = true
		*owner = strings.ToLower(*owner)
	default:
		if _, err := dlock.ValidateOwner(*owner); err != nil {
			return o.UsageError(stderr, "--owner: %s", oneLine(err.Error()))
		}
	}
	raw := *rawURL
	if raw == "" {
		raw = defaultURL()
	}
	stderr = &scrubWriter{w: stderr, secrets: secretsOf(raw)}
	// Connecting takes from the same budget: --timeout bounds the whole
	// command, whichever of the two bounds is shorter ends the connecting.
	connectWithin := min(*connect, *timeout)
	b, err := openBackend(raw, openOptions{connectTimeout: connectWithin, verbose: *verbose, logs: stderr})
	if err != nil {
		if from, to := "--connect-timeout "+timeout.String(), "--timeout "+timeout.String(); *timeout < *connect && strings.Contains(err.Error(), from) {
			// The probe's message names the bound it was given, which
			// was --timeout's; the error keeps its kind (exit status).
			err = &reworded{msg: strings.ReplaceAll(err.Error(), from, to), err: err}
		}
		return reportOpen(stderr, "unlock", err)
	}
	defer b.close()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(*timeout))
	defer cancel()
	var broken dlock.Broken
	if prefix {
		var matches []string
		matches, err = ownersByPrefix(ctx, b.locker, key, *owner)
		if len(matches) > 1 {
			fmt.Fprintf(stderr, "dlock unlock: --owner %s is ambiguous: it starts %d owner ids of %s: %s\n", *owner, len(matches), quoteField(key), strings.Join(matches, ", "))
			return exitUsage
		}
		if err == nil {
			*owner = matches[0]
		}
	}
	if err == nil {
		broken, err = dlock.Break(ctx, b.locker, key, *owner)
	}
	var nh *dlock.NotHolderError
	switch {
	case errors.Is(err, errNoLister):
		fmt.Fprintf(stderr, "dlock unlock: %s: %v\n", b.where, err)
		return exitUsage
	case errors.As(err, &nh):
		if *asJSON {
			printUnlockJSON(stdout, unlockJSON{Key: key, Released: []unlockedJS{}, Holders: holdersJS(nh.Holders)})
		}
		fmt.Fprintf(stderr, "dlock unlock: %s\n", oneLine(err.Error()))
		return exitConflict
	case errors.Is(err, dlock.ErrInvalidKey), errors.Is(err, dlock.ErrInvalidOption):
		fmt.Fprintf(stderr, "dlock unlock: %v\n", err)
		return exitUsage
	case err != nil && ctx.Err() != nil:
		// The request may have reached the service: say so.
		fmt.Fprintf(stderr, "dlock unlock: %s: no answer within --timeout %v (%s may or may not have been released; dlock ls tells): %s\n",
			b.where, *timeout, quoteField(key), oneLine(err.Error()))
		return exitBackend
	case err != nil:
		fmt.Fprintf(stderr, "dlock unlock: %s: %s\n", b.where, oneLine(err.Error()))
		return exitBackend
	}
	for _, ne := range broken.NodeErrors {
		fmt.Fprintf(stderr, "dlock unlock: warning: %s\n", oneLine(ne.Error()))
	}
	if *asJSON {
		out := unlockJSON{Key: key, Released: holdersJS(broken.Holders)}
		for _, n := range broken.Nodes {
			out.Nodes = append(out.Nodes, nodeJS{Node: n.Node, Owner: n.Holder.Owner, Token: n.Holder.Token})
		}
		for _, ne := range broken.NodeErrors {
			out.NodeErrors = append(out.NodeErrors, ne.Error())
		}
		return printUnlockJSON(stdout, out)
	}
	if len(broken.Holders) == 0 {
		fmt.Fprintf(stdout, "%s was not held\n", quoteField(key))
		return 0
	}
	for _, h := range broken.Holders {
		mode := ""
		if h.Mode != dlock.Exclusive {
			mode = " (" + h.Mode.String() + ")"
		}
		nodes := ""
		if n := nodesOf(broken.Nodes, h); n > 0 {
			nodes = fmt.Sprintf(" on %d node(s)", n)
		}
		fmt.Fprintf(stdout, "released %s%s held by owner %s (host=%s pid=%s) token %d%s\n", quoteField(key), mode,
			oneLine(h.Owner), dash(oneLine(h.Metadata[dlock.MetaHost])), dash(oneLine(h.Metadata[dlock.MetaPID])), h.Token, nodes)
	}
	return 0
}

// nodesOf counts the nodes h's lease was removed from.
func nodesOf(ns []dlock.BrokenOnNode, h dlock.Holder) int {
	n := 0
	for _, x := range ns {
		if x.Holder.Owner == h.Owner {
			n++
		}
	}
	return n
}

func printUnlockJSON(stdout io.Writer, v unlockJSON) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return exitBackend
	}
	if v.Holders != nil {
		return exitConflict
	}
	return 0
}

// reworded is err with another message.
type reworded struct {
	msg string
	err error
}

func (r *reworded) Error() string { return r.msg }
func (r *reworded) Unwrap() error { return r.err }

// minOwnerPrefix is the fewest hex digits --owner takes: 32 bits leave a
// clash between two holders of a key a one in four billion chance, and a
// clash is refused, never guessed.
const minOwnerPrefix = 8

// lsOwnerDigits is how many hex digits of an owner id dlock ls shows.
const lsOwnerDigits = 12

// errNoLister is a lock service that cannot list holders, asked to find an
// owner id by its prefix.
var errNoLister = errors.New("dlock: this lock service cannot list holders: give --owner all 32 hex digits")

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return s != ""
}

// ownersByPrefix lists the owner ids of key's holders that start with
// prefix (lower-case hex): one or more; none is a *dlock.NotHolderError
// naming the holders there are.
func ownersByPrefix(ctx context.Context, l dlock.Locker, key, prefix string) ([]string, error) {
	ls, ok := l.(dlock.Lister)
	if !ok {
		return nil, errNoLister
	}
	infos, err := ls.List(ctx, key)
	if errors.Is(err, dlock.ErrUnsupported) {
		return nil, errNoLister
	}
	if err != nil {
		return nil, err
	}
	var holders []dlock.Holder
	var matches []string
	for _, in := range infos {
		if in.Key != key {
			continue
		}
		holders = append(holders, in.Holders...)
		for _, h := range in.Holders {
			if o := strings.ToLower(h.Owner); strings.HasPrefix(o, prefix) && !slices.Contains(matches, o) {
				matches = append(matches, o)
			}
		}
	}
	if len(matches) == 0 {
		return nil, &dlock.NotHolderError{Key: key, Owner: prefix + "…", Holders: holders}
	}
	slices.Sort(matches)
	return matches, nil
}
