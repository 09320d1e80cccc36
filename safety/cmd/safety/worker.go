package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/safety/history"
)

// worker is one client process: it loops acquire -> fenced read ->
// think -> fenced write -> release on one key until its time is up,
// logging every step. In mode shared (a reader: dlock.WithShared) it
// reads and does not write; in mode limited (a semaphore permit:
// dlock.WithLimit) it only acquires, thinks and releases. It never checks its lock between the read and the
// write (a check there is what a GC pause or a stalled VM defeats), so a
// pause lands exactly where locks alone fail.
//
// A pause request (the file pauseRequest(dir, id)) asks it to stop itself
// (SIGSTOP) at its next think step, while it believes it holds the lock:
// it takes the request by renaming the file, so that the orchestrator can
// withdraw a request the worker has not taken (see pauseInCriticalSection),
// and the orchestrator resumes it (SIGCONT) after the pause it chose.
func runWorker(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	id := fs.Int("id", 0, "worker id")
	dir := fs.String("dir", "", "run directory (register, logs)")
	spec := fs.String("backend", "", "backend spec (see openLocker)")
	key := fs.String("key", "safety/register", "lock key")
	ttl := fs.Duration("ttl", time.Second, "lock TTL")
	think := fs.Duration("think", 5*time.Millisecond, "time between the read and the write")
	dur := fs.Duration("duration", 10*time.Second, "how long to run")
	seed := fs.Uint64("seed", 1, "random seed")
	mode := fs.String("mode", "exclusive", "lock mode: exclusive (reads and writes the registers), shared (a reader: reads them) or limited (a semaphore permit: touches neither)")
	limit := fs.Int("limit", 0, "the semaphore's permits (mode limited)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	modeOpts, err := modeOptions(*mode, *limit)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker %d: %v\n", *id, err)
		return 2
	}
	opts := append([]dlock.Option{dlock.WithTTL(*ttl), dlock.WithWait(2 * *ttl)}, modeOpts...)
	shared, lim := *mode != "exclusive", 0
	if *mode == "limited" {
		lim = *limit
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "worker %d: %v\n", *id, err)
		return 1
	}
	log, err := history.Create(filepath.Join(*dir, fmt.Sprintf("worker-%d.log", *id)))
	if err != nil {
		return fail(err)
	}
	defer log.Close()
	reg, err := openRegister(*dir, *id)
	if err != nil {
		return fail(err)
	}
	locker, closeLocker, err := openLocker(*spec)
	if err != nil {
		return fail(err)
	}
	defer closeLocker()

	pauseReq := pauseRequest(*dir, *id)
	rng := rand.New(rand.NewPCG(*seed, uint64(*id)))
	ev := func(e history.Event) {
		e.Worker, e.Key = *id, *key
		log.Write(e)
	}
	end := time.Now().Add(*dur)
	for time.Now().Before(end) {
		ctx, cancel := context.WithDeadline(context.Background(), end)
		t0 := history.Now()
		lk, err := locker.Acquire(ctx, *key, opts...)
		t1 := history.Now()
		if err != nil {
			res := history.Failed
			if !errors.Is(err, dlock.ErrNotAcquired) {
				res = history.Unknown
			}
			ev(history.Event{Op: history.OpAcquire, Result: res, T0: t0, T1: t1, Err: err.Error(), Shared: shared, Limit: lim})
			cancel()
			time.Sleep(time.Duration(rng.Int64N(int64(5 * time.Millisecond))))
			continue
		}
		f := lk.Fence()
		ev(history.Event{Op: history.OpAcquire, Result: history.OK, Token: f.Token, T0: t0, T1: t1, Shared: shared, Limit: lim})
		watched := make(chan struct{})
		go func(acquired int64) {
			defer close(watched)
			<-lk.Lost()
			if err := lk.Err(); errors.Is(err, dlock.ErrLockLost) {
				ev(history.Event{Op: history.OpLost, Token: f.Token, T0: acquired, T1: history.Now(), Err: err.Error()})
			}
		}(t1)
		// Fenced and unfenced reads (a semaphore permit touches neither
		// register: its holders overlap by design, up to the limit, and
		// no fence orders them).
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		var fv, uv int64
		ferr, uerr := errSkipped, errSkipped
		if *mode != "limited" {
			t0 = history.Now()
			fv, ferr = reg.readFenced(rctx, *key, f)
			e := opEvent(history.OpRead, history.Fenced, f.Token, fv, t0, ferr)
			e.Shared = f.Shared
			ev(e)
			t0 = history.Now()
			uv, uerr = reg.readPlain()
			ev(opEvent(history.OpRead, history.Unfenced, f.Token, uv, t0, uerr))
		}
		if *mode != "exclusive" { // readers and permits do not write
			ferr, uerr = errSkipped, errSkipped
		}
		// Think: the window where a pause bites.
		if os.Rename(pauseReq, pauseReq+".taken") == nil {
			testserver.StopSelf() // thread-directed: nothing below runs first
		}
		time.Sleep(*think)
		if ferr == nil {
			t0 = history.Now()
			err := reg.writeFenced(rctx, *key, f, fv+1)
			ev(opEvent(history.OpWrite, history.Fenced, f.Token, fv+1, t0, err))
		}
		if uerr == nil {
			t0 = history.Now()
			err := reg.writePlain(*key, f.Token, uv+1)
			ev(opEvent(history.OpWrite, history.Unfenced, f.Token, uv+1, t0, err))
		}
		rcancel()
		t0 = history.Now()
		err = lk.Release(context.Background())
		res := history.OK
		if err != nil {
			res = history.Failed
		}
		e := history.Event{Op: history.OpRelease, Token: f.Token, Result: res, T0: t0, T1: history.Now()}
		if err != nil {
			e.Err = err.Error()
		}
		ev(e)
		<-watched
		cancel()
	}
	return 0
}

// modeOptions are the lock options of a worker mode (its -mode flag):
// none for exclusive, dlock.WithShared for shared, dlock.WithLimit(limit)
// for limited.
func modeOptions(mode string, limit int) ([]dlock.Option, error) {
	switch mode {
	case "exclusive":
		return nil, nil
	case "shared":
		return []dlock.Option{dlock.WithShared()}, nil
	case "limited":
		return []dlock.Option{dlock.WithLimit(limit)}, nil
	}
	return nil, fmt.Errorf("unknown mode %q", mode)
}

// errSkipped marks a register operation the worker's mode does not do.
var errSkipped = errors.New("skipped")

// opEvent is the worker's record of a register operation.
func opEvent(op history.Op, reg string, token uint64, v int64, t0 int64, err error) history.Event {
	e := history.Event{Op: op, Register: reg, Token: token, Value: v, Result: history.OK, T0: t0, T1: history.Now()}
	switch {
	case err == nil:
	case errors.Is(err, dlock.ErrStaleToken):
		e.Result, e.Err = history.Rejected, err.Error()
	default:
		e.Result, e.Err = history.Unknown, err.Error()
	}
	return e
}

// pauseRequest is the file through which the orchestrator asks worker id
// to stop itself in its critical section.
func pauseRequest(dir string, id int) string {
	return filepath.Join(dir, fmt.Sprintf("pause-%d", id))
}
