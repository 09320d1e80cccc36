package main

import (
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zklock"
)

// ZooKeeper defaults: the client port, and the session timeout asked for
// when the URL gives none (the servers grant 2 to 20 ticks by default,
// 4s to 40s with the usual tickTime of 2s).
const (
	defaultZKPort         = "2181"
	defaultSessionTimeout = 10 * time.Second
)

// parseZK checks zk://[user:pass@]h1:p1[,h2:p2][/path][?session_timeout=D].
// A server without a port gets 2181. The path is the znode the locks live
// under (default zklock.DefaultPrefix). user:pass is ZooKeeper digest
// auth, and the ACL of every znode dlock creates: both or neither.
func (t *target) parseZK(raw string, u *url.URL) error {
	if u.Opaque != "" || u.Host == "" {
		return badURL(raw, "no servers: zk://[user:pass@]h1:p1[,h2:p2][/path]")
	}
	hosts := strings.Split(u.Host, ",")
	for i, h := range hosts {
		if h != "" && (!strings.Contains(h, ":") || strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]")) {
			hosts[i] = h + ":" + defaultZKPort
		}
	}
	addrs, err := addrList(raw, strings.Join(hosts, ","), "server")
	if err != nil {
		return err
	}
	if u.User != nil {
		pw, hasPw := u.User.Password()
		switch user := u.User.Username(); {
		case user == "":
			return badURL(raw, "digest auth needs a user name: zk://user:password@host:port")
		case strings.Contains(user, ":"):
			return badURL(raw, "the digest user name contains \":\"")
		case !hasPw || pw == "":
			return badURL(raw, "a user name without a password: ZooKeeper digest auth needs zk://user:password@host:port")
		}
	}
	chroot := u.Path
	if chroot == "/" {
		chroot = ""
	}
	if chroot != "" {
		if why := badZNodePath(chroot); why != "" {
			return badURL(raw, "path %q: %s", chroot, why)
		}
	}
	q, err := query(raw, u, "session_timeout")
	if err != nil {
		return err
	}
	var session time.Duration
	if q.Has("session_timeout") {
		s := q.Get("session_timeout")
		d, err := time.ParseDuration(s)
		if err != nil {
			return badURL(raw, "?session_timeout=%q is not a duration (10s, 1m)", s)
		}
		if d < zklock.MinSessionTimeout || d > dlock.MaxTTL {
			return badURL(raw, "?session_timeout=%s is out of range [%v, %v]", d, zklock.MinSessionTimeout, dlock.MaxTTL)
		}
		session = d
	}
	t.Addrs, t.Chroot, t.SessionTimeout = addrs, chroot, session
	return nil
}

// badZNodePath says why p is not an absolute ZooKeeper path that dlock
// can put locks under ("" if it is): the rules of ZooKeeper's
// PathUtils.validatePath, and "/zookeeper", which the server reserves.
func badZNodePath(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return "not an absolute znode path"
	case strings.HasSuffix(p, "/"):
		return "a znode path does not end with \"/\""
	}
	for _, seg := range strings.Split(p[1:], "/") {
		switch seg {
		case "":
			return "empty znode name (\"//\")"
		case ".", "..":
			return fmt.Sprintf("%q is not a znode name (ZooKeeper paths are never relative)", seg)
		}
		for i := 0; i < len(seg); {
			r, w := utf8.DecodeRuneInString(seg[i:])
			switch {
			case r == utf8.RuneError && w <= 1:
				return "not valid UTF-8"
			case r < 0x20 || r >= 0x7F && r <= 0x9F || r >= 0xD800 && r <= 0xF8FF || r >= 0xFFF0:
				return fmt.Sprintf("ZooKeeper does not accept the character %U in a znode name", r)
			}
			i += w
		}
	}
	if p == "/zookeeper" || strings.HasPrefix(p, "/zookeeper/") {
		return "/zookeeper is reserved by ZooKeeper"
	}
	return ""
}
