package main

import (
	"fmt"
	"os"
)

// tb lets the test-server helpers (internal/testserver, etcdtest) run in
// a program: Fatal panics, and the run recovers it as the case's error.
type tb struct {
	cleanups []func()
	root     string
}

type fatal struct{ msg string }

func (t *tb) Helper()                      {}
func (t *tb) Fatal(args ...any)            { panic(fatal{fmt.Sprint(args...)}) }
func (t *tb) Fatalf(f string, args ...any) { panic(fatal{fmt.Sprintf(f, args...)}) }
func (t *tb) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, "safety: "+f+"\n", args...) }
func (t *tb) Skip(args ...any)             { panic(fatal{fmt.Sprint(args...)}) }
func (t *tb) Cleanup(f func())             { t.cleanups = append(t.cleanups, f) }
func (t *tb) TempDir() string {
	d, err := os.MkdirTemp(t.root, "case-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func (t *tb) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}
