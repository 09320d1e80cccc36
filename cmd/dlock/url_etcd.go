package main

import (
	"net/url"
	"strings"
)

// parseEtcd checks etcd[s]://[user:pass@]h1:p1[,h2:p2][/prefix], and for
// etcds ?ca=FILE, ?cert=FILE&key=FILE.
func (t *target) parseEtcd(raw string, u *url.URL) error {
	if u.Host == "" {
		return badURL(raw, "no endpoints: %s://h1:p1[,h2:p2]", u.Scheme)
	}
	addrs, err := addrList(raw, u.Host, "endpoint")
	if err != nil {
		return err
	}
	known, err := tlsKnown(raw, u)
	if err != nil {
		return err
	}
	q, err := query(raw, u, known...)
	if err != nil {
		return err
	}
	if err := t.takeTLSParams(raw, u, q); err != nil {
		return err
	}
	prefix := strings.TrimPrefix(u.Path, "/")
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	t.Addrs, t.Prefix = addrs, prefix
	return nil
}
