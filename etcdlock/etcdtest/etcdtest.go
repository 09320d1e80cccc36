// Package etcdtest runs real etcd servers in-process (go.etcd.io/etcd/
// server/v3/embed) on free loopback ports for tests: one member or a
// cluster, data in the test's temporary directory, stopped at cleanup.
package etcdtest

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

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
	// Logs go to a file in the data dir: a member's shutdown logs errors
	// ("server closed") that would clutter test and benchmark output.
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	return cfg
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
