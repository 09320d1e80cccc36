package redislock_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// List(prefix) must return only keys starting with prefix. A prefix with
// '}' builds the SCAN pattern "dlock:{a}*", which also matches the lock
// key of "a" itself ("dlock:{a}"). (Red-team reproducer.)
func TestRegressListPrefixWithBrace(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
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
