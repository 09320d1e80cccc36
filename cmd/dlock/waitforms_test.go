package main

import (
	"fmt"
	"strings"
	"testing"
)

// -w takes flock's bare seconds (5, 0.5) as well as durations, in every
// spelling of the option; 0 in any form is one attempt.
func TestWaitForms(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	// A free key: every form runs CMD.
	for _, w := range [][]string{
		{"-w", "5"}, {"-w", "0.5"}, {"-w5"}, {"-w=0.5"}, {"--wait", "30"}, {"--wait=1.5"}, {"--wait", "2m"},
		{"-w", "1e-12"}, {"-w", "0"}, {"--wait=0"}, {"-w", "0s"},
	} {
		args := append(append([]string{"run"}, w...), "free", "--", "echo", "ran")
		if r := runDlock(t, url, args...); r.code != 0 || r.stdout != "ran\n" {
			t.Errorf("%q on a free key: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	// A held key: bare seconds are a wait that gives up (exit 1, saying
	// how long it waited); 0 is one attempt, which does not wait.
	holder, _, _ := background(t, url, "run", "busy", "--", "sh", "-c", "echo started; exec sleep 60")
	for _, c := range []struct {
		w      []string
		waited string // "" for one attempt
	}{
		{[]string{"-w", "0.3"}, "300ms"},
		{[]string{"-w0.3"}, "300ms"},
		{[]string{"--wait=0.25"}, "250ms"},
		{[]string{"-w", "0"}, ""},
		{[]string{"--wait", "0.0"}, ""},
	} {
		args := append(append([]string{"run"}, c.w...), "busy", "--", "echo", "should not run")
		r := runDlock(t, url, args...)
		if r.code != exitConflict || r.stdout != "" || !strings.Contains(r.stderr, fmt.Sprintf("pid=%d", holder.Process.Pid)) {
			t.Errorf("%q on a held key: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
		gaveUp := strings.Contains(r.stderr, "gave up after waiting "+c.waited+")")
		if c.waited != "" && !gaveUp || c.waited == "" && strings.Contains(r.stderr, "gave up") {
			t.Errorf("%q: stderr %q; want the wait (%q) said", args, r.stderr, c.waited)
		}
	}
}

// A bad -w is a usage error, one line and the pointer to --help (exit 2),
// in whatever form: negative, not a number, infinite, too long, empty.
func TestWaitBadForms(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-w", "-1"}, `invalid value "-1" for -w: must not be negative`},
		{[]string{"-w", "-0.5"}, `invalid value "-0.5" for -w: must not be negative`},
		{[]string{"--wait", "-2s"}, `invalid value "-2s" for --wait: must not be negative`},
		{[]string{"-w", "NaN"}, `invalid value "NaN" for -w: want a duration (2m, 1.5s) or a number of seconds (5, 0.5)`},
		{[]string{"-w", "nan"}, `invalid value "nan" for -w: want a duration`},
		{[]string{"-w", "Inf"}, `invalid value "Inf" for -w: want a duration`},
		{[]string{"-w", "-inf"}, `invalid value "-inf" for -w: want a duration`},
		{[]string{"-w", "1e30"}, `invalid value "1e30" for -w: too long: at most 9223372036 seconds`},
		{[]string{"--wait=1e30"}, `invalid value "1e30" for --wait: too long`},
		{[]string{"-w", "9999999999h"}, `invalid value "9999999999h" for -w`},
		{[]string{"-w", ""}, `invalid value "" for -w`},
		{[]string{"-w", "5 s"}, `invalid value "5 s" for -w`},
		{[]string{"-w", "0x10"}, `invalid value "0x10" for -w`},
		{[]string{"-w"}, "option -w needs a value (DUR|SECS)"},
	} {
		args := append(append([]string{"run"}, c.args...), "k", "--", "echo", "ran")
		if len(c.args) == 1 && c.args[0] == "-w" {
			args = []string{"run", "-w"}
		}
		r := runDlock(t, url, args...)
		if r.code != exitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, "dlock run: "+c.want) ||
			!strings.HasSuffix(r.stderr, "\nTry 'dlock run --help' for more information.\n") || strings.Count(r.stderr, "\n") != 2 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}
