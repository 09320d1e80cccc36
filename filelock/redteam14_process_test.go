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

// Markers a holder of the rt14mix helper keeps in the data directory while
// it holds: an exclusive holder of "rw" creates W (O_EXCL) and then finds
// no R.*; a shared holder creates its own R.* and then finds no W; a
// holder of a permit of "sem" (WithLimit(rt14Permits)) takes a free slot
// file S<i> (O_EXCL), and finding none free means one holder too many.
// The marker is created after the Acquire returned and removed before the
// Release, so two markers that meet mean two leases that overlapped.
const rt14Permits = 2

func rt14Violation(data, what string) error {
	_ = os.WriteFile(filepath.Join(data, "VIOLATION."+strconv.Itoa(os.Getpid())+"."+strconv.FormatInt(time.Now().UnixNano(), 10)), []byte(what), 0o600)
	return errors.New(what)
}

func rt14Excl(path string) bool {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

func rt14Hold(ctx context.Context, l *filelock.Locker, data string, g, i int) error {
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
			if !rt14Excl(w) {
				verr = rt14Violation(data, "two writers inside")
			} else {
				if m, _ := filepath.Glob(filepath.Join(data, "R.*")); len(m) > 0 {
					verr = rt14Violation(data, fmt.Sprintf("writer inside with readers %v", m))
				}
				time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				os.Remove(w)
			}
		} else {
			r := filepath.Join(data, "R."+mine)
			rt14Excl(r)
			if _, err := os.Stat(filepath.Join(data, "W")); err == nil {
				verr = rt14Violation(data, "reader inside with a writer")
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
		lk, err := l.Acquire(ctx, "sem", ttl, dlock.WithLimit(rt14Permits))
		if err != nil {
			return err
		}
		var verr error
		slot := ""
		for s := 0; s < rt14Permits; s++ {
			if p := filepath.Join(data, "S"+strconv.Itoa(s)); rt14Excl(p) {
				slot = p
				break
			}
		}
		if slot == "" {
			verr = rt14Violation(data, "more permit holders than permits")
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

func helperRT14Mix(ctx context.Context) error {
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
				if err := rt14Hold(ctx, ls[g%2], data, g, i); err != nil {
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
func TestRedTeam14_CrossProcessModesExclude(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, data := t.TempDir(), t.TempDir()
	var cmds []func() error
	var errbs []fmt.Stringer
	for p := 0; p < 3; p++ {
		cmd, _, errb := helper(ctx, t, envMode+"=rt14mix", envDir+"="+dir, envData+"="+data, envN+"=20")
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

// helperRT14Readers keeps the key envKey read-locked by overlapping
// readers (4 goroutines, each holding 40ms, waiting as long as it takes
// to get back in) until it is killed.
func helperRT14Readers(ctx context.Context) error {
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
func TestRedTeam14_CrossProcessReadersDoNotStarveWriter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, key := t.TempDir(), "rt14-rw"
	var outs []*lineWriter
	for p := 0; p < 2; p++ {
		cmd, out, _ := helper(ctx, t, envMode+"=rt14readers", envDir+"="+dir, envKey+"="+key)
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
