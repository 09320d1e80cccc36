package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The help of run, hold and version is GNU-style: on stdout, exit 0, each
// option on one line with its short and long names together, none in Go's
// flag style ("-wait value"); `dlock help CMD` is `dlock CMD --help`.
func TestHelpGNUStyle(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
// main.version (what the Makefile passes, from git describe; the tests'
// binary is built with it); without it, the module's or "devel". A build
// of its own made this test the suite's slowest (up to 57 s under load).
func TestVersionFromLdflags(t *testing.T) {
	t.Parallel()
	want := regexp.MustCompile(`^dlock ` + regexp.QuoteMeta(binVersion) + ` \(go\S+ \w+/\w+\)\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := runDlock(t, "", args...)
		if r.code != 0 || !want.MatchString(r.stdout) {
			t.Errorf("%q: exit %d %q", args, r.code, r.stdout)
		}
	}
	// This test binary is built without -X main.version.
	var stdout, stderr strings.Builder
	code := run([]string{"version"}, &stdout, &stderr)
	if code != 0 || !regexp.MustCompile(`^dlock \S+ \(go\S+ \w+/\w+\)\n$`).MatchString(stdout.String()) || strings.Contains(stdout.String(), binVersion) {
		t.Errorf("version without -ldflags: %d %q %q", code, stdout.String(), stderr.String())
	}
}

// helpCommands are the commands whose help TestEveryCommandHelp checks.
var helpCommands = []string{"run", "hold", "ls", "check", "unlock", "demo", "serve", "version"}

// Every command's help is GNU-style on stdout (exit 0, nothing on stderr,
// no option in Go's "-flag value" style), lists every option the command
// accepts in its Options and its Usage lines, and dlock --help's synopsis
// of the command names exactly the options the command accepts.
func TestEveryCommandHelp(t *testing.T) {
	synopsis := synopsisGroups(t)
	goStyle := regexp.MustCompile(`(?m)^\s*-[A-Za-z][A-Za-z-]+( (value|string|duration|int|uint|float))?\s*$|(?m)^\s+-[A-Za-z][A-Za-z-]+ (value|string|duration|int)\b`)
	for _, cmd := range helpCommands {
		var set *optionSet
		parseHook = func(s *optionSet) { set = s }
		var stdout, stderr strings.Builder
		code := run([]string{cmd, "--help"}, &stdout, &stderr)
		parseHook = nil
		help := stdout.String()
		if code != 0 || stderr.Len() != 0 || !strings.HasPrefix(help, "Usage: dlock "+cmd) || set == nil {
			t.Errorf("%s --help: exit %d, stderr %q, stdout %.80q, options parsed by flags.go: %v", cmd, code, stderr.String(), help, set != nil)
			continue
		}
		for _, l := range strings.Split(help, "\n") {
			if len([]rune(l)) > 80 {
				t.Errorf("%s --help: line over 80 columns: %q", cmd, l)
			}
		}
		if m := goStyle.FindString(help); m != "" {
			t.Errorf("%s --help: an option in Go's flag style: %q", cmd, m)
		}
		usageLines, _, _ := strings.Cut(help, "\n\n")
		opts, _, _ := strings.Cut(help[strings.Index(help, "\nOptions:\n"):], "\n\n")
		group := synopsis[cmd]
		for _, o := range set.opts {
			names := "--" + o.long
			line := `(?m)^      --` + regexp.QuoteMeta(o.long) + `\b`
			if o.short != 0 {
				names = "-" + string(o.short) + ", --" + o.long
				line = `(?m)^  -` + string(o.short) + `, --` + regexp.QuoteMeta(o.long) + `\b`
			}
			if !regexp.MustCompile(line).MatchString(opts) {
				t.Errorf("%s --help: no line for %s under Options:\n%s", cmd, names, opts)
			}
			if !mentions(usageLines, o) {
				t.Errorf("%s --help: its Usage lines do not mention %s:\n%s", cmd, names, usageLines)
			}
			if !strings.Contains(group, "[OPTION]...") && !mentions(group, o) {
				t.Errorf("dlock --help: the synopsis of %s lacks %s:\n%s", cmd, names, group)
			}
		}
		// And the synopsis names no option the command does not take.
		for _, m := range regexp.MustCompile(`--[a-z][a-z-]*`).FindAllString(group, -1) {
			if set.long[m[2:]] == nil {
				t.Errorf("dlock --help: the synopsis of %s names %s, which %s does not take", cmd, m, cmd)
			}
		}
		for _, m := range regexp.MustCompile(`(?:^|[\[ |(])-([A-Za-z])\b`).FindAllStringSubmatch(group, -1) {
			if set.short[m[1][0]] == nil {
				t.Errorf("dlock --help: the synopsis of %s names -%s, which %s does not take", cmd, m[1], cmd)
			}
		}
	}
	for _, l := range strings.Split(usage, "\n") {
		if len([]rune(l)) > 80 {
			t.Errorf("dlock --help: line over 80 columns: %q", l)
		}
	}
	for cmd := range synopsis {
		if !slices.Contains(helpCommands, cmd) && cmd != "help" {
			t.Errorf("dlock --help: synopsis of %s, a command this test does not check", cmd)
		}
	}
}

// mentions reports whether text names option o, by its long or its short name.
func mentions(text string, o *option) bool {
	if o.long != "" && regexp.MustCompile(`(^|[^-\w])--`+regexp.QuoteMeta(o.long)+`\b`).MatchString(text) {
		return true
	}
	return o.short != 0 && regexp.MustCompile(`(^|[\s\[|(])-`+regexp.QuoteMeta(string(o.short))+`\b`).MatchString(text)
}

// synopsisGroups splits the Usage lines of dlock --help by command: the
// lines of each "  dlock CMD" and their continuation lines, joined.
func synopsisGroups(t *testing.T) map[string]string {
	t.Helper()
	_, rest, ok := strings.Cut(usage, "\nUsage:\n")
	block, _, _ := strings.Cut(rest, "\n\n")
	if !ok || block == "" {
		t.Fatalf("no Usage: block in dlock --help")
	}
	groups := map[string]string{}
	cmd := ""
	for _, l := range strings.Split(block, "\n") {
		if f := strings.Fields(l); strings.HasPrefix(l, "  dlock ") && len(f) > 1 {
			cmd = f[1]
		} else if cmd == "" || !strings.HasPrefix(l, "     ") {
			t.Fatalf("dlock --help: synopsis line %q is neither a command nor a continuation", l)
		}
		groups[cmd] += l + "\n"
	}
	return groups
}

// The synopsis at the top of docs/cli.md, the command's reference, is
// dlock --help's.
func TestCLIReferenceSynopsis(t *testing.T) {
	t.Parallel()
	ref, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(ref), "# The `dlock` command\n")
	_, block, ok2 := strings.Cut(sec, "```sh\n")
	block, _, ok3 := strings.Cut(block, "```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/cli.md: no ```sh block under \"# The `dlock` command\"")
	}
	_, rest, _ := strings.Cut(usage, "\nUsage:\n")
	syn, _, _ := strings.Cut(rest, "\n\n")
	var want strings.Builder
	for _, l := range strings.Split(syn, "\n") {
		want.WriteString(strings.TrimPrefix(l, "  ") + "\n")
	}
	if block != want.String() {
		t.Errorf("docs/cli.md's synopsis differs from dlock --help's (main.go usage); docs/cli.md:\n%s\nwant:\n%s", block, want.String())
	}
}
