package main

import (
	"strings"
	"testing"
)

// -c CMDLINE, like flock -c: one string run by /bin/sh -c, so that it can
// use DLOCK_TOKEN; before KEY or right after it; its status is dlock's.
func TestRunShellCommand(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, args := range [][]string{
		{"run", "k", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN"`},
		{"run", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN"`, "k"},
		{"run", "k", "--command", `echo "$DLOCK_KEY $DLOCK_TOKEN"`},
		{"run", "k", `--command=echo "$DLOCK_KEY $DLOCK_TOKEN"`},
		{"run", "--command", `echo "$DLOCK_KEY $DLOCK_TOKEN"`, "--", "k"},
		{"run", "-n", "-c", `echo "$DLOCK_KEY $DLOCK_TOKEN"`, "k"},
		{"run", "k", `-cecho "$DLOCK_KEY $DLOCK_TOKEN"`},
		{"run", "k", `-c=echo "$DLOCK_KEY $DLOCK_TOKEN"`},
		{"run", `-c=echo "$DLOCK_KEY $DLOCK_TOKEN"`, "k"},
		{"run", "-nc", `echo "$DLOCK_KEY $DLOCK_TOKEN"`, "k"},
	} {
		r := runDlock(t, url, args...)
		f := strings.Fields(r.stdout)
		if r.code != 0 || len(f) != 2 || f[0] != "k" || f[1] == "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := runDlock(t, url, "run", "k", "-c", "echo one | tr o 0; exit 3"); r.code != 3 || r.stdout != "0ne\n" {
		t.Errorf("a pipeline and exit 3: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// After "--", -c is CMD's name, not dlock's option.
	if r := runDlock(t, url, "run", "k", "--", "-c", "echo ran"); r.code != exitNoExec || r.stdout != "" {
		t.Errorf("-c after --: exit %d, stdout %q, stderr %q; want %d", r.code, r.stdout, r.stderr, exitNoExec)
	}
	if r := runDlock(t, url, "run", "k", "-c", "kill -TERM $$"); r.code != 128+15 {
		t.Errorf("killed shell: exit %d, want 143", r.code)
	}
}

// -c and CMD together, -c twice, -c without a command: usage errors
// (exit 2, one line and the pointer to --help), and nothing runs.
func TestRunShellCommandUsageErrors(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "k", "-c", "echo ran", "--", "echo", "ran"}, "dlock run: both -c CMDLINE and CMD given (echo ran): give one"},
		{[]string{"run", "-c", "echo ran", "k", "echo", "ran"}, "dlock run: both -c CMDLINE and CMD given (echo ran): give one"},
		{[]string{"run", "-c", "echo ran", "k", "--", "echo", "ran"}, "dlock run: both -c CMDLINE and CMD given"},
		{[]string{"run", "-c", "echo ran", "-c", "echo ran", "k"}, `dlock run: invalid value "echo ran" for -c: -c given twice`},
		{[]string{"run", "-c", "echo ran", "k", "-c", "echo ran"}, "dlock run: -c given twice"},
		{[]string{"run", "k", "-c"}, "dlock run: option -c needs a value (CMDLINE)"},
		{[]string{"run", "k", "-c", " "}, `dlock run: invalid value " " for -c: an empty command`},
		{[]string{"run", "-c", "", "k"}, `dlock run: invalid value "" for -c: an empty command`},
		{[]string{"run", "k", "--command="}, `dlock run: invalid value "" for --command: an empty command`},
		{[]string{"run", "k", "-c="}, `dlock run: invalid value "" for -c: an empty command`},
		{[]string{"run", "-c", "echo ran"}, "dlock run: missing KEY"},
	} {
		r := runDlock(t, url, c.args...)
		if r.code != exitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, c.want) ||
			!strings.HasSuffix(r.stderr, "\nTry 'dlock run --help' for more information.\n") || strings.Count(r.stderr, "\n") != 2 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}
