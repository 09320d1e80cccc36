package main

import (
	"net/url"
	"slices"
	"strings"
)

// redactedMark replaces secrets in printed URLs and messages.
const redactedMark = "xxxxx"

// plainParams are the query parameters whose values are printed as
// written: dlock's own, go-redis's and libpq's (pgx's) options that hold no
// secret. Any other parameter's value, a misspelt ?pasword= or ?pw= among
// them, is redacted like a password.
var plainParams = map[string]bool{
	// dlock
	"ca": true, "cert": true, "key": true, "acks": true, "ack_timeout": true, "unsafe_eviction": true,
	"lock_protocol": true, "sentinel_username": true, "session_timeout": true, "table": true, "listen": true,
	// go-redis
	"db": true, "addr": true, "client_name": true, "protocol": true, "dial_timeout": true,
	"read_timeout": true, "write_timeout": true, "pool_fifo": true, "pool_size": true,
	"pool_timeout": true, "min_idle_conns": true, "max_idle_conns": true,
	"max_active_conns": true, "conn_max_idle_time": true, "conn_max_lifetime": true,
	"idle_timeout": true, "max_retries": true, "min_retry_backoff": true,
	"max_retry_backoff": true, "context_timeout_enabled": true, "skip_verify": true,
	"max_redirects": true, "read_only": true, "route_by_latency": true,
	"route_randomly": true, "unstable_resp3": true, "identity_suffix": true,
	"disable_identity": true, "read_buffer_size": true, "write_buffer_size": true,
	// libpq and pgx
	"host": true, "hostaddr": true, "port": true, "dbname": true, "user": true,
	"sslmode": true, "sslrootcert": true, "sslcert": true, "sslsni": true,
	"sslnegotiation": true, "connect_timeout": true, "application_name": true,
	"fallback_application_name": true, "target_session_attrs": true, "search_path": true,
	"options": true, "default_query_exec_mode": true, "statement_cache_capacity": true,
	"description_cache_capacity": true, "min_read_buffer_size": true,
	"pool_max_conns": true, "pool_min_conns": true, "pool_min_idle_conns": true,
	"pool_max_conn_lifetime": true, "pool_max_conn_idle_time": true,
	"pool_health_check_period": true, "pool_max_conn_lifetime_jitter": true,
	"timezone": true, "client_encoding": true, "datestyle": true,
}

// plainRuntimeParams are PostgreSQL settings a postgres:// URL commonly
// passes to the server (pgx sends unknown parameters as run-time
// settings); with every name ending in "_timeout" they are plain.
var plainRuntimeParams = map[string]bool{
	"keepalives": true, "keepalives_idle": true, "keepalives_interval": true,
	"keepalives_count": true, "work_mem": true, "maintenance_work_mem": true,
	"default_transaction_isolation": true, "default_transaction_read_only": true,
	"jit": true, "lc_messages": true, "role": true, "intervalstyle": true,
}

// isSecretParam reports whether a query parameter's value is to be kept
// secret: that of any parameter but the known plain ones (?key= names a
// private key's file, which is not secret; its contents are, and are never
// printed). A name that looks like a credential's is secret whatever its
// ending.
func isSecretParam(name string) bool {
	if plainParams[name] {
		return false
	}
	n := strings.ToLower(name)
	for _, w := range []string{"pass", "pw", "secret", "token", "auth", "cred"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return !plainRuntimeParams[n] && !strings.HasSuffix(n, "_timeout")
}

// redact returns raw with every secret replaced by xxxxx: the password of
// the userinfo and the value of every query parameter but the known plain
// ones (plainParams). Unparsable URLs are redacted best effort:
// everything between "://" and the last "@" goes.
func redact(raw string) string {
	u, err := parseHostList(raw)
	if err != nil || strayAt(raw, u) {
		return redactRaw(raw)
	}
	if u.Opaque != "" && strings.Contains(u.Opaque, "@") {
		u.Opaque = redactedMark + u.Opaque[strings.LastIndexByte(u.Opaque, '@'):]
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redactedMark)
		}
	}
	u.RawQuery = redactQuery(u.RawQuery)
	return u.String()
}

