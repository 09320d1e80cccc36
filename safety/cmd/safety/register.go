package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/safety/history"
)

// register is the protected resource: a counter in a directory of its
// own (a store separate from the lock service, which the faults never
// touch). Its two copies are updated by every worker iteration:
//   - fenced: behind a filelock.Guard, which refuses a stale token;
//   - unfenced: the negative control, with no token check, as a
//     resource behind a plain lock is.
//
// Each copy appends every write it applies to its own log (OpAccept), in
// the order it applies them (under the copy's flock), so the checker sees
// the register's true order. Reads are logged by the workers.
type register struct {
	dir    string
	guard  *filelock.Guard
	fenced *history.Writer
	plain  *history.Writer
	worker int
}

const resource = "register"

func openRegister(dir string, worker int) (*register, error) {
	g, err := filelock.NewGuard(filepath.Join(dir, "guard"))
	if err != nil {
		return nil, err
	}
	f, err := history.Create(filepath.Join(dir, "fenced.log"))
	if err != nil {
		return nil, err
	}
	p, err := history.Create(filepath.Join(dir, "unfenced.log"))
	if err != nil {
		return nil, err
	}
	return &register{dir: dir, guard: g, fenced: f, plain: p, worker: worker}, nil
}

// readFenced reads the fenced copy at fence f (a fenced read: it records
// f, so an older holder's later write is refused).
func (r *register) readFenced(ctx context.Context, key string, f dlock.Fence) (int64, error) {
	var v int64
	err := r.guard.Do(ctx, resource, f, func(context.Context) error {
		var err error
		v, err = readValue(filepath.Join(r.dir, "fenced.value"))
		return err
	})
	return v, err
}

// writeFenced sets the fenced copy to v if f is admitted.
func (r *register) writeFenced(ctx context.Context, key string, f dlock.Fence, v int64) error {
	return r.guard.Do(ctx, resource, f, func(context.Context) error {
		if err := writeValue(filepath.Join(r.dir, "fenced.value"), v); err != nil {
			return err
		}
		return r.fenced.Write(history.Event{Worker: r.worker, Key: key, Op: history.OpAccept, Register: history.Fenced, Token: f.Token, Value: v, Result: history.OK, T0: history.Now()})
	})
}

// readPlain and writePlain are the unfenced copy: serialized by a flock,
// never refused.
func (r *register) readPlain() (int64, error) {
	var v int64
	err := r.withFlock(func() error {
		var err error
		v, err = readValue(filepath.Join(r.dir, "unfenced.value"))
		return err
	})
	return v, err
}

func (r *register) writePlain(key string, token uint64, v int64) error {
	return r.withFlock(func() error {
		if err := writeValue(filepath.Join(r.dir, "unfenced.value"), v); err != nil {
			return err
		}
		return r.plain.Write(history.Event{Worker: r.worker, Key: key, Op: history.OpAccept, Register: history.Unfenced, Token: token, Value: v, Result: history.OK, T0: history.Now()})
	})
}

func (r *register) withFlock(fn func() error) error {
	f, err := os.OpenFile(filepath.Join(r.dir, "unfenced.flock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return fn()
}

func readValue(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("register %s: %w", path, err)
	}
	return v, nil
}

// writeValue replaces the value atomically (a crash leaves the old or the
// new value, never a torn one).
func writeValue(path string, v int64) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(v, 10)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
