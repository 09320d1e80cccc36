package main

import (
	"strings"
	"testing"
	"time"
)

// Red team, issue 16: ?acks= and ?ack_timeout= junk. Each URL is refused
// with a clear message naming the option (never a panic), and a password
// in the URL is never echoed; or, for the accepted ones, parses to the
// stated values.
func TestRedTeam16_AcksJunk(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw  string
		err  string // "" when accepted
		acks int
		at   time.Duration
	}{
		{raw: "redis://:s3cret@h:1?acks=1e3", err: "acks"},
		{raw: "redis://:s3cret@h:1?acks=-0", acks: 0},
		{raw: "redis://:s3cret@h:1?acks=01", acks: 1},
		{raw: "redis://:s3cret@h:1?acks=+1", err: "acks"}, // + is a space in a query
		{raw: "redis://:s3cret@h:1?acks=%201", err: "acks"},
		{raw: "redis://:s3cret@h:1?acks=0x1", err: "acks"},
		{raw: "redis://:s3cret@h:1?acks=1.0", err: "acks"},
		{raw: "redis://:s3cret@h:1?acks=99999999999999999999999", err: "acks"},
		{raw: "redis://:s3cret@h:1?acks", err: "acks"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=NaN", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=Inf", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=1h", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=0s", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=1", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=9223372036854775807ns", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=99999999999h", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=1ns", acks: 1, at: time.Nanosecond},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=1s&ack_timeout=1s", err: "ack_timeout"},
		{raw: "redis://:s3cret@h:1?acks=1&acks=1", err: "acks"},
		{raw: "redis://:s3cret@h:1?ACKS=1", err: "ACKS"},
		{raw: "redis://:s3cret@h:1?acks=1&read_timeout=-1", acks: 1},
		{raw: "redis://:s3cret@h:1?acks=1&ack_timeout=59s&read_timeout=-1", acks: 1, at: 59 * time.Second},
		{raw: "redis://:s3cret@h:1?acks=1&read_timeout=0", acks: 1},
		{raw: "redis://:s3cret@h:1?acks=1&read_timeout=500ms", err: "read timeout"},
		{raw: "redis+sentinel://:s3cret@a:1/m?acks=1e3", err: "acks"},
		{raw: "redis+sentinel://:s3cret@a:1/m?ack_timeout=1s", err: "acks"},
		{raw: "redis+cluster://:s3cret@a:1?acks=1", err: "acks"},
		{raw: "rediss+cluster://:s3cret@a:1?acks=1", err: "acks"},
		{raw: "redlock://:s3cret@a:1,b:2,c:3?acks=1", err: "acks"},
		{raw: "redlocks://:s3cret@a:1,b:2,c:3?acks=1", err: "acks"},
		{raw: "etcd://u:s3cret@a:1?acks=1", err: "acks"},
		{raw: "zk://u:s3cret@a:1?acks=1", err: "acks"},
		{raw: "postgres://u:s3cret@a:1/db?acks=1", err: "take no ?acks="},
		{raw: "postgresql://u:s3cret@a:1/db?ack_timeout=1s", err: "take no ?ack_timeout="},
		{raw: "file:///tmp/x?acks=1", err: "acks"},
		{raw: "mem://?acks=1", err: "acks"},
	} {
		tg, err := parseURL(c.raw)
		if c.err == "" {
			if err != nil {
				t.Errorf("parseURL(%q): %v, want it accepted", c.raw, err)
				continue
			}
			if tg.Acks != c.acks || tg.AckTimeout != c.at {
				t.Errorf("parseURL(%q): acks %d, ack_timeout %v; want %d, %v", c.raw, tg.Acks, tg.AckTimeout, c.acks, c.at)
			}
			continue
		}
		if err == nil {
			t.Errorf("parseURL(%q) accepted it (acks %d, ack_timeout %v), want an error naming %q", c.raw, tg.Acks, tg.AckTimeout, c.err)
			continue
		}
		if !strings.Contains(err.Error(), c.err) {
			t.Errorf("parseURL(%q): %v, want it to name %q", c.raw, err, c.err)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("parseURL(%q): %v echoes the password", c.raw, err)
		}
	}
}

// Through the binary: a junk or misplaced ?acks= is a usage error (exit
// 2) that names the option and never echoes the password; nothing is
// dialled (the addresses are dead).
func TestRedTeam16_AcksJunkExit2(t *testing.T) {
	t.Parallel()
	dead := deadAddr(t)
	for _, u := range []string{
		"redis://:s3cret@" + dead + "?acks=1e3",
		"redis://:s3cret@" + dead + "?acks=1&ack_timeout=NaN",
		"redis+sentinel://:s3cret@" + dead + "/m?acks=1&ack_timeout=3s",
		"redis+cluster://:s3cret@" + dead + "?acks=1",
		"redlock://:s3cret@" + dead + "," + dead + "," + dead + "?acks=1",
		"etcd://u:s3cret@" + dead + "?acks=1",
		"postgres://u:s3cret@" + dead + "/db?acks=1",
	} {
		r := runDlock(t, u, "run", "-n", "k", "--", "true")
		if r.code != 2 || !strings.Contains(r.stderr, "acks") {
			t.Errorf("dlock run with %s: exit %d, %q; want 2 and a message naming acks", u, r.code, r.stderr)
		}
		if strings.Contains(r.stderr+r.stdout, "s3cret") || strings.Contains(r.stderr, "panic") {
			t.Errorf("dlock run with %s: %q", u, r.stderr)
		}
	}
}
