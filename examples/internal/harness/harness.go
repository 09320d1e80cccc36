// Package harness is what the case studies (examples/inventory, nightly,
// transfer) share: the servers a program starts when it is given no URLs
// (internal/testserver, run outside a test), and child processes that
// re-execute the program's own binary, so that a buyer or a worker can be
// paused for real with SIGSTOP while its lease runs out.
package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dlock-go/dlock/internal/testserver"
)

// Program is a testserver.TB for a main function: Fatal panics with a
// failure that Main recovers, and cleanups run when Main returns.
type Program struct {
	cleanups []func()
}

type failure struct{ msg string }

var _ testserver.TB = (*Program)(nil)

func (p *Program) Helper()                      {}
func (p *Program) Fatal(args ...any)            { panic(failure{fmt.Sprint(args...)}) }
func (p *Program) Fatalf(f string, args ...any) { panic(failure{fmt.Sprintf(f, args...)}) }
func (p *Program) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }
func (p *Program) Skip(args ...any)             { panic(failure{fmt.Sprint(args...)}) }
func (p *Program) Cleanup(f func())             { p.cleanups = append(p.cleanups, f) }

// TempDir returns a fresh directory, removed when Main returns.
func (p *Program) TempDir() string {
	d, err := os.MkdirTemp("", "dlock-example-")
	if err != nil {
		p.Fatal(err)
	}
	p.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func (p *Program) close() {
	for i := len(p.cleanups) - 1; i >= 0; i-- {
		p.cleanups[i]()
	}
	p.cleanups = nil
}

// Main runs a case study's main: fn gets a context cancelled by SIGINT or
// SIGTERM and a Program to start servers with. The servers are stopped
// when fn returns; an error (or a Fatal) exits with status 1.
func Main(name string, fn func(ctx context.Context, p *Program) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	p := &Program{}
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				f, ok := r.(failure)
				if !ok {
					panic(r)
				}
				err = errors.New(f.msg)
			}
		}()
		return fn(ctx, p)
	}()
	p.close()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Redis returns addr, or, if it is empty, the address of a redis-server
// started for t.
func Redis(t testserver.TB, addr string) string {
	if addr != "" {
		return addr
	}
	return testserver.StartRedis(t).Addr()
}

// Postgres returns dsn, or, if it is empty, a URL of a PostgreSQL server
// started for t (testserver.StartPostgres: as the postgres user under
// root).
func Postgres(t testserver.TB, dsn string) string {
	if dsn != "" {
		return dsn
	}
	return testserver.StartPostgres(t).DSN("")
}
