package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// keysOnTwoMasters returns two lock keys whose slots belong to different
// masters of the cluster at addrs.
func keysOnTwoMasters(t *testing.T, opt *redis.ClusterOptions) (string, string) {
	t.Helper()
	c := redis.NewClusterClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	l := redislock.New(c)
	first, firstMaster := "", ""
	for i := range 1000 {
		key := fmt.Sprintf("cluster/job%d", i)
		m, err := c.MasterForKey(ctx, l.LockKey(key))
		if err != nil {
			t.Fatal(err)
		}
		switch addr := m.Options().Addr; {
		case first == "":
			first, firstMaster = key, addr
		case addr != firstMaster:
			return first, key
		}
	}
	t.Fatal("no two keys on different masters in 1000")
	return "", ""
}

// redis+cluster:// runs and lists locks on a Redis Cluster: the holders of
// keys on different masters all show in ls, and a held key conflicts.
func TestRedisClusterURL(t *testing.T) {
	var addrs []string
	for _, n := range testserver.StartRedisCluster(t, 3) {
		addrs = append(addrs, n.Addr())
	}
	url := "redis+cluster://" + strings.Join(addrs, ",")
	k1, k2 := keysOnTwoMasters(t, &redis.ClusterOptions{Addrs: addrs})

	var last uint64
	for range 2 {
		r := runDlock(t, url, "run", "-n", k1, "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
		if r.code != 0 || err != nil || tok <= last {
			t.Fatalf("run on a cluster: exit %d %q %q", r.code, r.stdout, r.stderr)
		}
		last = tok
	}
	h1, _, _ := background(t, url, "run", k1, "--", "sh", "-c", "echo started; exec sleep 60")
	// One node is enough to find the others.
	h2, _, _ := background(t, "redis+cluster://"+addrs[2], "run", k2, "--", "sh", "-c", "echo started; exec sleep 60")
	r := runDlock(t, url, "ls", "cluster/")
	for _, want := range []string{k1, k2, strconv.Itoa(h1.Process.Pid), strconv.Itoa(h2.Process.Pid)} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("ls on a cluster lacks %q: exit %d %q %q", want, r.code, r.stdout, r.stderr)
		}
	}
	if r := runDlock(t, url, "run", "-n", k2, "--", "echo", "ran"); r.code != exitConflict || r.stdout != "" {
		t.Fatalf("a held key on a cluster: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// No node answers: a backend error, within the connect timeout.
	dead := net.JoinHostPort("127.0.0.1", strconv.Itoa(testserver.FreePort(t)))
	start := time.Now()
	if r := runDlock(t, "redis+cluster://"+dead, "run", "-n", "--connect-timeout", "2s", k1, "--", "echo", "ran"); r.code != exitBackend || !strings.Contains(r.stderr, dead) {
		t.Fatalf("a cluster that does not answer: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("a cluster that does not answer took %v", took)
	}
}
