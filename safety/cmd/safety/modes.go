package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// mayLackModes reports whether a backend's locker may refuse the shared
// and limited modes with dlock.ErrUnsupported: redislock on its Lua-free
// protocol (redis-tair) grants exclusive locks only. On every other
// backend each mode must work, and a refusal is the case's error.
func mayLackModes(base string) bool { return base == "redis-tair" }

// probeKey is the key the mode probe locks: not the workers' key.
const probeKey = "safety/probe"

// unsupportedMode returns why the workers of c cannot run ("" if they
// can): on a backend that may lack modes, the refusal (wrapping
// dlock.ErrUnsupported) of a probe acquisition in a worker's mode other
// than exclusive. Each worker's locker is probed with an exclusive lock
// first, which must be granted: the backend works, and its locker has
// chosen its protocol before it is asked for the mode. Any other failure
// of the probe is the case's error.
func unsupportedMode(t *tb, c caseSpec, specs []string) string {
	if !mayLackModes(c.base()) {
		return ""
	}
	for id, spec := range specs {
		mode, limit := c.workerMode(id)
		if mode == "exclusive" {
			continue
		}
		opts, err := modeOptions(mode, limit)
		if err != nil {
			t.Fatal(err)
		}
		l, closeLocker, err := openLocker(spec)
		if err != nil {
			t.Fatal(err)
		}
		err = acquireRelease(l)
		if err != nil {
			closeLocker()
			t.Fatalf("probe: an exclusive lock: %v", err)
		}
		err = acquireRelease(l, opts...)
		closeLocker()
		switch {
		case errors.Is(err, dlock.ErrUnsupported):
			return fmt.Sprintf("%s locks refused: %v", mode, err)
		case err != nil:
			t.Fatalf("probe: a %s lock: %v", mode, err)
		}
	}
	return ""
}

// acquireRelease takes the probe key without waiting and releases it.
func acquireRelease(l dlock.Locker, opts ...dlock.Option) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.TryAcquire(ctx, probeKey, opts...)
	if err != nil {
		return err
	}
	return lk.Release(ctx)
}
