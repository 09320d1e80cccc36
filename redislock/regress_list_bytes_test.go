package redislock_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// List matches prefix byte for byte, like every Lister (memlock uses
// strings.HasPrefix): a prefix ending inside a multi-byte character (not
// valid UTF-8 on its own) still lists the keys it starts. The SCAN
// pattern was built rune by rune, which turned each invalid byte into
// U+FFFD and matched nothing. (Red-team reproducer.)
func TestRegressListPrefixBytes(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	ctx := dlocktest.Context(t)
	key := "é" + dlocktest.Key(t) // "\xc3\xa9..."
	lk, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	for _, prefix := range []string{"\xc3", "é"} {
		infos, err := l.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Key != key {
			t.Errorf("List(%q) = %+v, want only %q", prefix, infos, key)
		}
	}
}
