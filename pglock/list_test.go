package pglock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// List reports how long each holder has held its key, by the database's
// clock: exclusive and shared holders alike.
func TestListHeldFor(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	ctx := dlocktest.Context(t)
	base := dlocktest.Key(t)
	x, err := l.Acquire(ctx, base+"/x")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Release(ctx)
	s, err := l.Acquire(ctx, base+"/s", dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	const pause = 100 * time.Millisecond
	time.Sleep(pause)
	infos, err := l.List(ctx, base+"/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 {
		t.Fatalf("List = %+v", infos)
	}
	for _, in := range infos {
		// The database's clock and this process's agree on a pause this
		// long within a few milliseconds; the bound above is the TTL.
		if h := in.Holders[0].HeldFor; h < pause-20*time.Millisecond || h > dlock.DefaultTTL {
			t.Errorf("%s: HeldFor = %v, want about %v or more", in.Key, h, pause)
		}
	}
}

// List with a prefix PostgreSQL's text cannot hold (a NUL byte, invalid
// UTF-8) is refused up front with an error wrapping dlock.ErrInvalidKey.
// A huge prefix is simply no match.
// Symptom: such a prefix failed after a round trip with the server's "invalid byte sequence for encoding".
func TestList_RefusesPrefixTextCannotHold(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	for _, p := range []string{"a\x00", "\xff", "a\xc3"} {
		if _, err := l.List(dlocktest.Context(t), p); !errors.Is(err, dlock.ErrInvalidKey) {
			t.Errorf("List(%q) = %v, want ErrInvalidKey", p, err)
		}
	}
	if infos, err := l.List(dlocktest.Context(t), strings.Repeat("é", 1<<16)); err != nil || len(infos) != 0 {
		t.Errorf("List(huge prefix) = %v, %v", infos, err)
	}
}
