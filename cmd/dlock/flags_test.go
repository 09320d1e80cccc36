package main

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// testOptions is an optionSet like a command's, with its variables.
type testOptions struct {
	o        *optionSet
	verbose  bool
	shared   bool
	url      string
	ttl      time.Duration
	n        int
	wait     time.Duration
	waitSeen bool
}

func newTestOptions() *testOptions {
	t := &testOptions{ttl: 30 * time.Second}
	t.o = newOptions("test", "Usage: dlock test [OPTION]... ARG\n")
	t.o.Bool(&t.verbose, "", "verbose", "say more")
	t.o.Bool(&t.shared, "s", "shared", "share")
	t.o.String(&t.url, "", "url", "URL", "where")
	t.o.Duration(&t.ttl, "", "ttl", "DUR", "how long")
	t.o.Int(&t.n, "E", "exit-code", "N", "a number")
	t.o.Var(waitFlag{&t.wait, &t.waitSeen}, "w", "wait", "DUR|SECS", "wait")
	return t
}

// The forms GNU tools accept, Go's single-dash long names, and where the
// options end.
func TestOptionSetParses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args, operands []string
		check          func(*testOptions) bool
	}{
		{[]string{"-w", "5", "k"}, []string{"k"}, func(o *testOptions) bool { return o.wait == 5*time.Second && o.waitSeen }},
		{[]string{"-w5", "k"}, []string{"k"}, func(o *testOptions) bool { return o.wait == 5*time.Second }},
		{[]string{"-w=0.5", "k"}, []string{"k"}, func(o *testOptions) bool { return o.wait == 500*time.Millisecond }},
		{[]string{"--wait", "2m", "k"}, []string{"k"}, func(o *testOptions) bool { return o.wait == 2*time.Minute }},
		{[]string{"--wait=0", "k"}, []string{"k"}, func(o *testOptions) bool { return o.wait == 0 && o.waitSeen }},
		{[]string{"-sE", "7", "k"}, []string{"k"}, func(o *testOptions) bool { return o.shared && o.n == 7 }},
		{[]string{"-sE7", "k"}, []string{"k"}, func(o *testOptions) bool { return o.shared && o.n == 7 }},
		{[]string{"-ttl", "10s", "-verbose", "k"}, []string{"k"}, func(o *testOptions) bool { return o.ttl == 10*time.Second && o.verbose }},
		{[]string{"--verbose=false", "--shared=true", "k"}, []string{"k"}, func(o *testOptions) bool { return !o.verbose && o.shared }},
		{[]string{"--url", "--", "k"}, []string{"k"}, func(o *testOptions) bool { return o.url == "--" }},
		{[]string{"--", "-s", "k"}, []string{"-s", "k"}, func(o *testOptions) bool { return !o.shared }},
		{[]string{"k", "-s"}, []string{"k", "-s"}, func(o *testOptions) bool { return !o.shared }},
		{[]string{"-", "-s"}, []string{"-", "-s"}, func(o *testOptions) bool { return !o.shared }},
		{[]string{"-E", "-3"}, []string{}, func(o *testOptions) bool { return o.n == -3 }},
		{nil, []string{}, func(o *testOptions) bool { return o.ttl == 30*time.Second && !o.waitSeen }},
	}
	for _, c := range cases {
		o := newTestOptions()
		var stdout, stderr bytes.Buffer
		got, code, ok := o.o.Parse(c.args, &stdout, &stderr)
		if !ok || code != 0 || !slices.Equal(got, c.operands) && len(got)+len(c.operands) > 0 || !c.check(o) {
			t.Errorf("%q: operands %q, code %d, ok %v, stderr %q; options %+v", c.args, got, code, ok, stderr.String(), *o)
		}
	}
}

// A usage error is one line naming the problem and the pointer to --help;
// nothing on stdout.
func TestOptionSetUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--nosuch"}, "option --nosuch is not defined"},
		{[]string{"-x"}, "option -x is not defined"},
		{[]string{"-sx"}, `option -x is not defined (in "-sx"; long options start with --)`},
		{[]string{"-nosuch"}, `option -n is not defined (in "-nosuch"`},
		{[]string{"--ttl"}, "option --ttl needs a value (DUR)"},
		{[]string{"-w"}, "option -w needs a value (DUR|SECS)"},
		{[]string{"--ttl", "abc"}, `invalid value "abc" for --ttl: want a duration`},
		{[]string{"--ttl=", "k"}, `invalid value "" for --ttl`},
		{[]string{"-E", "x"}, `invalid value "x" for -E: want a whole number`},
		{[]string{"--verbose=maybe"}, `invalid boolean value "maybe" for --verbose`},
		{[]string{"-w", "-1"}, `invalid value "-1" for -w: must not be negative`},
		{[]string{"-w", "-0.5s"}, `invalid value "-0.5s" for -w: must not be negative`},
		{[]string{"--wait", "NaN"}, `invalid value "NaN" for --wait: want a duration`},
		{[]string{"--wait", "inf"}, `invalid value "inf" for --wait: want a duration`},
		{[]string{"-w", "1e30"}, `invalid value "1e30" for -w: too long`},
		{[]string{"-w", ""}, `invalid value "" for -w`},
		{[]string{"--\x1b[31m"}, `option --\x1b[31m is not defined`},
	}
	for _, c := range cases {
		o := newTestOptions()
		var stdout, stderr bytes.Buffer
		_, code, ok := o.o.Parse(c.args, &stdout, &stderr)
		want := "dlock test: " + c.want
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		if ok || code != exitUsage || stdout.Len() > 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], want) ||
			lines[1] != "Try 'dlock test --help' for more information." {
			t.Errorf("%q: ok %v, code %d, stdout %q, stderr %q; want exit 2 and %q", c.args, ok, code, stdout.String(), stderr.String(), want)
		}
		if strings.Contains(stderr.String(), "\x1b") {
			t.Errorf("%q: an escape sequence printed raw: %q", c.args, stderr.String())
		}
	}
}

