package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
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
	t.Parallel()
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
	dead := deadAddr(t)
	start := time.Now()
	if r := runDlock(t, "redis+cluster://"+dead, "run", "-n", "--connect-timeout", "2s", k1, "--", "echo", "ran"); r.code != exitBackend || !strings.Contains(r.stderr, dead) {
		t.Fatalf("a cluster that does not answer: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("a cluster that does not answer took %v", took)
	}
}

// startMTLSCluster starts a three-master Redis Cluster that serves clients
// and its bus over TLS only (tls-cluster yes), requiring client
// certificates of p's CA, and returns the nodes' TLS addresses. The
// plaintext ports serve the test's set-up commands.
func startMTLSCluster(t *testing.T, p pki) []string {
	t.Helper()
	const n, slots = 3, 16384
	nodes := make([]*testserver.Redis, n)
	tlsPorts := make([]int, n)
	for i := range nodes {
		port := testserver.FreePort(t)
		for tries := 0; port > 55000 && tries < 100; tries++ { // the bus port is port+10000
			port = testserver.FreePort(t)
		}
		tlsPorts[i] = port
		nodes[i] = testserver.StartRedis(t, testserver.WithArgs("--tls-port", strconv.Itoa(port),
			"--tls-cert-file", p.ServerCert, "--tls-key-file", p.ServerKey,
			"--tls-ca-cert-file", p.CA, "--tls-auth-clients", "yes", "--tls-cluster", "yes",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"),
			"--cluster-node-timeout", "5000"))
	}
	for i, nd := range nodes {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if _, err := nd.Do("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			t.Fatalf("cluster addslots: %v", err)
		}
	}
	for i := 1; i < n; i++ {
		if _, err := nodes[0].Do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(tlsPorts[i])); err != nil {
			t.Fatalf("cluster meet: %v", err)
		}
	}
	deadline := time.Now().Add(hang)
	for _, nd := range nodes {
		for {
			info, err := nd.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("TLS cluster did not converge: %s %v", info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	addrs := make([]string, n)
	for i, port := range tlsPorts {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	return addrs
}

// rediss+cluster:// speaks TLS with a client certificate to every node of
// a TLS-only Cluster; without the certificate it is a backend error.
func TestRedissClusterClientCertificate(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	addrs := startMTLSCluster(t, p)
	url := "rediss+cluster://" + strings.Join(addrs, ",") + "?" + p.tlsQuery()
	if r := runDlock(t, url, "run", "-n", "tls/cluster", "--", "sh", "-c", `echo "token=$DLOCK_TOKEN"`); r.code != 0 || !strings.Contains(r.stdout, "token=") {
		t.Fatalf("rediss+cluster://: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	holder, _, _ := background(t, url, "run", "tls/held", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, url, "ls"); r.code != 0 || !strings.Contains(r.stdout, "tls/held") || !strings.Contains(r.stdout, strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("ls on a TLS cluster: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	noCert := "rediss+cluster://" + strings.Join(addrs, ",") + "?ca=" + p.CA
	if r := runDlock(t, noCert, "run", "-n", "--connect-timeout", "6s", "tls/cluster", "--", "echo", "ran"); r.code != exitBackend || r.stdout != "" || !strings.Contains(r.stderr, "client certificate") {
		t.Fatalf("rediss+cluster:// without a client certificate: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runDlock(t, "redis+cluster://"+addrs[0], "run", "-n", "--connect-timeout", "6s", "tls/cluster", "--", "echo", "ran"); r.code != exitBackend || !strings.Contains(r.stderr, "use rediss+cluster://") {
		t.Fatalf("redis+cluster:// to TLS nodes: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}
