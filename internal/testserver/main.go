package testserver

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/background"
)

// BackgroundTimeout bounds how long Main waits for dlock's background work
// (undoing abandoned attempts, finishing requests whose callers left) to
// end before it looks for leaked goroutines. That work is bounded by
// dlock.DefaultReleaseTimeout and the clients' own timeouts.
const BackgroundTimeout = 30 * time.Second

// Main runs a test package's tests, runs delayed background work at once
// (background.Flush), waits for dlock's background work to
// end, then fails the run if goroutines leaked (goleak, with opts). Call
// it from TestMain: func TestMain(m *testing.M) { testserver.Main(m) }.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	afterMu.Lock()
	fs := afterTests
	afterMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		if err := fs[i](); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	background.Flush()
	if !background.Wait(BackgroundTimeout) {
		fmt.Fprintf(os.Stderr, "dlock background work still running after %v\n", BackgroundTimeout)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	afterMu    sync.Mutex
	afterTests []func() error
)

// AfterTests registers f to run once the package's tests are done, before
// Main looks for leaked goroutines, the last registered first: it stops a
// server the package's tests share. An error from f fails the run.
func AfterTests(f func() error) {
	afterMu.Lock()
	afterTests = append(afterTests, f)
	afterMu.Unlock()
}
