package main

import (
	"errors"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgTableRE is what pglock.WithTable accepts (pglock's identRE): a
// lower-case identifier, optionally schema-qualified, at most 48 bytes a
// part.
var pgTableRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}(\.[a-z_][a-z0-9_]{0,47})?$`)

// parsePostgres checks a libpq URL,
// postgres[ql]://[user[:pass]@][h1[:p1][,h2[:p2]]][/db][?param=...], with
// dlock's own options taken out of the query: ?table= (the lease table)
// and ?listen=off (no LISTEN/NOTIFY, waiters poll). The rest goes to
// pgxpool.ParseConfig as given (sslmode, connect_timeout, pool_max_conns,
// default_query_exec_mode, ...).
func (t *target) parsePostgres(raw string, u *url.URL) error {
	if u.Opaque != "" {
		return badURL(raw, "want %s://[user:pass@]host:port/db", u.Scheme)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return badURL(raw, "query: %v", err)
	}
	for _, k := range []string{"acks", "ack_timeout"} {
		// pgx would send them to the server as runtime parameters, which
		// it refuses only once connected: say so here, as other schemes do.
		if q.Has(k) {
			return badURL(raw, "%s URLs take no ?%s= option (replica acknowledgement is for redis[s]:// and redis[s]+sentinel://)", u.Scheme, k)
		}
	}
	for _, k := range []string{"table", "listen"} {
		if len(q[k]) > 1 {
			return badURL(raw, "option ?%s= given %d times", k, len(q[k]))
		}
	}
	if q.Has("table") {
		t.Table = q.Get("table")
		if !pgTableRE.MatchString(t.Table) {
			return badURL(raw, "?table=%q: want a lower-case identifier, optionally schema.table, at most 48 bytes a part", t.Table)
		}
	}
	if q.Has("listen") {
		switch l := q.Get("listen"); l {
		case "on":
		case "off":
			t.NoListen = true
		default:
			return badURL(raw, "?listen=%q: want on or off", l)
		}
	}
	q.Del("table")
	q.Del("listen")
	c := *u
	c.RawQuery, c.ForceQuery = q.Encode(), false
	t.Conn = c.String()
	if _, err := pgxpool.ParseConfig(t.Conn); err != nil {
		return badURL(raw, "%s", pgParseError(err))
	}
	return nil
}

// pgParseError is pgx's reason for refusing a connection string, without
// the string itself.
func pgParseError(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		msg = msg[i+3:]
	}
	return msg
}
