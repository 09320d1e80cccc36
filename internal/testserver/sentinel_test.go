package testserver

import (
	"strings"
	"testing"
)

func TestSentinelFailover(t *testing.T) {
	for _, fault := range []string{"kill", "pause"} {
		t.Run(fault, func(t *testing.T) {
			s := StartSentinel(t, WithDataPassword("data-pw"), WithSentinelPassword("sentinel-pw"))
			old := s.Primary()
			if old != s.Servers[0] {
				t.Fatalf("primary %s, want the first server %s", old.Addr(), s.Servers[0].Addr())
			}
			if _, err := old.Do("SET", "k", "v"); err != nil {
				t.Fatal(err)
			}
			s.WaitSynced(old)
			for _, r := range s.Replicas() {
				if v, err := r.Do("GET", "k"); err != nil || v != "v" {
					t.Fatalf("replica %s: %q %v", r.Addr(), v, err)
				}
			}
			switch fault {
			case "kill":
				old.Stop()
			case "pause":
				old.Pause()
				t.Cleanup(old.Resume)
			}
			p := s.WaitFailover(old)
			if v, err := p.Do("GET", "k"); err != nil || v != "v" {
				t.Fatalf("new primary %s: %q %v", p.Addr(), v, err)
			}
			if _, err := p.Do("SET", "k2", "v2"); err != nil {
				t.Fatalf("new primary %s refuses writes: %v", p.Addr(), err)
			}
			info, _ := p.Do("INFO", "replication")
			if !strings.Contains(info, "role:master") {
				t.Fatalf("new primary: %s", info)
			}
		})
	}
}

// A replica whose replication link is stalled misses the primary's
// writes; a failover to it loses them (what replica acknowledgement is
// for).
func TestSentinelStalledReplicationLink(t *testing.T) {
	s := StartSentinel(t, WithReplicas(1), WithReplicationProxies())
	old := s.Primary()
	restore := s.KeepReplicationLinks()
	s.ReplicationLinks[0].Stall()
	replies, err := old.DoSeq([]string{"SET", "k", "v"}, []string{"WAIT", "1", "200"})
	if err != nil || replies[1] != "0" {
		t.Fatalf("SET, WAIT 1 with the link stalled: %q %v, want 0 replicas", replies, err)
	}
	old.Stop()
	restore()
	p := s.WaitFailover(old)
	if v, err := p.Do("GET", "k"); err != nil || v != "" {
		t.Fatalf("the new primary has the write its link missed: %q %v", v, err)
	}
}
