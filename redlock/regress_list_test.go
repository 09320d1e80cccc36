package redlock_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/dlocktest"
)

// List(prefix) returns only keys starting with prefix, also when prefix
// contains '}': the SCAN pattern "dlock:{a}*" matches the lock key of
// "a" itself ("dlock:{a}") on every node.
func TestRegressListPrefixWithBrace(t *testing.T) {
	c := startNodes(t, 3)
	l := c.locker(t)
	base := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), base)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	with, err := l.Acquire(dlocktest.Context(t), base+"}x")
	if err != nil {
		t.Fatal(err)
	}
	defer with.Release(context.Background())
	infos, err := l.List(dlocktest.Context(t), base+"}")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Key != base+"}x" {
		t.Fatalf("List(%q) = %+v, want only %q", base+"}", infos, base+"}x")
	}
}
