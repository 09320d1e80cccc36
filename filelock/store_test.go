package filelock_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

func TestTokenSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 3; i++ {
		l := mustNew(t, dir) // a fresh Locker each round, as after a restart
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatal(err)
		}
		if lk.Token() <= last {
			t.Fatalf("round %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	// Expire keeps the counter too.
	l := mustNew(t, dir)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Expire(key); err != nil {
		t.Fatal(err)
	}
	lk2, err := mustNew(t, dir).TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("key not free after Expire: %v", err)
	}
	if lk2.Token() <= lk.Token() || lk.Token() <= last {
		t.Fatalf("tokens %d, %d after %d", lk.Token(), lk2.Token(), last)
	}
	if err := lk2.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(dlocktest.Context(t)); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release after Expire = %v, want ErrLockLost", err)
	}
}

// recordPath is the documented location of key's lease record.
func recordPath(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".lease")
}

// flockPath is the file whose flock(2) serializes updates of key's record.
func flockPath(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".flock")
}

func TestCorruptRecordRefused(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t, dir)
	key := dlocktest.Key(t)
	if err := os.WriteFile(recordPath(dir, key), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := l.TryAcquire(dlocktest.Context(t), key)
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a corrupt record = %v, want a storage error", err)
	}
	if infos, err := l.List(dlocktest.Context(t), ""); err != nil || len(infos) != 0 {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	// Removing the record resets the key.
	if err := os.Remove(recordPath(dir, key)); err != nil {
		t.Fatal(err)
	}
	lk, err := l.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(dlocktest.Context(t))
}

func TestRecordLayout(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	l := mustNew(t, dir)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(recordPath(dir, key))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"key":"` + key + `","counter":` + strconv.FormatUint(lk.Token(), 10) + `}`
	if string(b) != want {
		t.Fatalf("released record = %s, want %s", b, want)
	}
	if _, err := os.Stat(recordPath(dir, key) + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp file left behind: %v", err)
	}
}
