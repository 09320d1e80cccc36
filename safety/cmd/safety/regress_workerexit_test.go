package main

import (
	"strings"
	"testing"
	"time"
)

// Worker processes that crashed (exit status 3 here) were not noticed:
// cmd.Wait's error was dropped, so the case reported only the events the
// workers wrote before dying, as if they had run their course.
func TestRegressWorkerExitIsCaseError(t *testing.T) {
	t.Setenv("DLOCK_SAFETY_TEST_WORKER_EXIT", "1")
	c := caseSpec{backend: "file", fault: "none", ttl: time.Second, dur: time.Second}
	res := runCase(c, 2, 1)
	if res.err == "" {
		t.Fatal("a case whose workers all crashed has no error")
	}
	if !strings.Contains(res.err, "exit status 3") || !strings.Contains(res.err, "told to fail") {
		t.Fatalf("the case error does not say how the worker ended: %s", res.err)
	}
}
