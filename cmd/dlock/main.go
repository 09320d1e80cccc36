// Command dlock runs commands under a distributed lock (exclusive, a
// shared read lock with --shared, or one of N permits with --limit N),
// lists held locks with their modes and holders, and plays the fencing
// demo. See `dlock help`.
package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Exit statuses of dlock itself (the child's status is passed through).
const (
	exitConflict   = 1   // lock held by someone else (-n, or --wait elapsed); -E changes it
	exitUsage      = 2   // bad flags, arguments or URL
	exitBackend    = 3   // backend unreachable, authentication failed, ...
	exitLost       = 4   // the lock was lost while the command ran
	exitMaxHold    = 5   // dlock hold: --max-hold reached, the lock released
	exitCannotExec = 126 // CMD found but not executable (permission, directory, format)
	exitNoExec     = 127 // CMD not found
)

const usage = `dlock — distributed locks with fencing tokens

Usage:
  dlock run    [--url URL|--url-file PATH] [--ttl 30s] [-s|--shared | --limit N]
               [-w DUR|SECS] [-n] [-E N] [--grace 5s] [--max-hold DUR]
               [--metrics-file PATH] [--metrics ADDR] [--connect-timeout 5s]
               [--verbose] KEY -- CMD [ARGS...]
  dlock run    [OPTION]... KEY -c CMDLINE   (CMDLINE run by /bin/sh -c)
  dlock hold   [OPTION]... KEY              (prints TOKEN OWNER, holds KEY
                                             until SIGINT, SIGTERM or SIGHUP)
  dlock ls     [--url URL|--url-file PATH] [--json] [--nodes]
               [--watch [DUR] [--count N]] [--connect-timeout 5s] [--verbose]
               [PREFIX]
  dlock check  [--url URL|--url-file PATH] [--connect-timeout 5s] [--read-only]
               [--json] [--strict]
  dlock unlock [--url URL|--url-file PATH] (--owner ID | --force) [--json]
               [--connect-timeout 5s] [--timeout 30s] [--verbose] KEY
  dlock demo   [--url URL|--url-file PATH] [--workers 10] [--rounds 20]
               [--metrics ADDR]
  dlock serve  [--data-dir DIR] [--listen 127.0.0.1:2379] [--peer-listen ADDR]
               [--cert FILE --key FILE [--ca FILE]]
               [--auth [--root-password-file FILE]] [--insecure-listen]
  dlock version
  dlock help [COMMAND]

A run holds KEY exclusively; with --shared it is a read lock held together
with other --shared runs (waiting writers go first), with --limit N one of
N permits (a semaphore). -w takes a duration (2m) or seconds like flock's
(5, 0.5; 0: one attempt, as -n); --verbose says who holds KEY while dlock
waits. Run 'dlock COMMAND --help' for details.

URL (from --url or --url-file, else $DLOCK_URL, else a file backend in your
state directory):
  file:///path/to/dir                  leases in files on this host (default)
  redis://[user:pass@]host:port[/db]   one Redis (rediss:// for TLS)
  redis+cluster://[user:pass@]h1:p1[,h2:p2]
                                       a Redis Cluster, from any of its nodes
                                       (rediss+cluster:// for TLS)
  redis+sentinel://[user:pass@]h1:p1,h2:p2/master[/db]
                                       Redis Sentinel (rediss+sentinel:// for
                                       TLS to the Sentinels and the master)
  redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db]
                                       Redlock over independent masters
                                       (redlocks:// for TLS to every node)
  etcd://[user:pass@]h1:p1[,h2:p2][/prefix]
                                       etcd (etcds:// for TLS)
  zk://[user:pass@]h1:p1[,h2:p2][/path][?session_timeout=10s]
                                       ZooKeeper (port 2181 if none): locks
                                       under /path (default /dlock); user:pass
                                       is digest auth and the znodes' ACL; a
                                       lease is 2/3 of the session timeout
                                       (default 10s), --ttl does not apply
  postgres://[user:pass@]host:port/db[?sslmode=...&table=T&listen=off]
                                       PostgreSQL (postgresql:// too; libpq
                                       URL, pgx options); leases in table T
                                       (default dlock_leases, created on first
                                       lock); listen=off polls instead of
                                       LISTEN/NOTIFY (PgBouncer)
TLS schemes take ?ca=FILE (CA certificates, PEM; default the system's) and
?cert=FILE&key=FILE (a client certificate and its key, PEM, for servers that
require one). Percent-encode reserved characters (/ ? # @ %) in passwords.
Secrets are never printed.
redis://, rediss:// and redis[s]+sentinel:// take ?acks=N[&ack_timeout=500ms]:
each acquisition and renewal counts only once N replicas acknowledged it
(WAIT); an unacknowledged attempt fails (exit 3) and leaves no lease.
redis[s]://, redis[s]+cluster:// and redis[s]+sentinel:// take
?lock_protocol=auto|scripts|tair: Lua scripts, or the Lua-free protocol on
Tair's CAS and CAD (exclusive locks only); auto, the default, takes scripts
until the server refuses the user's scripts and offers CAS and CAD.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "Usage: dlock COMMAND [OPTION]... [ARG]...\n"+tryHelp)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "hold":
		return cmdHold(args[1:], stdout, stderr)
	case "ls":
		return cmdLs(args[1:], stdout, stderr)
	case "check":
		return cmdCheck(args[1:], stdout, stderr)
	case "unlock":
		return cmdUnlock(args[1:], stdout, stderr)
	case "demo":
		return cmdDemo(args[1:], stdout, stderr)
	case "serve":
		return cmdServe(args[1:], stdout, stderr)
	case demoWorkerCmd:
		return cmdDemoWorker(args[1:], stdout, stderr)
	case superviseCmd:
		return cmdSupervise(args[1:], stderr)
	case "version", "--version", "-version":
		return cmdVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help", "-help":
		if len(args) > 1 && args[0] == "help" && args[1] != "help" && !strings.HasPrefix(args[1], "-") {
			// dlock help COMMAND: that command's help.
			return run([]string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		hint := ""
		if c := closestCommand(args[0]); c != "" {
			hint = " (did you mean " + c + "?)"
		}
		fmt.Fprintf(stderr, "dlock: unknown command %s%s\n%s", strconv.Quote(args[0]), hint, tryHelp)
		return exitUsage
	}
}

// commands are the subcommands a user types, for suggestions.
var commands = []string{"run", "hold", "ls", "check", "unlock", "demo", "serve", "version", "help"}

// closestCommand is the command within two edits (insertions, deletions,
// substitutions, or one swap of neighbours) of s, "" if none or several
// are equally close.
func closestCommand(s string) string {
	if len(s) > 32 {
		return ""
	}
	best, bestD, tie := "", 3, false
	for _, c := range commands {
		d := editDistance(strings.ToLower(s), c)
		switch {
		case d < bestD:
			best, bestD, tie = c, d, false
		case d == bestD:
			tie = true
		}
	}
	// A two-letter command is two edits from anything of length <= 2.
	if tie || best == "" || bestD >= len(best) {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b
// (Levenshtein plus transpositions of adjacent bytes).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// tryHelp ends a usage error of dlock itself.
const tryHelp = "Try 'dlock --help' for more information.\n"
