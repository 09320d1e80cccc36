package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The help of run, hold and version is GNU-style: on stdout, exit 0, each
// option on one line with its short and long names together, none in Go's
// flag style ("-wait value"); `dlock help CMD` is `dlock CMD --help`.
func TestHelpGNUStyle(t *testing.T) {
	url := fileURL(t)
	runOpts := []string{
		`      --url URL`, `      --ttl DUR`, `  -s, --shared`, `      --limit N`, `  -w, --wait DUR\|SECS`,
		`  -n, --nonblock`, `  -E, --conflict-exit-code N`, `      --connect-timeout DUR`, `      --verbose`, `  -h, --help`,
	}
	for _, c := range []struct {
		cmd  string
		opts []string
		more []string // in the text
	}{
		{"run", append(runOpts, `  -c, --command CMDLINE`, `      --grace DUR`), []string{"KEY -c CMDLINE", "/bin/sh -c", "flock -w", "waiting for", "Exit status", "128+N", "Examples"}},
		{"hold", runOpts, []string{"Usage: dlock hold", "SIGTERM", "TOKEN", "owner id", "Exit status", "Examples"}},
		{"version", []string{`  -h, --help`}, []string{"Usage: dlock version", "git describe"}},
	} {
		for _, args := range [][]string{{c.cmd, "--help"}, {c.cmd, "-h"}, {"help", c.cmd}} {
			r := runDlock(t, url, args...)
			if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "Usage: dlock "+c.cmd) {
				t.Errorf("%q: exit %d, stderr %q, stdout %q", args, r.code, r.stderr, r.stdout)
				continue
			}
			for _, o := range c.opts {
				if !regexp.MustCompile(`(?m)^` + o + `( +\S|\n {20,}\S)`).MatchString(r.stdout) {
					t.Errorf("%q: no option line %q:\n%s", args, o, r.stdout)
				}
			}
			for _, m := range c.more {
				if !strings.Contains(r.stdout, m) {
					t.Errorf("%q lacks %q", args, m)
				}
			}
			if goStyle := regexp.MustCompile(`(?m)^  -[a-z-]+ (value|string|duration|int)\b`).FindString(r.stdout); goStyle != "" {
				t.Errorf("%q: an option in Go's flag style: %q", args, goStyle)
			}
			for _, l := range strings.Split(r.stdout, "\n") {
				if len(l) > 80 {
					t.Errorf("%q: line over 80 columns: %q", args, l)
				}
			}
		}
	}
	// The main help: on stdout, listing hold, -c and version.
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		r := runDlock(t, url, args...)
		for _, want := range []string{"dlock hold", "-c CMDLINE", "dlock version", "dlock help [COMMAND]", "-w DUR|SECS"} {
			if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, want) {
				t.Errorf("%q: exit %d, stderr %q; stdout lacks %q", args, r.code, r.stderr, want)
			}
		}
	}
}

// A usage error of run, hold, version or dlock itself is one line naming
// the problem and a pointer to --help, on stderr, exit 2; not the help.
func TestHelpNotPrintedOnUsageErrors(t *testing.T) {
	url := fileURL(t)
	for _, c := range []struct {
		args        []string
		first, help string
	}{
		{[]string{"run", "--nosuchflag", "k", "--", "true"}, "dlock run: option --nosuchflag is not defined", "dlock run --help"},
		{[]string{"run", "-q", "k", "--", "true"}, "dlock run: option -q is not defined", "dlock run --help"},
		{[]string{"run", "--ttl", "abc", "k", "--", "true"}, `dlock run: invalid value "abc" for --ttl: want a duration`, "dlock run --help"},
		{[]string{"run", "--ttl"}, "dlock run: option --ttl needs a value (DUR)", "dlock run --help"},
		{[]string{"run", "--limit", "0", "k", "--", "true"}, `dlock run: invalid value "0" for --limit`, "dlock run --help"},
		{[]string{"run", "-E", "300", "k", "--", "true"}, "dlock run: --conflict-exit-code must be in 0-255, got 300", "dlock run --help"},
		{[]string{"run", "--grace", "-1s", "k", "--", "true"}, "dlock run: --grace must not be negative", "dlock run --help"},
		{[]string{"run", "--connect-timeout", "0s", "k", "--", "true"}, "dlock run: --connect-timeout must be positive", "dlock run --help"},
		{[]string{"run"}, "dlock run: missing KEY", "dlock run --help"},
		{[]string{"run", "k"}, "dlock run: missing CMD after KEY --", "dlock run --help"},
		{[]string{"run", "k", "--"}, "dlock run: missing CMD after KEY --", "dlock run --help"},
		{[]string{"hold", "--nonblock=2", "k"}, `dlock hold: invalid boolean value "2" for --nonblock`, "dlock hold --help"},
		{[]string{"version", "--short"}, "dlock version: option --short is not defined", "dlock version --help"},
		{[]string{"bogus"}, `dlock: unknown command "bogus"`, "dlock --help"},
		{[]string{"help", "bogus"}, `dlock: unknown command "bogus"`, "dlock --help"},
		{[]string{"\x1b[2J"}, `dlock: unknown command "\x1b[2J"`, "dlock --help"}, // escaped, not run by the terminal
		{nil, "Usage: dlock COMMAND [OPTION]... [ARG]...", "dlock --help"},
	} {
		r := runDlock(t, url, c.args...)
		want := c.first
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.code != exitUsage || r.stdout != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], want) ||
			lines[1] != "Try '"+c.help+"' for more information." {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, %q and the pointer to %s", c.args, r.code, r.stdout, r.stderr, want, c.help)
		}
	}
}

// dlock version prints the version set at build time with -ldflags -X
// main.version (what the Makefile passes, from git describe); without it,
// the module's or "devel".
func TestVersionFromLdflags(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "dlock")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-test.1", "-o", exe, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(exe, args...).Output()
		if err != nil || !regexp.MustCompile(`^dlock v9\.8\.7-test\.1 \(go\S+ \w+/\w+\)\n$`).Match(out) {
			t.Errorf("%q: %v %q", args, err, out)
		}
	}
	r := runDlock(t, "", "version")
	if r.code != 0 || !regexp.MustCompile(`^dlock \S+ \(go\S+ \w+/\w+\)\n$`).MatchString(r.stdout) || strings.Contains(r.stdout, "v9.8.7") {
		t.Errorf("version without -ldflags: %d %q", r.code, r.stdout)
	}
}
