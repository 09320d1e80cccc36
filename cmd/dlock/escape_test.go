package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

// Keys and metadata are anybody's text: a key or a holder's host with a
// newline or a terminal escape sequence must not forge lines or colours
// in ls's table or in run's "held by" message. JSON stays exact.
func TestControlCharactersEscaped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := "file://" + dir
	const key = "evil\x1b[31m\nFAKE\tline"
	const host = "web\x1b[2J\r\nFAKE holder"
	l, err := filelock.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	lk, err := l.Acquire(ctx, key, dlock.WithTTL(time.Minute), dlock.WithMetadata(dlock.MetaHost, host))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())

	clean := func(what, s string) {
		t.Helper()
		if strings.ContainsAny(s, "\x1b\r") || strings.Contains(s, "\nFAKE") {
			t.Errorf("%s printed control characters verbatim: %q", what, s)
		}
	}
	r := runDlock(t, url, "ls")
	clean("ls", r.stdout)
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, `"evil\x1b[31m\nFAKE\tline"`) {
		t.Errorf("ls: exit %d, want a header and one quoted key:\n%s", r.code, r.stdout)
	}
	r = runDlock(t, url, "run", "-n", key, "--", "true")
	clean("run's conflict message", r.stderr)
	if r.code != exitConflict || !strings.Contains(r.stderr, `web\x1b[2J\r\nFAKE holder`) {
		t.Errorf("run -n: exit %d, want the holder's host escaped: %q", r.code, r.stderr)
	}
	r = runDlock(t, url, "ls", "--json")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 || infos[0].Key != key || infos[0].Metadata[dlock.MetaHost] != host {
		t.Errorf("ls --json is not exact: %v %q", err, r.stdout)
	}
	// An ordinary key is printed as it is.
	background(t, url, "run", "reports/daily", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, url, "ls", "reports/"); !strings.Contains(r.stdout, "\nreports/daily ") {
		t.Errorf("ls quotes an ordinary key: %q", r.stdout)
	}
}

func TestQuoteField(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"reports/daily", "reports/daily"},
		{"ünïcode-κλειδί", "ünïcode-κλειδί"},
		{"with space", `"with space"`},
		{`say "hi"`, `"say \"hi\""`},
		{"a\nb", `"a\nb"`},
		{"\x1b[31mred", `"\x1b[31mred"`},
		{"bidi\u202eevil", `"bidi\u202eevil"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
	}
	for _, c := range cases {
		if got := quoteField(c.in); got != c.want {
			t.Errorf("quoteField(%q) = %s, want %s", c.in, got, c.want)
		}
	}
	if got := escapeControls("line one\n\x1b[2Jtwo\tthree\r\n\xff"); got != "line one\n\\x1b[2Jtwo\tthree\\r\n\\xff" {
		t.Errorf("escapeControls: %q", got)
	}
	if got := oneLine("a\nb\tc\x1b"); got != `a\nb\tc\x1b` {
		t.Errorf("oneLine: %q", got)
	}
}
