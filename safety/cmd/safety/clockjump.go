package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/safety/clock"
)

// shimmedRedis is a redis-server whose wall clock the harness moves: the
// clock-jump fault (package clock's LD_PRELOAD shim; Redis expires keys
// by its wall clock).
type shimmedRedis struct {
	addr   string
	offset *clock.Offset
}

func startShimmedRedis(t *tb) *shimmedRedis {
	bin := testserver.Binary(t, "redis-server")
	dir := t.TempDir()
	so, err := clock.Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	off, err := clock.NewOffset(filepath.Join(dir, "offset"))
	if err != nil {
		t.Fatal(err)
	}
	port := testserver.FreePort(t)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Env = append(os.Environ(), clock.Env(so, off.Path())...)
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); off.Close() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("shimmed redis-server on %s did not start: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &shimmedRedis{addr: addr, offset: off}
}
