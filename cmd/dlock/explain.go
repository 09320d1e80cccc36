package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// explain turns a failed probe into the message the user sees: where,
// what failed, for a TLS mismatch (found by lookForMismatch) which
// scheme to use instead, and for a failed TLS handshake (in err, or in
// tlsErr found by diagnoseTLS when err hides it) what to change.
func (t *target) explain(err error, mismatch bool, tlsErr error) error {
	what := "not reachable"
	var rerr redis.Error
	var pgErr *pgconn.PgError
	etcdAuth := errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrPermissionDenied)
	if errors.As(err, &rerr) || errors.Is(err, zk.ErrNoAuth) || errors.Is(err, zk.ErrAuthFailed) || errors.As(err, &pgErr) || errors.Is(err, errPgReadOnly) || etcdAuth {
		what = "refused"
	}
	text := err.Error()
	if isSentinelScheme(t.Scheme) {
		text = joinLines(text) // go-redis lists each Sentinel's answer on a line
		// go-redis asks each Sentinel for the master's address and, when
		// none gives one, says they are all unreachable, whatever they
		// answered: name who refused.
		fromSentinels := strings.Contains(text, sentinelsFailed)
		switch {
		case errors.Is(err, redis.Nil):
			// A Sentinel that monitors no master of that name answers nil.
			what, text = "unknown master", fmt.Sprintf("no Sentinel that answered knows a master named %q", t.Master)
		case rerr != nil && fromSentinels:
			what = "refused by the Sentinels"
			text = strings.TrimSpace(text[strings.Index(text, sentinelsFailed)+len(sentinelsFailed):])
			if isAuthError(text) {
				text += " (the Sentinels' password is the URL's sentinel_password)"
			}
		case rerr != nil:
			what = "refused by the master"
		}
	}
	msg := fmt.Sprintf("%s: %s: %s", t.where, what, text)
	switch t.Scheme {
	case "etcd", "etcds":
		msg = "etcd " + msg
	case "zk":
		msg = "zookeeper " + msg
	case "postgres", "postgresql":
		msg = "postgres " + msg
	}
	hint := ""
	if rerr == nil && mismatch {
		hint = t.tlsHint(err)
	}
	if hint == "" && rerr == nil {
		hint = t.tlsAdvice(err)
	}
	if hint == "" && tlsErr != nil {
		if hint = t.tlsAdvice(tlsErr); hint != "" {
			hint = fmt.Sprintf("TLS with %s: %v\n  %s", t.Addrs[0], tlsErr, hint)
		}
	}
	if hint == "" && errors.Is(err, rpctypes.ErrUserEmpty) {
		hint = fmt.Sprintf("the server requires authentication: %s://user:password@host:port", t.Scheme)
	}
	if hint != "" {
		msg += "\n  " + hint
	}
	return errors.New(scrub(msg, t.secrets))
}

// joinLines joins the lines of an error message (errors.Join's, go-redis's
// list of its Sentinels' answers) into one, without repeating a line.
func joinLines(s string) string {
	if !strings.Contains(s, "\n") {
		return s
	}
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || slices.ContainsFunc(lines, func(k string) bool { return strings.HasSuffix(k, l) }) {
			continue // said already (go-redis ends its first line with the first answer)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "; ")
}

// sentinelsFailed starts go-redis's error when no Sentinel gave the
// master's address.
const sentinelsFailed = "all sentinels specified in configuration are unreachable:"

// isAuthError says whether a Redis error reply is about credentials.
func isAuthError(s string) bool {
	return strings.Contains(s, "WRONGPASS") || strings.Contains(s, "NOAUTH") || strings.Contains(s, "NOPERM")
}

func isSentinelScheme(scheme string) bool {
	return scheme == "redis+sentinel" || scheme == "rediss+sentinel"
}
