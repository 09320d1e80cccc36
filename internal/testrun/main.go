// Command testrun runs the race-enabled tests of every module of the
// workspace (go.work) and reports what they cost: `make test` and `make
// test-long` call it.
//
// The modules' tests mostly wait (for servers, leases, timeouts), not
// compute, so testrun runs several modules at once (-jobs). It prints a
// line as each module ends and, every -progress interval, which are
// still running; at the end a table of each module's wall time and
// result, and the slowest tests (from `go test -json`; leaf tests, as a
// suite's parent lasts as long as all its subtests). Tests that took
// longer than -slow are listed separately: a test that grows past it is
// to be split or moved to `make test-long`.
//
// Usage (from the repository root):
//
//	go run ./internal/testrun [-short] [-jobs N] [-parallel N] [-timeout 20m] [-also CMD]... [MODULE_DIR...]
//
// With no MODULE_DIR it runs every module of the workspace, longest
// first (by the order in longFirst, then the workspace's). Each -also
// command (run by sh -c: the fuzzers, the release check) runs in a lane
// of its own beside the modules, one after another in the order given, at
// a lower CPU priority (-also-nice) than the tests:
// they compile more than they wait, and the modules' tests mostly wait.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// longFirst are the modules whose tests take longest, started first so
// that the short ones fill the time around them. The order is a
// scheduling hint only: a module missing here starts after these.
var longFirst = []string{"redislock", "zklock", "cmd/dlock", "etcdlock", "pglock", "redlock", "."}

func main() {
	short := flag.Bool("short", false, "pass -short: leave out the tests that run only in make test-long")
	jobs := flag.Int("jobs", 4, "modules tested at once")
	timeout := flag.Duration("timeout", 20*time.Minute, "go test -timeout for each module")
	slow := flag.Duration("slow", 30*time.Second, "list the tests that took longer than this")
	top := flag.Int("top", 10, "how many of the slowest tests to list")
	progress := flag.Duration("progress", time.Minute, "how often to say which modules still run")
	run := flag.String("run", "", "go test -run pattern (default: every test)")
	parallel := flag.Int("parallel", 8, "go test -parallel: a package's parallel tests run at once")
	var also multiFlag
	flag.Var(&also, "also", "a command to run beside the modules (repeatable; run in order, by sh -c)")
	alsoNice := flag.Int("also-nice", 10, "the niceness of the -also commands: batch work (fuzzing, compiling) must not starve the servers and timers the tests wait on")
	supp := flag.String("race-suppressions", filepath.Join("internal", "testrun", "gorace.supp"), "the race detector's suppressions for the tests and -also commands (GORACE); empty for none")
	flag.Parse()
	if err := suppressRaces(*supp); err != nil {
		fmt.Fprintln(os.Stderr, "testrun:", err)
		os.Exit(2)
	}
	if *jobs < 1 {
		fmt.Fprintln(os.Stderr, "testrun: -jobs must be at least 1")
		os.Exit(2)
	}
	mods, err := modules(flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "testrun:", err)
		os.Exit(2)
	}
	args := []string{"test", "-race", "-count=1", "-json", "-timeout", timeout.String(), "-parallel", fmt.Sprint(*parallel)}
	if *short {
		args = append(args, "-short")
	}
	if *run != "" {
		args = append(args, "-run", *run)
	}
	args = append(args, "./...")

	start := time.Now()
	results := make([]*result, len(mods))
	sem := make(chan struct{}, *jobs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	running := map[string]time.Time{}
	stopProgress := make(chan struct{})
	go func() {
		tick := time.NewTicker(*progress)
		defer tick.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-tick.C:
				mu.Lock()
				var names []string
				for m, s := range running {
					names = append(names, fmt.Sprintf("%s (%s)", m, since(s)))
				}
				mu.Unlock()
				sort.Strings(names)
				fmt.Printf("testrun: %s elapsed; running: %s\n", since(start), strings.Join(names, ", "))
			}
		}
	}()
	extras := make([]*result, len(also))
	if len(also) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, c := range also {
				mu.Lock()
				running[c] = time.Now()
				mu.Unlock()
				fmt.Printf("== %s\n", c)
				r := command(c, *alsoNice)
				mu.Lock()
				delete(running, c)
				extras[i] = r
				r.report(os.Stdout)
				mu.Unlock()
			}
		}()
	}
	for i, m := range mods {
		// Taken here, in order: the longest modules start first.
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			mu.Lock()
			running[m.name] = time.Now()
			mu.Unlock()
			fmt.Printf("== go test -race %s\n", m.name)
			r := test(m, args)
			mu.Lock()
			delete(running, m.name)
			results[i] = r
			// One module's report at a time, whole.
			r.report(os.Stdout)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stopProgress)
	ok := summary(os.Stdout, append(results, extras...), time.Since(start), *top, *slow)
	if !ok {
		os.Exit(1)
	}
}

type module struct {
	name string // the directory, relative to the workspace root ("." for the root)
	dir  string
}

