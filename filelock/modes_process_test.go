package filelock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// A reader process killed while it holds (and renews) a read lock keeps a
// writer out only until its own lease expires, at most one TTL after its
// death, whether or not other readers keep renewing theirs.
func TestKilledReaderDoesNotBlockWriter(t *testing.T) {
	const ttl = time.Second
	for _, withLiveReader := range []bool{false, true} {
		t.Run(fmt.Sprintf("live-reader=%v", withLiveReader), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hang)
			defer cancel()
			dir, key := t.TempDir(), "rw"
			cmd, out, errb := helper(ctx, t, envMode+"=hold", envDir+"="+dir, envKey+"="+key, envTTL+"="+ttl.String(), envHold+"=renew", envMode2+"=shared")
			defer func() {
				cmd.Process.Kill()
				cmd.Wait()
			}()
			var (
				tok   uint64
				owner string
			)
			select {
			case line := <-out.lines:
				if _, err := fmt.Sscanf(line, "held %d %s", &tok, &owner); err != nil {
					t.Fatalf("child printed %q", line)
				}
			case <-ctx.Done():
				t.Fatalf("hang: child did not acquire\n%s", errb)
			}
			l := mustNew(t, dir)
			var mine *dlock.Lock
			if withLiveReader {
				var err error
				if mine, err = tryShared(l, key, dlock.WithTTL(ttl)); err != nil {
					t.Fatalf("reader beside the child's: %v", err)
				}
				defer mine.Release(context.Background())
			}
			infos, err := l.List(ctx, key)
			if err != nil || len(infos) != 1 || infos[0].Mode != dlock.Shared || infos[0].Holders[0].Owner != owner || infos[0].Holders[0].Metadata[dlock.MetaPID] != strconv.Itoa(cmd.Process.Pid) {
				t.Fatalf("List = %+v, %v; want the child's read lock first", infos, err)
			}
			got := make(chan *dlock.Lock, 1)
			errc := make(chan error, 1)
			go func() {
				lk, err := mustNew(t, dir).Acquire(ctx, key, dlock.WithTTL(ttl))
				if err != nil {
					errc <- err
					return
				}
				got <- lk
			}()
			waitWriterRegistered(t, dir, key, 1)
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			killed := time.Now().UnixNano()
			// The dead reader's lease, as recorded, ends within a TTL of
			// its death.
			var childExpires int64
			for _, h := range readFileRecord(t, dir, key).Holders {
				if h.Owner == owner {
					childExpires = h.Expires
				}
			}
			if childExpires == 0 || childExpires > killed+int64(ttl) {
				t.Fatalf("dead reader's lease ends at %d, more than %v after its death at %d", childExpires, ttl, killed)
			}
			if withLiveReader {
				// The other reader keeps renewing; the dead one's lease
				// leaves on its own.
				waitUntil(t, "dead reader's lease still listed", func() bool {
					infos, err := l.List(ctx, key)
					return err == nil && len(infos) == 1 && len(infos[0].Holders) == 1 && infos[0].Holders[0].Owner == mine.Owner()
				})
				select {
				case lk := <-got:
					t.Fatalf("writer granted (token %d) while a reader holds", lk.Token())
				default:
				}
				if err := mine.Refresh(ctx); err != nil {
					t.Fatal(err)
				}
				mustRelease(t, mine)
			}
			var w *dlock.Lock
			select {
			case w = <-got:
			case err := <-errc:
				t.Fatalf("writer: %v", err)
			case <-ctx.Done():
				t.Fatal("hang: writer never got the key of a dead reader")
			}
			defer w.Release(context.Background())
			if now := time.Now().UnixNano(); now < childExpires {
				t.Fatalf("writer granted %v before the dead reader's lease ended", time.Duration(childExpires-now))
			}
			if w.Token() <= tok || (mine != nil && w.Token() <= mine.Token()) {
				t.Fatalf("writer token %d not above the readers'", w.Token())
			}
		})
	}
}

// A writer process killed while it waits (registered, keeping new readers
// out) stops keeping them out at most one TTL after its last attempt.
func TestKilledWaitingWriterDoesNotBlockReaders(t *testing.T) {
	const ttl = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	dir, key := t.TempDir(), "rw"
	l := mustNew(t, dir)
	r, err := tryShared(l, key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, r)
	cmd, out, errb := helper(ctx, t, envMode+"=wait", envDir+"="+dir, envKey+"="+key, envTTL+"="+ttl.String())
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	waitWriterRegistered(t, dir, key, 1)
	_, err = tryShared(l, key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("reader while a writer process waits: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := time.Now().UnixNano()
	select {
	case line := <-out.lines:
		t.Fatalf("the waiting writer got the key while a reader held it: %q\n%s", line, errb)
	default:
	}
	rec := readFileRecord(t, dir, key)
	if len(rec.Writers) != 1 {
		t.Fatalf("record after the writer died: %+v", rec)
	}
	lapse := rec.Writers[0].Expires
	if lapse > killed+int64(ttl) {
		t.Fatalf("dead writer's registration lapses at %d, more than %v after its death at %d", lapse, ttl, killed)
	}
	// A blocking reader gets in once the registration lapsed, though
	// nobody writes the record then.
	r2, err := l.Acquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatalf("hang: reader kept out by a dead writer: %v", err)
	}
	defer mustRelease(t, r2)
	if now := time.Now().UnixNano(); now < lapse {
		t.Fatalf("reader admitted %v before the dead writer's registration lapsed", time.Duration(lapse-now))
	}
	rec = readFileRecord(t, dir, key)
	if len(rec.Holders) != 2 {
		t.Fatalf("record after the reader's grant: %+v, want 2 readers", rec)
	}
	for _, w := range rec.Writers { // a lapsed one stays until the file's next write
		if w.Expires > time.Now().UnixNano() {
			t.Fatalf("live registration %+v after the writer died", w)
		}
	}
}