// --help and -h print the whole help on stdout (exit 0), wherever they
// come among the options; the options are listed short and long together,
// aligned, wrapped to 79 columns.
func TestOptionSetHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"-h"}, {"-s", "--help", "k"}, {"-sh"}, {"-help"}} {
		o := newTestOptions()
		o.o.Trailer("\nExit status: ...\n")
		var stdout, stderr bytes.Buffer
		_, code, ok := o.o.Parse(args, &stdout, &stderr)
		if ok || code != 0 || stderr.Len() > 0 {
			t.Fatalf("%q: ok %v code %d stderr %q", args, ok, code, stderr.String())
		}
		help := stdout.String()
		for _, re := range []string{
			`(?m)^Usage: dlock test \[OPTION\]\.\.\. ARG$`,
			`(?m)^Options:$`,
			`(?m)^      --verbose +say more$`,
			`(?m)^  -s, --shared +share$`,
			`(?m)^      --url URL +where$`,
			`(?m)^  -E, --exit-code N +a number$`,
			`(?m)^  -w, --wait DUR\|SECS +wait$`,
			`(?m)^  -h, --help +print this help and exit$`,
			`(?s)Options:.*Exit status: \.\.\.\n$`,
		} {
			if !regexp.MustCompile(re).MatchString(help) {
				t.Errorf("%q: help does not match %s:\n%s", args, re, help)
			}
		}
		for _, l := range strings.Split(help, "\n") {
			if len(l) > helpWidth {
				t.Errorf("line longer than %d: %q", helpWidth, l)
			}
		}
	}
}

// usageLines asserts a usage error: exit 2, nothing on stdout, and on
// stderr exactly "dlock CMD: ...want..." and the pointer to --help.
func usageLines(t *testing.T, r result, cmd, want string, args []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if r.code != exitUsage || r.stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], "dlock "+cmd+": ") ||
		!strings.Contains(lines[0], want) || lines[1] != "Try 'dlock "+cmd+" --help' for more information." {
		t.Errorf("dlock %q: exit %d, stdout %q, stderr %q; want exit 2, a line with %q and the pointer to --help", args, r.code, r.stdout, r.stderr, want)
	}
}

// Guards against: a usage error found after parsing printed without the pointer to --help.
// Every command's usage errors are the two lines, for the checks made
// after parsing too (not only for unknown options).
func TestUsageErrors_TwoLinesForEveryCommand(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "a", "b"}, "at most one PREFIX"},
		{[]string{"ls", "--connect-timeout", "0"}, "--connect-timeout must be positive"},
		{[]string{"ls", "--connect-timeout", "-1s"}, "--connect-timeout must be positive"},
		{[]string{"ls", "--bogus"}, "option --bogus is not defined"},
		{[]string{"check", "extra"}, `no arguments expected, got "extra"`},
		{[]string{"check", "--connect-timeout", "0s"}, "--connect-timeout must be positive"},
		{[]string{"check", "--json=maybe"}, `invalid boolean value "maybe" for --json`},
		{[]string{"demo", "x"}, "unexpected argument"},
		{[]string{"demo", "--workers", "1"}, "--workers must be 2-64"},
		{[]string{"demo", "--workers", "65"}, "--workers must be 2-64"},
		{[]string{"demo", "--rounds", "0"}, "--rounds must be 1-1000"},
		{[]string{"demo", "--metrics"}, "option --metrics needs a value (ADDR)"},
		{[]string{"serve", "x"}, "unexpected argument"},
		{[]string{"serve", "--cert", "c.pem"}, "--cert without --key"},
		{[]string{"unlock"}, "one KEY expected"},
		{[]string{"unlock", "k"}, "either --owner ID or --force"},
		{[]string{"unlock", "--force", "--owner", "0123456789abcdef0123456789abcdef", "k"}, "either --owner ID or --force"},
		{[]string{"unlock", "--owner", "nothex", "k"}, "--owner"},
		{[]string{"unlock", "--force", ""}, "key"},
		{[]string{"unlock", "--force", "a", "b"}, "one KEY expected"},
		{[]string{"unlock", "--force", "--connect-timeout", "0s", "k"}, "--connect-timeout must be positive"},
	} {
		usageLines(t, runDlock(t, url, c.args...), c.args[0], c.want, c.args)
	}
}