// modules returns the modules to test: dirs, or every module of the
// workspace, the long ones first.
func modules(dirs []string) ([]module, error) {
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			return nil, fmt.Errorf("go list -m: %w", err)
		}
		dirs = strings.Fields(string(out))
	}
	var mods []module
	for _, d := range dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(abs, "go.mod")); err != nil {
			return nil, fmt.Errorf("%s is not a module directory: %w", d, err)
		}
		name, err := filepath.Rel(root, abs)
		if err != nil {
			name = abs
		}
		mods = append(mods, module{name: filepath.ToSlash(name), dir: abs})
	}
	rank := func(m module) int {
		if i := slices.Index(longFirst, m.name); i >= 0 {
			return i
		}
		return len(longFirst)
	}
	sort.SliceStable(mods, func(i, j int) bool { return rank(mods[i]) < rank(mods[j]) })
	return mods, nil
}

// result is one module's run.
type result struct {
	mod     module
	cmd     bool // an -also command, not a module
	wall    time.Duration
	err     error    // go test's exit (nil: every package passed)
	stderr  string   // go test's own stderr (build errors)
	tests   []tcase  // every test and subtest that ended
	failed  []testID // failing tests, in order
	output  map[string]*strings.Builder
	pkgFail map[string]bool
	started map[testID]bool // tests that began and have not ended
	counts  struct{ pass, fail, skip int }
}

// tcase is a test's outcome from go test -json.
type tcase struct {
	pkg, name, action string
	elapsed           time.Duration
}

// event is one line of go test -json (test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail events
	Test       string
	Elapsed    float64
	Output     string
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (f *multiFlag) String() string     { return strings.Join(*f, "; ") }
func (f *multiFlag) Set(v string) error { *f = append(*f, v); return nil }

// command runs c with sh -c from the repository root; its output is kept
// and shown only if it fails.
func command(c string, nice int) *result {
	r := &result{mod: module{name: c}, cmd: true, output: map[string]*strings.Builder{}, pkgFail: map[string]bool{}, started: map[testID]bool{}}
	cmd := exec.Command("sh", "-c", c)
	if nice != 0 {
		cmd = exec.Command("nice", "-n", strconv.Itoa(nice), "sh", "-c", c)
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r.wall, r.err = time.Since(start), err
	if err != nil {
		r.out("", "").Write(out)
	}
	return r
}

func test(m module, args []string) *result {
	r := &result{mod: m, output: map[string]*strings.Builder{}, pkgFail: map[string]bool{}, started: map[testID]bool{}}
	cmd := exec.Command("go", args...)
	cmd.Dir = m.dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.err = err
		return r
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		r.err = err
		return r
	}
	r.read(out)
	r.err = cmd.Wait()
	r.unfinished()
	r.wall = time.Since(start)
	r.stderr = stderr.String()
	return r
}

// read consumes go test -json's output.
func (r *result) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not test2json (a build failure's text): keep it.
			r.out("", "").WriteString(sc.Text() + "\n")
			continue
		}
		switch e.Action {
		case "build-output":
			r.out(buildPkg(e.ImportPath), "").WriteString(e.Output)
		case "build-fail":
			r.pkgFail[buildPkg(e.ImportPath)] = true
		case "run":
			if e.Test != "" {
				r.started[testID{e.Package, e.Test}] = true
			}
		case "output":
			r.out(e.Package, e.Test).WriteString(e.Output)
		case "pass", "fail", "skip":
			delete(r.started, testID{e.Package, e.Test})
			if e.Test == "" {
				if e.Action == "fail" {
					r.pkgFail[e.Package] = true
				}
				continue
			}
			if e.Action == "fail" {
				r.failed = append(r.failed, testID{e.Package, e.Test})
			}
			r.tests = append(r.tests, tcase{pkg: e.Package, name: e.Test, action: e.Action,
				elapsed: time.Duration(e.Elapsed * float64(time.Second))})
			if strings.Contains(e.Test, "/") {
				continue // subtests: counted in their parent
			}
			switch e.Action {
			case "pass":
				r.counts.pass++
			case "fail":
				r.counts.fail++
			case "skip":
				r.counts.skip++
			}
		}
	}
}

// unfinished counts as failed every test that began and never ended (its
// binary panicked or timed out, killing it mid-test), so that its output
// is shown.
func (r *result) unfinished() {
	var ids []testID
	for id := range r.started {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		return ids[i].pkg+"\x00"+ids[i].test < ids[j].pkg+"\x00"+ids[j].test
	})
	for _, id := range ids {
		r.failed = append(r.failed, id)
		r.pkgFail[id.pkg] = true
		if !strings.Contains(id.test, "/") {
			r.counts.fail++
		}
	}
}

// buildPkg is the package of a build event's ImportPath ("p [p.test]").
func buildPkg(importPath string) string {
	p, _, _ := strings.Cut(importPath, " ")
	return p
}

func (r *result) out(pkg, test string) *strings.Builder {
	k := pkg + "\x00" + test
	b := r.output[k]
	if b == nil {
		b = &strings.Builder{}
		r.output[k] = b
	}
	return b
}

func (r *result) ok() bool { return r.err == nil && len(r.failed) == 0 && len(r.pkgFail) == 0 }

