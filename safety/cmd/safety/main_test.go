package main

import (
	"os"
	"testing"
)

// The test binary doubles as the worker executable (startWorker runs
// os.Executable() "worker" ...).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if os.Getenv("DLOCK_SAFETY_TEST_WORKER_EXIT") != "" {
			os.Stderr.WriteString("worker: told to fail\n")
			os.Exit(3) // a worker that crashes (TestRunCase_CrashedWorkerIsCaseError)
		}
		os.Exit(runWorker(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "orphan-parent" {
		orphanParent() // procattr_test.go
	}
	os.Exit(m.Run())
}
