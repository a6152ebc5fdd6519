package control_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
)

// stuckGossip is real gossip whose Peers blocks while the test holds it:
// the leader's duties beside granting (reconcile) stall, as they do on a
// loaded machine or behind a slow quorum.
type stuckGossip struct {
	*cluster.Membership
	hold sync.RWMutex
}

func (s *stuckGossip) Peers() []control.Peer {
	s.hold.RLock()
	defer s.hold.RUnlock()
	return s.Membership.Peers()
}

// TestLeaseOutlivesABusyLeader: a leader whose other duties stall for
// three leases still grants renewals, and its members' leases do not
// lapse. Before, renewals were granted on the goroutine that also
// reconciled the map with gossip, and a lease lapsed after one stall.
func TestLeaseOutlivesABusyLeader(t *testing.T) {
	const lease = time.Second
	dir := t.TempDir()
	id, err := control.NodeID(dir)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := control.NewMux(lis)
	defer lis.Close()
	addr := lis.Addr().String()
	settings := control.Settings{Replicas: 1, Policy: "exact", Lease: lease}
	m, err := cluster.New(cluster.Config{NodeName: "n1", GossipAddr: "127.0.0.1:0", GRPCAddr: addr, PeerAddr: addr, AdminAddr: addr, Expect: 1, ID: id, Settings: settings.String()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	g := &stuckGossip{Membership: m}
	local := m.Local()
	c, err := control.New(control.Config{NodeName: "n1", DataDir: dir, Expect: 1, Settings: settings,
		Addrs:     control.Addrs{Gossip: local.GossipAddr, Peer: addr},
		Gossip:    g,
		Transport: control.TransportConfig{Listener: mux.Raft(), Advertise: addr}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	for !c.LeaseValid() {
		if ctx.Err() != nil {
			t.Fatal("no lease within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	var release sync.Once
	g.hold.Lock()
	defer release.Do(g.hold.Unlock)
	start := time.Now()
	for time.Since(start) < 3*lease {
		if !c.LeaseValid() {
			t.Fatalf("lease lapsed %v after the leader's reconcile stalled; it must go on granting renewals", time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(10 * time.Millisecond)
	}
	release.Do(g.hold.Unlock)
}
