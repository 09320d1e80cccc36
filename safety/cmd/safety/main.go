// Command safety is dlock's safety harness (see package safety): it runs
// worker processes against real servers under real faults and writes the
// matrix of what broke and what fencing saved.
//
//	safety [-seed N] [-quick] [-out FILE] [-case BACKEND/FAULT]
//
// Every run is seeded; the same seed replays the same fault schedule
// (the servers' and the scheduler's timing still vary).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

func main() {
	etcdtest.Serve() // when started as an etcd child process
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(runWorker(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("safety", flag.ContinueOnError)
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()%1e6), "seed of the fault schedule")
	quick := fs.Bool("quick", false, "a short run (make safety-quick): Redis and file, client pauses only")
	out := fs.String("out", "", "write the Markdown matrix to this file")
	only := fs.String("case", "", "run only the cases whose BACKEND/FAULT name contains this")
	workers := fs.Int("workers", 4, "worker processes per case")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if n := normalPriority(); n > 0 {
		fmt.Fprintf(os.Stderr, "safety: running at nice %d (lowering it needs root): on a loaded machine the workers may be starved\n", n)
	}
	cases := allCases()
	if *quick {
		cases = quickCases()
	}
	if *only != "" {
		// An exact name selects that case alone (redis-sentinel/failover,
		// not also redis-sentinel/failover-lagging); otherwise every case
		// whose name contains it.
		var exact, sel []caseSpec
		for _, c := range cases {
			if c.name() == *only {
				exact = append(exact, c)
			}
			if strings.Contains(c.name(), *only) {
				sel = append(sel, c)
			}
		}
		cases = sel
		if len(exact) > 0 {
			cases = exact
		}
	}
	if len(cases) == 0 {
		fmt.Fprintln(os.Stderr, "safety: no case selected")
		return 2
	}
	start := time.Now()
	fmt.Printf("safety: %d cases, %d workers each, seed %d\n", len(cases), *workers, *seed)
	var results []caseResult
	for i, c := range cases {
		fmt.Printf("[%3.0fs] %d/%d %s ...\n", time.Since(start).Seconds(), i+1, len(cases), c.name())
		r := runCase(c, *workers, *seed+uint64(i))
		fmt.Printf("[%3.0fs]     %s\n", time.Since(start).Seconds(), r.summary())
		results = append(results, r)
	}
	rep := report{seed: *seed, results: results, elapsed: time.Since(start), quick: *quick}
	if *out != "" {
		if err := os.WriteFile(*out, []byte(rep.markdown()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "safety:", err)
			return 1
		}
		fmt.Println("safety: wrote", *out)
	}
	if problems := rep.problems(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "safety: FAIL:", p)
		}
		return 1
	}
	fmt.Printf("safety: ok (%s)\n", time.Since(start).Round(time.Second))
	return 0
}