// report prints the module's outcome; for a failure, the output of every
// failed test (subtests included) and of every failed package.
func (r *result) report(w io.Writer) {
	status := "ok"
	if !r.ok() {
		status = "FAIL"
	}
	if r.cmd {
		fmt.Fprintf(w, "== %s %s in %s\n", status, r.mod.name, r.wall.Round(time.Second))
	} else {
		fmt.Fprintf(w, "== %s %s in %s (%d passed, %d failed, %d skipped)\n",
			status, r.mod.name, r.wall.Round(time.Second), r.counts.pass, r.counts.fail, r.counts.skip)
	}
	if r.ok() {
		return
	}
	for _, id := range r.failed {
		fmt.Fprintf(w, "--- FAIL %s %s\n%s", id.pkg, id.test, indent(r.out(id.pkg, id.test).String()))
	}
	pkgs := make([]string, 0, len(r.pkgFail))
	for p := range r.pkgFail {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		fmt.Fprintf(w, "--- FAIL package %s\n%s", p, indent(r.out(p, "").String()))
	}
	if s := r.out("", "").String(); s != "" {
		fmt.Fprint(w, indent(s))
	}
	if r.stderr != "" {
		fmt.Fprint(w, indent(r.stderr))
	}
	if r.err != nil && len(r.failed) == 0 && len(r.pkgFail) == 0 {
		fmt.Fprintf(w, "    %s: %v\n", map[bool]string{true: "command", false: "go test"}[r.cmd], r.err)
	}
}

// testID names a test of a package.
type testID struct{ pkg, test string }

func indent(s string) string {
	if s == "" {
		return ""
	}
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	if !strings.HasSuffix(s, "\n") {
		b.WriteString("\n")
	}
	return b.String()
}

// leaves returns the tests without subtests: a suite's parent test lasts
// as long as all its subtests, and only a leaf can be split or moved.
func leaves(tests []tcase) []tcase {
	parent := map[testID]bool{}
	for _, tc := range tests {
		for i := strings.LastIndex(tc.name, "/"); i > 0; i = strings.LastIndex(tc.name[:i], "/") {
			parent[testID{tc.pkg, tc.name[:i]}] = true
		}
	}
	var out []tcase
	for _, tc := range tests {
		if !parent[testID{tc.pkg, tc.name}] {
			out = append(out, tc)
		}
	}
	return out
}

// summary prints every module's wall time and result, the slowest tests
// (leaves: tests without subtests), and the tests over slow; it reports
// whether everything passed.
func summary(w io.Writer, results []*result, wall time.Duration, top int, slow time.Duration) bool {
	ok := true
	fmt.Fprintf(w, "\n== test summary: %s wall clock\n", wall.Round(time.Second))
	fmt.Fprintf(w, "%-24s %8s  %-6s %6s %6s %6s\n", "MODULE / STEP", "WALL", "RESULT", "PASS", "FAIL", "SKIP")
	byWall := slices.Clone(results)
	sort.SliceStable(byWall, func(i, j int) bool { return byWall[i].wall > byWall[j].wall })
	var all []tcase
	for _, r := range byWall {
		status := "ok"
		if !r.ok() {
			status, ok = "FAIL", false
		}
		fmt.Fprintf(w, "%-24s %7.0fs  %-6s %6d %6d %6d\n", r.mod.name, r.wall.Seconds(), status,
			r.counts.pass, r.counts.fail, r.counts.skip)
		all = append(all, leaves(r.tests)...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].elapsed > all[j].elapsed })
	fmt.Fprintf(w, "\n== the %d slowest tests\n", min(top, len(all)))
	for _, tc := range all[:min(top, len(all))] {
		fmt.Fprintf(w, "%7.1fs  %s %s\n", tc.elapsed.Seconds(), tc.pkg, tc.name)
	}
	var over []tcase
	for _, tc := range all {
		if tc.elapsed > slow {
			over = append(over, tc)
		}
	}
	if len(over) > 0 {
		fmt.Fprintf(w, "\n== %d tests took over %v: split them or move them to make test-long\n", len(over), slow)
		for _, tc := range over {
			fmt.Fprintf(w, "%7.1fs  %s %s\n", tc.elapsed.Seconds(), tc.pkg, tc.name)
		}
	}
	return ok
}

func since(t time.Time) string { return time.Since(t).Round(time.Second).String() }

// suppressRaces adds the suppressions in file to GORACE, which every test
// binary and -also command started from here inherits. The file names
// only races inside dependencies that dlock cannot fix (each entry says
// which and why); a race in dlock's own code is never suppressed.
func suppressRaces(file string) error {
	if file == "" {
		return nil
	}
	g := os.Getenv("GORACE")
	if strings.Contains(g, "suppressions=") {
		fmt.Fprintf(os.Stderr, "testrun: GORACE names its own suppressions; %s is not added\n", file)
		return nil
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return err
	}
	if strings.ContainsAny(abs, " \t\n") {
		return fmt.Errorf("race suppressions: GORACE cannot name a path with blanks: %q", abs)
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("race suppressions: %w", err)
	}
	return os.Setenv("GORACE", strings.TrimSpace(g+" suppressions="+abs))
}
