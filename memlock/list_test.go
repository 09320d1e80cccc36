package memlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/memlock"
)

// List reports how long each holder has held its key.
func TestListHeldFor(t *testing.T) {
	l := memlock.New()
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	time.Sleep(50 * time.Millisecond)
	infos, err := l.List(ctx, key)
	if err != nil || len(infos) != 1 {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	if h := infos[0].Holders[0].HeldFor; h < 50*time.Millisecond || h > time.Minute {
		t.Errorf("HeldFor = %v, want 50ms or more", h)
	}
}
