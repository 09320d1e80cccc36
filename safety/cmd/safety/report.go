package main

import (
	"fmt"
	"strings"
	"time"
)

// report is the matrix of a whole run.
type report struct {
	seed    uint64
	results []caseResult
	elapsed time.Duration
	quick   bool
}

func (r caseResult) summary() string {
	if r.err != "" {
		return "ERROR: " + r.err
	}
	return fmt.Sprintf("%d events, %d faults injected", len(r.events), r.injected)
}

func (rep report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Safety\n\nseed %d\n", rep.seed)
	return b.String()
}

func (rep report) problems() []string {
	var out []string
	for _, r := range rep.results {
		if r.err != "" {
			out = append(out, r.spec.name()+": "+r.err)
		}
	}
	return out
}
