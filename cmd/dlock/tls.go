package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"
)

// TLS schemes and their plaintext twins. A TLS scheme takes
// ?ca=FILE (PEM CA certificates that sign the servers' certificates;
// default the system's roots) and ?cert=FILE&key=FILE (a PEM client
// certificate and its private key, for servers that require one).
var tlsTwin = map[string]string{
	"rediss":          "redis",
	"rediss+cluster":  "redis+cluster",
	"rediss+sentinel": "redis+sentinel",
	"redlocks":        "redlock",
	"etcds":           "etcd",
}

// isTLSScheme reports whether scheme speaks TLS.
func isTLSScheme(scheme string) bool { _, ok := tlsTwin[scheme]; return ok }

// tlsSchemeOf is the TLS twin of a plaintext scheme, "" if it has none.
func tlsSchemeOf(scheme string) string {
	for s, plain := range tlsTwin {
		if plain == scheme {
			return s
		}
	}
	return ""
}

// tlsParams are the query parameters naming TLS files.
var tlsParams = []string{"ca", "cert", "key"}

// tlsKnown is the TLS parameters u's scheme takes, for query's list of
// known options. On a plaintext scheme, a TLS parameter is an error that
// names the TLS scheme to use.
func tlsKnown(raw string, u *url.URL) ([]string, error) {
	if isTLSScheme(u.Scheme) {
		return tlsParams, nil
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, badURL(raw, "query: %v", err)
	}
	for _, p := range tlsParams {
		if q.Has(p) {
			if s := tlsSchemeOf(u.Scheme); s != "" {
				return nil, badURL(raw, "?%s= needs %s:// (TLS)", p, s)
			}
		}
	}
	return nil, nil
}

// takeTLSParams moves ?ca=, ?cert= and ?key= from q into t, and checks
// them: only on a TLS scheme, once each, not empty, cert and key
// together. The files are read when the backend is opened (tlsConfig).
func (t *target) takeTLSParams(raw string, u *url.URL, q url.Values) error {
	for _, p := range tlsParams {
		if !q.Has(p) {
			continue
		}
		if !isTLSScheme(u.Scheme) {
			if s := tlsSchemeOf(u.Scheme); s != "" {
				return badURL(raw, "?%s= needs %s:// (TLS)", p, s)
			}
			return badURL(raw, "%s URLs take no ?%s= option", u.Scheme, p)
		}
		if len(q[p]) > 1 {
			return badURL(raw, "option ?%s= given %d times", p, len(q[p]))
		}
		if q.Get(p) == "" {
			return badURL(raw, "?%s= is empty: want a file name", p)
		}
		if strings.IndexByte(q.Get(p), 0) >= 0 {
			return badURL(raw, "?%s= contains a NUL byte", p)
		}
	}
	switch {
	case q.Has("cert") && !q.Has("key"):
		return badURL(raw, "?cert= without ?key=: a client certificate needs its private key (?cert=FILE&key=FILE)")
	case q.Has("key") && !q.Has("cert"):
		return badURL(raw, "?key= without ?cert=: a private key needs its client certificate (?cert=FILE&key=FILE)")
	}
	t.CA, t.Cert, t.Key = q.Get("ca"), q.Get("cert"), q.Get("key")
	for _, p := range tlsParams {
		q.Del(p)
	}
	return nil
}

// renderTLSParams adds t's TLS files to a query being rendered.
func (t *target) renderTLSParams(q url.Values) {
	if t.CA != "" {
		q.Set("ca", t.CA)
	}
	if t.Cert != "" {
		q.Set("cert", t.Cert)
	}
	if t.Key != "" {
		q.Set("key", t.Key)
	}
}

// fileError is a bad TLS file: a usage error (exit 2) naming the option,
// the file and why, never the file's contents.
func (t *target) fileError(format string, args ...any) error {
	msg := fmt.Sprintf("%v %q: %s", errBadURL, t.where, fmt.Sprintf(format, args...))
	return &urlError{scrub(msg, t.secrets)}
}

// tlsConfig is the client TLS configuration of a TLS scheme: the CA
// file's certificates as roots (else the system's), and the client
// certificate. The server name is left to each connection (the host it
// dials), so one configuration serves every node of a cluster. Bad files
// are URL errors (exit 2); their contents are never printed.
func (t *target) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, t.fileError("ca file: %v", pathError(err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, t.fileError("ca file %q holds no PEM certificate", t.CA)
		}
		cfg.RootCAs = pool
	}
	if t.Cert != "" || t.Key != "" {
		certPEM, err := os.ReadFile(t.Cert)
		if err != nil {
			return nil, t.fileError("cert file: %v", pathError(err))
		}
		keyPEM, err := os.ReadFile(t.Key)
		if err != nil {
			return nil, t.fileError("key file: %v", pathError(err))
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, t.fileError("cert file %q and key file %q: %s", t.Cert, t.Key, strings.TrimPrefix(err.Error(), "tls: "))
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// pathError is an error reading a file, as "open FILE: reason".
func pathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s %s: %w", pe.Op, pe.Path, pe.Err)
	}
	return err
}

