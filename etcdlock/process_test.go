package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// An etcd member in a child process can be paused (SIGSTOP): requests
// hang rather than fail, and are served again after Resume.
func TestProcessPauseResume(t *testing.T) {
	t.Parallel()
	p := etcdtest.StartProcess(t)
	c := newClient(t, []string{p.ClientURL()})
	if _, err := c.Put(dlocktest.Context(t), "k", "v1"); err != nil {
		t.Fatal(err)
	}
	get := func(ctx context.Context) (string, error) {
		resp, err := c.Get(ctx, "k")
		if err != nil {
			return "", err
		}
		if len(resp.Kvs) != 1 {
			return "", errors.New("key k not found")
		}
		return string(resp.Kvs[0].Value), nil
	}
	if v, err := get(dlocktest.Context(t)); err != nil || v != "v1" {
		t.Fatalf("Get = %q, %v", v, err)
	}

	p.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	v, err := get(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get from a paused member = %q, %v; want DeadlineExceeded", v, err)
	}

	p.Resume()
	if v, err := get(dlocktest.Context(t)); err != nil || v != "v1" {
		t.Fatalf("Get after Resume = %q, %v", v, err)
	}
	if _, err := c.Put(dlocktest.Context(t), "k", "v2"); err != nil {
		t.Fatal(err)
	}
	if v, err := get(dlocktest.Context(t)); err != nil || v != "v2" {
		t.Fatalf("Get after Put = %q, %v", v, err)
	}
}

// A killed member stays dead (Stop is idempotent, also at cleanup), and a
// paused one can be killed.
func TestProcessStopPaused(t *testing.T) {
	t.Parallel()
	p := etcdtest.StartProcess(t)
	c := newClient(t, []string{p.ClientURL()})
	if _, err := c.Put(dlocktest.Context(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	p.Pause()
	p.Stop()
	p.Stop()
	p.Resume() // no-op after Stop
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "k"); err == nil {
		t.Fatal("Get from a killed member succeeded")
	}
}
