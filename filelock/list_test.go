package filelock_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

func TestList(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t, dir)
	ctx := dlocktest.Context(t)
	var held []*dlock.Lock
	for _, k := range []string{"jobs/b", "jobs/a", "other"} {
		lk, err := l.Acquire(ctx, k, dlock.WithMetadata("job", k))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}
	infos, err := mustNew(t, dir).List(ctx, "jobs/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Key != "jobs/a" || infos[1].Key != "jobs/b" {
		t.Fatalf("List(jobs/) = %+v", infos)
	}
	for i, in := range infos {
		lk := held[1-i]
		if len(in.Holders) != 1 {
			t.Fatalf("%s: holders %+v", in.Key, in.Holders)
		}
		h := in.Holders[0]
		if h.Owner != lk.Owner() || h.Token != lk.Token() || h.TTL <= 0 || h.TTL > dlock.DefaultTTL {
			t.Errorf("info %+v does not match lock owner %s token %d", in, lk.Owner(), lk.Token())
		}
		if h.Metadata["job"] != in.Key || h.Metadata[dlock.MetaPID] != strconv.Itoa(os.Getpid()) {
			t.Errorf("metadata %v", h.Metadata)
		}
	}
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Expire("other"); err != nil {
		t.Fatal(err)
	}
	infos, err = l.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Key != "jobs/a" {
		t.Fatalf("List after release and expire = %+v", infos)
	}
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	held[2].Release(ctx) // lost by Expire
	if infos, err := l.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Fatalf("List after all released = %+v, %v", infos, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.List(cctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("List with cancelled context = %v", err)
	}
}