// strayAt reports an "@" that is not the end of a userinfo: a password with
// an unescaped "/", "?" or "#" parses as host, path or query, and must not
// be printed as such.
func strayAt(raw string, u *url.URL) bool {
	if u.Scheme == "file" || u.User != nil {
		return false
	}
	_, rest, ok := strings.Cut(raw, ":")
	return ok && strings.Contains(rest, "@")
}

// redactQuery blanks secret parameters in a raw query, keeping the rest as
// written.
func redactQuery(q string) string {
	if q == "" {
		return q
	}
	parts := strings.FieldsFunc(q, func(r rune) bool { return r == '&' || r == ';' })
	for i, p := range parts {
		name, _, hasValue := strings.Cut(p, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if hasValue && isSecretParam(name) {
			parts[i] = p[:strings.IndexByte(p, '=')+1] + redactedMark
		}
	}
	return strings.Join(parts, "&")
}

// redactRaw redacts a URL that does not parse.
func redactRaw(raw string) string {
	s := raw
	if i := strings.Index(s, "://"); i >= 0 {
		if at := strings.LastIndexByte(s, '@'); at > i+3 {
			s = s[:i+3] + redactedMark + s[at:]
		}
	} else if at := strings.LastIndexByte(s, '@'); at >= 0 {
		if c := strings.IndexByte(s, ':'); c >= 0 && c < at {
			s = s[:c+1] + redactedMark + s[at:]
		}
	}
	if q := strings.IndexByte(s, '?'); q >= 0 {
		rest := s[q+1:]
		frag := ""
		if h := strings.IndexByte(rest, '#'); h >= 0 {
			rest, frag = rest[:h], rest[h:]
		}
		s = s[:q+1] + redactQuery(rest) + frag
	}
	return s
}

// secretsOf finds the secrets in raw, in decoded and in raw form, with the
// same rules as redact (plus the best-effort ones, whether or not raw
// parses).
func secretsOf(raw string) []string {
	var out []string
	add := func(s string) {
		out = append(out, s)
		if d, err := url.PathUnescape(s); err == nil {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(s); err == nil {
			out = append(out, d)
		}
	}
	if u, err := url.Parse(raw); err == nil {
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				out = append(out, p)
			}
		}
		if u.Opaque != "" {
			if at := strings.LastIndexByte(u.Opaque, '@'); at >= 0 {
				add(u.Opaque[:at])
			}
		}
	}
	// Best effort: the text between the scheme and the last "@", and the
	// part of it after the first ":" (the password when it parses).
	if _, rest, ok := strings.Cut(raw, ":"); ok {
		rest = strings.TrimPrefix(rest, "//")
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			ui := rest[:at]
			add(ui)
			if _, pw, ok := strings.Cut(ui, ":"); ok {
				add(pw)
			}
		}
	}
	if _, q, ok := strings.Cut(raw, "?"); ok {
		q, _, _ = strings.Cut(q, "#")
		for _, p := range strings.FieldsFunc(q, func(r rune) bool { return r == '&' || r == ';' }) {
			name, v, ok := strings.Cut(p, "=")
			if n, err := url.QueryUnescape(name); err == nil {
				name = n
			}
			if ok && isSecretParam(name) {
				add(v)
			}
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	// Longest first, so that a secret containing another is scrubbed whole.
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// minScrub is the shortest secret scrubbed from free text: shorter ones
// would mangle every message (a password "1" is in "127.0.0.1") and are
// redacted from URLs structurally only.
const minScrub = 3

// scrub replaces every secret in s with xxxxx.
func scrub(s string, secrets []string) string {
	for range len(s) + 1 { // each pass removes at least one non-'x' byte
		changed := false
		for _, sec := range secrets {
			if len(sec) < minScrub || strings.Trim(sec, "x") == "" {
				continue
			}
			if strings.Contains(s, sec) {
				s = strings.ReplaceAll(s, sec, redactedMark)
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	return s
}

// hasSecret reports whether the URL raw holds a secret: a password (or
// what may be one, text before an "@"), or an option's value that is not
// known to be plain.
func hasSecret(raw string) bool {
	return len(secretsOf(raw)) > 0
}
