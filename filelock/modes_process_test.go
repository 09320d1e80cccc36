package filelock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
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

// Markers a holder of the "mix" helper keeps in the data directory while
// it holds: an exclusive holder of "rw" creates W (O_EXCL) and then finds
// no R.*; a shared holder creates its own R.* and then finds no W; a
// holder of a permit of "sem" (WithLimit(mixPermits)) takes a free slot
// file S<i> (O_EXCL), and finding none free means one holder too many.
// The marker is created after the Acquire returned and removed before the
// Release, so two markers that meet mean two leases that overlapped.
const mixPermits = 2

func reportViolation(data, what string) error {
	_ = os.WriteFile(filepath.Join(data, "VIOLATION."+strconv.Itoa(os.Getpid())+"."+strconv.FormatInt(time.Now().UnixNano(), 10)), []byte(what), 0o600)
	return errors.New(what)
}

func createExcl(path string) bool {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

func holdOnceAndCheck(ctx context.Context, l *filelock.Locker, data string, g, i int) error {
	pick := rand.IntN(3)
	ttl := dlock.WithTTL(2 * time.Second)
	mine := fmt.Sprintf("%d.%d.%d", os.Getpid(), g, i)
	switch pick {
	case 0, 1: // exclusive or shared on "rw"
		var lk *dlock.Lock
		var err error
		if pick == 0 {
			lk, err = l.Acquire(ctx, "rw", ttl)
		} else {
			lk, err = l.Acquire(ctx, "rw", ttl, dlock.WithShared())
		}
		if err != nil {
			return err
		}
		var verr error
		if pick == 0 {
			w := filepath.Join(data, "W")
			if !createExcl(w) {
				verr = reportViolation(data, "two writers inside")
			} else {
				if m, _ := filepath.Glob(filepath.Join(data, "R.*")); len(m) > 0 {
					verr = reportViolation(data, fmt.Sprintf("writer inside with readers %v", m))
				}
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				os.Remove(w)
			}
		} else {
			r := filepath.Join(data, "R."+mine)
			createExcl(r)
			if _, err := os.Stat(filepath.Join(data, "W")); err == nil {
				verr = reportViolation(data, "reader inside with a writer")
			}
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			os.Remove(r)
		}
		if lost := lk.Err(); lost != nil && verr != nil {
			verr = nil // lost meanwhile: no promise broken (should not happen with a 2s TTL)
		}
		if err := lk.Release(context.Background()); err != nil && verr == nil {
			verr = err
		}
		return verr
	default: // a permit of "sem"
		lk, err := l.Acquire(ctx, "sem", ttl, dlock.WithLimit(mixPermits))
		if err != nil {
			return err
		}
		var verr error
		slot := ""
		for s := 0; s < mixPermits; s++ {
			if p := filepath.Join(data, "S"+strconv.Itoa(s)); createExcl(p) {
				slot = p
				break
			}
		}
		if slot == "" {
			verr = reportViolation(data, "more permit holders than permits")
		} else {
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			os.Remove(slot)
		}
		if err := lk.Release(context.Background()); err != nil && verr == nil {
			verr = err
		}
		return verr
	}
}

func helperModesMix(ctx context.Context) error {
	dir, data := os.Getenv(envDir), os.Getenv(envData)
	n, err := strconv.Atoi(os.Getenv(envN))
	if err != nil {
		return err
	}
	// Two Lockers in the process, as two components would have.
	var ls [2]*filelock.Locker
	for i := range ls {
		if ls[i], err = filelock.New(dir, filelock.WithPollInterval(20*time.Millisecond)); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				if err := holdOnceAndCheck(ctx, ls[g%2], data, g, i); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// Several processes (and goroutines and Lockers in each) mix exclusive,
// shared and limited acquisitions with short holds: never two writers, a
// writer with a reader, or more permit holders than permits.
func TestCrossProcessModes_NeverOverlap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, data := t.TempDir(), t.TempDir()
	var cmds []func() error
	var errbs []fmt.Stringer
	for p := 0; p < 3; p++ {
		cmd, _, errb := helper(ctx, t, envMode+"=mix", envDir+"="+dir, envData+"="+data, envN+"=20")
		cmds = append(cmds, cmd.Wait)
		errbs = append(errbs, errb)
	}
	for i, wait := range cmds {
		if err := wait(); err != nil {
			t.Errorf("child %d: %v\n%s", i, err, errbs[i])
		}
	}
	if v, _ := filepath.Glob(filepath.Join(data, "VIOLATION.*")); len(v) > 0 {
		for _, f := range v {
			b, _ := os.ReadFile(f)
			t.Errorf("%s: %s", filepath.Base(f), b)
		}
	}
}

// helperOverlappingReaders keeps the key envKey read-locked by overlapping
// readers (4 goroutines, each holding 40ms, waiting as long as it takes
// to get back in) until it is killed.
func helperOverlappingReaders(ctx context.Context) error {
	l, err := filelock.New(os.Getenv(envDir))
	if err != nil {
		return err
	}
	key := os.Getenv(envKey)
	for g := 0; g < 4; g++ {
		go func() {
			time.Sleep(time.Duration(g) * 10 * time.Millisecond)
			for {
				lk, err := l.Acquire(ctx, key, dlock.WithShared(), dlock.WithTTL(time.Second))
				if err != nil {
					continue
				}
				fmt.Printf("read %d\n", lk.Token())
				time.Sleep(40 * time.Millisecond)
				lk.Release(context.Background())
			}
		}()
	}
	<-ctx.Done()
	return nil
}

// Readers of other processes that overlap without a gap cannot starve a
// writer: once it waits, their new read locks are refused, the key drains
// and the writer gets it, with a token above every read lock granted
// before it.
func TestCrossProcessReaders_DoNotStarveWriter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, key := t.TempDir(), "readers-writer"
	var outs []*lineWriter
	for p := 0; p < 2; p++ {
		cmd, out, _ := helper(ctx, t, envMode+"=readers", envDir+"="+dir, envKey+"="+key)
		defer func() {
			cmd.Process.Kill()
			cmd.Wait()
		}()
		outs = append(outs, out)
	}
	l := mustNew(t, dir)
	waitUntil(t, "readers in", func() bool {
		infos, _ := l.List(ctx, key)
		return len(infos) == 1 && infos[0].Mode == dlock.Shared && len(infos[0].Holders) >= 2
	})
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	w, err := l.Acquire(wctx, key, dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatalf("writer starved by overlapping readers: %v", err)
	}
	// Every read lock granted before the writer's (printed by now, or
	// still being printed: only the ones with a lower token can precede).
	infos, _ := l.List(ctx, key)
	if len(infos) != 1 || infos[0].Mode != dlock.Exclusive || len(infos[0].Holders) != 1 || infos[0].Holders[0].Token != w.Token() {
		t.Errorf("List while the writer holds = %+v", infos)
	}
	time.Sleep(100 * time.Millisecond) // readers waiting now print nothing until the writer leaves
	for _, out := range outs {
		for {
			select {
			case line := <-out.lines:
				var tok uint64
				if _, err := fmt.Sscanf(line, "read %d", &tok); err == nil && tok > w.Token() {
					t.Errorf("read lock %d granted while the writer (token %d) held", tok, w.Token())
				}
				continue
			default:
			}
			break
		}
	}
	mustRelease(t, w)
}
