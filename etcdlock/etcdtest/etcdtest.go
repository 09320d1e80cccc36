// Package etcdtest runs real etcd servers in-process (go.etcd.io/etcd/
// server/v3/embed) on free loopback ports for tests: one member or a
// cluster, data in the test's temporary directory, stopped at cleanup.
package etcdtest

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/rafthttp"

	"github.com/dlock-go/dlock/internal/testserver"
)

// StartTimeout bounds how long a cluster may take to become ready.
const StartTimeout = 60 * time.Second

// Member is one running etcd member.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	Etcd      *embed.Etcd
	stopped   bool
}

// Stop closes the member (idempotent): its peers see it as dead.
func (m *Member) Stop() {
	if !m.stopped {
		m.stopped = true
		m.Etcd.Close()
	}
}

// Cluster is a set of members.
type Cluster struct {
	Members []*Member
}

// Endpoints are the client URLs of the running members.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		if !m.stopped {
			eps = append(eps, m.ClientURL)
		}
	}
	return eps
}

// Leader returns the member that currently leads, or nil.
func (c *Cluster) Leader() *Member {
	for _, m := range c.Members {
		if !m.stopped && m.Etcd.Server.Leader() == m.Etcd.Server.MemberID() {
			return m
		}
	}
	return nil
}

// NewConfig returns an embed config for one member named name that listens
// on loopback client and peer URLs, logs only errors and keeps its data in
// dir (the log too). Callers set InitialCluster for clusters.
func NewConfig(name, dir, clientURL, peerURL string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cu, _ := url.Parse(clientURL)
	pu, _ := url.Parse(peerURL)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = name + "=" + peerURL
	// A test member's data dies with the test: no write waits for a disk
	// flush, which on a busy machine takes long enough to turn a
	// test's short deadline into "no answer".
	cfg.UnsafeNoFsync = true
	// Logs go to a file in the data dir: a member's shutdown logs errors
	// ("server closed") that would clutter test and benchmark output.
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	return cfg
}

// peerConnsGrace bounds how long a stopped cluster's peer connections may
// stay open: until the peer listener's read timeout ends the last read of
// a connection that the member's server (shut down) no longer serves.
const peerConnsGrace = rafthttp.DefaultConnReadTimeout + 5*time.Second

// awaitPeerConnsClosed waits until no connection to or from a member's
// peer port is open any more, so that the goroutines serving them have
// ended when the test does.
//
// A member's Close shuts its peer HTTP server down with a one-second
// grace and does not close a connection that is still finishing a
// request: net/http aborts that connection's pending background read
// with a past read deadline, which the peer listener's per-read timeout
// (rafthttp.ConnReadTimeout) may overwrite. The connection then ends only
// when that timeout expires, and with it the goroutines of both ends
// (the server's, and the other member's client transport).
func (c *Cluster) awaitPeerConnsClosed(t testserver.TB) {
	ports := map[int]bool{}
	for _, m := range c.Members {
		if u, err := url.Parse(m.PeerURL); err == nil {
			if p, err := strconv.Atoi(u.Port()); err == nil {
				ports[p] = true
			}
		}
	}
	end := time.Now().Add(peerConnsGrace)
	for {
		n := openConns(ports)
		if n <= 0 {
			return
		}
		if time.Now().After(end) {
			t.Errorf("etcd: %d peer connections still open %v after the cluster stopped", n, peerConnsGrace)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Start runs an n-member cluster and waits until every member is ready.
func Start(t testserver.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	var initial []string
	for i := 0; i < n; i++ {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", testserver.FreePort(t)),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", testserver.FreePort(t)),
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	errc := make(chan error, n)
	token := fmt.Sprintf("dlock-test-%d", time.Now().UnixNano())
	for _, m := range c.Members {
		cfg := NewConfig(m.Name, t.TempDir(), m.ClientURL, m.PeerURL)
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = token
		go func() {
			e, err := embed.StartEtcd(cfg)
			if err == nil {
				m.Etcd = e
			}
			errc <- err
		}()
	}
	for range c.Members {
		if err := <-errc; err != nil {
			for _, m := range c.Members {
				if m.Etcd != nil {
					m.Etcd.Close()
				}
			}
			t.Fatalf("etcd: start: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, m := range c.Members {
			m.Stop()
		}
		if n > 1 {
			c.awaitPeerConnsClosed(t)
		}
	})
	for _, m := range c.Members {
		select {
		case <-m.Etcd.Server.ReadyNotify():
		case err := <-m.Etcd.Err():
			t.Fatalf("etcd member %s: %v", m.Name, err)
		case <-time.After(StartTimeout):
			t.Fatalf("etcd member %s not ready within %v", m.Name, StartTimeout)
		}
	}
	return c
}