// tlsAdvice explains a failed TLS connection: a server that wants a
// client certificate, or one that refused it, or a server certificate this
// client does not trust. "" when err is none of these.
func (t *target) tlsAdvice(err error) string {
	if !isTLSScheme(t.Scheme) || err == nil {
		return ""
	}
	s := err.Error()
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case strings.Contains(s, "certificate required"):
		if t.Cert == "" {
			return "the server requires a client certificate: add ?cert=FILE&key=FILE"
		}
		return "the server requires a client certificate and did not get one it accepts"
	case strings.Contains(s, "bad certificate") || strings.Contains(s, "unknown certificate authority") || strings.Contains(s, "unknown certificate"):
		if t.Cert == "" {
			return "the server refused the connection's certificate: it may require a client certificate (?cert=FILE&key=FILE)"
		}
		return fmt.Sprintf("the server refused the client certificate %s: is it signed by a CA the server trusts?", t.Cert)
	case errors.As(err, new(*afterHandshakeError)) && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)):
		// The server hung up once the handshake was done, before any
		// request: under load its "certificate required" alert can be
		// lost to the reset (TLS 1.3 checks client certificates after
		// the client's handshake completes).
		if t.Cert == "" {
			return "the server closed the connection right after the TLS handshake: it may require a client certificate (?cert=FILE&key=FILE)"
		}
		return fmt.Sprintf("the server closed the connection right after the TLS handshake: it may have refused the client certificate %s", t.Cert)
	case errors.As(err, &unknownCA) || strings.Contains(s, "certificate signed by unknown authority"):
		if t.CA == "" {
			return "the server's certificate is not signed by a CA this host trusts: add ?ca=FILE with the CA that signed it"
		}
		return fmt.Sprintf("the server's certificate is not signed by the CA in ?ca=%s", t.CA)
	case errors.As(err, &host) || strings.Contains(s, "certificate is valid for"):
		return "the server's certificate is not for the host name or address in the URL"
	}
	return ""
}

// addTLSFiles adds t's CA and client certificate to cfg (made by go-redis
// from a rediss:// URL: server name, skip_verify).
func (t *target) addTLSFiles(cfg *tls.Config) error {
	files, err := t.tlsConfig()
	if err != nil {
		return err
	}
	cfg.RootCAs, cfg.Certificates = files.RootCAs, files.Certificates
	return nil
}

// diagnoseTLS starts a TLS handshake with the first server, as the
// client would make it, by deadline (at most maxLook), for an explanation
// when the client's own error hides it (a client that retries until its
// deadline). It sends nothing after the handshake; a server that refuses
// the client's certificate says so in an alert, which TLS 1.3 delivers on
// the first read. The channel receives the handshake's or the read's
// error, nil if none came; a nil channel means there is nothing to check.
func (t *target) diagnoseTLS(deadline time.Time) <-chan error {
	if !t.TLS || len(t.Addrs) == 0 {
		return nil
	}
	if limit := time.Now().Add(maxLook); deadline.After(limit) {
		deadline = limit
	}
	cfg, err := t.tlsConfig()
	if err != nil { // opening checked the files already
		return nil
	}
	if v := t.Options.Get("skip_verify"); v == "true" || v == "1" {
		cfg.InsecureSkipVerify = true
	}
	addr := t.Addrs[0]
	c := make(chan error, 1)
	go func() {
		conn, err := tls.DialWithDialer(&net.Dialer{Deadline: deadline}, "tcp", addr, cfg)
		if err != nil {
			c <- err
			return
		}
		defer conn.Close()
		read := time.Now().Add(500 * time.Millisecond)
		if read.After(deadline) {
			read = deadline
		}
		_ = conn.SetReadDeadline(read)
		_, err = conn.Read(make([]byte, 1))
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			c <- &afterHandshakeError{err}
			return
		}
		c <- nil
	}()
	return c
}

// afterHandshakeError is diagnoseTLS's read error once the handshake had
// completed.
type afterHandshakeError struct{ err error }

func (e *afterHandshakeError) Error() string { return "after the TLS handshake: " + e.err.Error() }
func (e *afterHandshakeError) Unwrap() error { return e.err }
