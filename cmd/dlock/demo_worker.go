package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/filelock"
)

// cmdDemoWorker is one worker process of `dlock demo`. The lock URL comes
// from $DLOCK_URL.
func cmdDemoWorker(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "demo worker: missing mode")
		return exitUsage
	}
	mode := args[0]
	fs := flag.NewFlagSet(demoWorkerCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "counter file")
	n := fs.Int("n", 1, "increments")
	key := fs.String("key", "", "lock key (counter: empty means no lock)")
	guardDir := fs.String("guard", "", "fencing guard directory")
	fenced := fs.String("fenced", "", "balance file written through the guard")
	unfenced := fs.String("unfenced", "", "balance file written directly")
	amount := fs.Int("amount", 0, "amount to withdraw or deposit")
	ttl := fs.Duration("ttl", 10*time.Second, "lease")
	gate := fs.Bool("gate", false, "wait for stdin to close before starting")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var locker dlock.Locker
	obs := workerObserver() // the demo's metrics, nil when run by hand
	if *key != "" {
		raw := os.Getenv("DLOCK_URL")
		stderr = &scrubWriter{w: stderr, secrets: secretsOf(raw)}
		b, err := openBackend(raw, openOptions{})
		if err != nil {
			return reportOpen(stderr, "demo worker", err)
		}
		defer b.close()
		locker = b.locker
	}
	w := &worker{ctx: ctx, out: stdout, obs: obs, locker: locker, key: *key, ttl: *ttl, fenced: *fenced, unfenced: *unfenced, amount: *amount}
	var err error
	switch mode {
	case "counter":
		if *gate {
			_, _ = io.Copy(io.Discard, os.Stdin)
		}
		err = w.counter(*file, *n)
	case "withdraw", "deposit":
		if locker == nil {
			return exitUsage
		}
		if w.guard, err = filelock.NewGuard(*guardDir, dlock.WithObserver(obs)); err != nil {
			break
		}
		if mode == "withdraw" {
			err = w.withdraw()
		} else {
			err = w.deposit()
		}
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo worker %s: %v\n", mode, err)
		return exitBackend
	}
	return 0
}

type worker struct {
	ctx      context.Context
	out      io.Writer
	obs      dlock.Observer // the demo's metrics (nil: none)
	locker   dlock.Locker
	guard    *filelock.Guard
	key      string
	ttl      time.Duration
	fenced   string
	unfenced string
	amount   int
}

const account = "demo/account"

