package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// maxLook bounds a look for a TLS mismatch (and the deadline it is given).
const maxLook = 2 * time.Second

// lookForMismatch starts looking, by deadline, whether the server speaks
// the protocol the URL's scheme does not: plaintext Redis for the Redis
// TLS schemes (rediss://, rediss+cluster://, ...), TLS for their plaintext
// twins and etcd://, and for etcds:// not speaking TLS. It sends no
// credentials. The channel receives whether the other protocol was found;
// nil means there is nothing to look for.
func (t *target) lookForMismatch(deadline time.Time) <-chan bool {
	if limit := time.Now().Add(maxLook); deadline.After(limit) {
		deadline = limit
	}
	if !time.Now().Before(deadline) || len(t.Addrs) == 0 { // postgres: pgx's sslmode handles TLS
		return nil
	}
	addr := t.Addrs[0]
	var look func() bool
	switch {
	case t.Scheme == "etcds":
		look = func() bool { return !speaksTLS(addr, deadline) }
	case isTLSScheme(t.Scheme): // Redis over TLS
		look = func() bool { return speaksPlainRedis(addr, deadline) }
	case tlsSchemeOf(t.Scheme) != "": // redis, etcd, ... in plaintext
		look = func() bool { return speaksTLS(addr, deadline) }
	default:
		return nil
	}
	c := make(chan bool, 1)
	go func() { c <- look() }()
	return c
}

// tlsHint is the advice for a mismatch that lookForMismatch found after
// the probe failed with err; "" when there is none to give.
func (t *target) tlsHint(err error) string {
	addr := t.Addrs[0]
	switch {
	case t.Scheme == "etcds":
		if errorMentionsTLS(err) {
			return fmt.Sprintf("TLS handshake with %s failed: the server does not speak TLS; use etcd:// instead of etcds://", addr)
		}
	case isTLSScheme(t.Scheme):
		return fmt.Sprintf("TLS handshake with %s failed: the server answers plaintext Redis; use %s:// instead of %s://", addr, tlsTwin[t.Scheme], t.Scheme)
	case tlsSchemeOf(t.Scheme) != "":
		return fmt.Sprintf("the server at %s speaks TLS; use %s:// instead of %s://", addr, tlsSchemeOf(t.Scheme), t.Scheme)
	}
	return ""
}

func errorMentionsTLS(err error) bool {
	s := err.Error()
	return strings.Contains(s, "tls") || strings.Contains(s, "TLS") || strings.Contains(s, "handshake")
}

// speaksPlainRedis reports whether addr answers an inline PING in RESP
// by deadline.
func speaksPlainRedis(addr string, deadline time.Time) bool {
	c, err := (&net.Dialer{Deadline: deadline}).Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && len(line) > 0 && (line[0] == '+' || line[0] == '-')
}

// speaksTLS reports whether addr completes a TLS handshake by deadline.
// The server's certificate is not checked: nothing is sent over the
// connection, it only tells which protocol the port speaks.
func speaksTLS(addr string, deadline time.Time) bool {
	dialer := &net.Dialer{Deadline: deadline}
	c, err := tls.DialWithDialer(dialer, "tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // protocol detection only
	if err != nil {
		var alert tls.AlertError
		return errors.As(err, &alert) // the server answered in TLS, e.g. asking for a client certificate
	}
	c.Close()
	return true
}