func (w *worker) counter(file string, n int) error {
	inc := func() error {
		v, err := readInt(file)
		if err != nil {
			return err
		}
		time.Sleep(time.Millisecond) // think: the race window
		return writeInt(file, v+1)
	}
	for i := 0; i < n; i++ {
		var err error
		if w.locker == nil {
			err = inc()
		} else {
			err = w.tryThenWait(inc)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// opts are the options of the worker's acquisitions: the lease, and the
// demo's metrics, which observe the call and the Lock it returns.
func (w *worker) opts(ttl time.Duration) []dlock.Option {
	return []dlock.Option{dlock.WithTTL(ttl), dlock.WithCallObserver(w.obs)}
}

// tryThenWait runs fn under the lock: it tries the lock first and, when
// that fails (held by another worker: a "contended" acquisition in the
// metrics), waits for it.
func (w *worker) tryThenWait(fn func() error) error {
	lk, err := w.locker.TryAcquire(w.ctx, w.key, w.opts(w.ttl)...)
	if err != nil {
		if lk, err = w.locker.Acquire(w.ctx, w.key, w.opts(w.ttl)...); err != nil {
			return err
		}
	}
	return errors.Join(fn(), lk.Release(w.ctx))
}

// fencedUpdate applies delta to the fenced balance through the guard: a
// fenced read-modify-write.
func (w *worker) fencedUpdate(lk *dlock.Lock, delta int) (before, after int, err error) {
	err = w.guard.Do(w.ctx, account, lk.Fence(), func(context.Context) error {
		if before, err = readInt(w.fenced); err != nil {
			return err
		}
		after = before + delta
		return writeInt(w.fenced, after)
	})
	return before, after, err
}

func (w *worker) deposit() error {
	lk, err := w.locker.Acquire(w.ctx, w.key, w.opts(w.ttl)...)
	if err != nil {
		return err
	}
	defer lk.Release(w.ctx)
	fmt.Fprintf(w.out, "acquired the lock once A's lease expired: token %d\n", lk.Token())
	before, after, err := w.fencedUpdate(lk, w.amount)
	if err != nil {
		return err
	}
	ub, err := readInt(w.unfenced)
	if err != nil {
		return err
	}
	if err := writeInt(w.unfenced, ub+w.amount); err != nil {
		return err
	}
	fmt.Fprintf(w.out, "deposited %d: balance %d -> %d (both copies), released the lock\n", w.amount, before, after)
	return nil
}

func (w *worker) withdraw() error {
	lk, err := w.locker.Acquire(w.ctx, w.key, w.opts(w.ttl)...)
	if err != nil {
		return err
	}
	defer lk.Release(w.ctx)
	// Read both copies (the fenced read registers A's token at the guard).
	var seen int
	if err := w.guard.Do(w.ctx, account, lk.Fence(), func(context.Context) error {
		seen, err = readInt(w.fenced)
		return err
	}); err != nil {
		return err
	}
	useen, err := readInt(w.unfenced)
	if err != nil {
		return err
	}
	fmt.Fprintf(w.out, "holds the lock with token %d (lease %s, Err() = %v), read balance %d, will write %d\n", lk.Token(), lk.TTL().Round(time.Millisecond), lk.Err(), seen, seen-w.amount)
	// Wait for the demo to pause and resume us.
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	if err := writeInt(w.unfenced, useen-w.amount); err != nil {
		return err
	}
	fmt.Fprintf(w.out, "unfenced write of %d: ACCEPTED (nothing checks the token)\n", useen-w.amount)
	err = w.guard.Do(w.ctx, account, lk.Fence(), func(context.Context) error {
		return writeInt(w.fenced, seen-w.amount)
	})
	if !errors.Is(err, dlock.ErrStaleToken) {
		return fmt.Errorf("fenced stale write was not rejected: %v", err)
	}
	fmt.Fprintf(w.out, "fenced write of %d: REJECTED by the guard: %v\n", seen-w.amount, err)
	select {
	case <-lk.Lost():
		fmt.Fprintf(w.out, "its lock handle agrees: %v\n", lk.Err())
	case <-time.After(5 * time.Second):
	}
	// Do it right: take the lock again and redo the read-modify-write.
	lk2, err := w.acquireAfterPause()
	if err != nil {
		return err
	}
	before, after, err := w.fencedUpdate(lk2, -w.amount)
	if err == nil {
		fmt.Fprintf(w.out, "retried under a new lock, token %d: balance %d -> %d\n", lk2.Token(), before, after)
	}
	return errors.Join(err, lk2.Release(w.ctx))
}

// acquireAfterPause takes the lock for a worker that was just paused. Its
// client was paused too and may still be reconnecting (a ZooKeeper client
// whose session expired meanwhile replaces it, and its requests fail until
// then): acquiring is tried again for a few seconds. Nothing was done
// under a failed attempt, so trying again is safe.
func (w *worker) acquireAfterPause() (*dlock.Lock, error) {
	for attempt := 1; ; attempt++ {
		lk, err := w.locker.Acquire(w.ctx, w.key, w.opts(10*time.Second)...)
		if err == nil || attempt == 10 || w.ctx.Err() != nil {
			return lk, err
		}
		select {
		case <-time.After(500 * time.Millisecond):
		case <-w.ctx.Done():
		}
	}
}
