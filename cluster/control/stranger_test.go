package control_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// logLine returns the first line of log that holds every one of parts,
// "" if none.
func logLine(log *testkit.SyncBuffer, parts ...string) string {
	for _, line := range strings.Split(log.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return line
		}
	}
	return ""
}

// soloNode is one node on loopback: real gossip, and its control plane
// with --expect 1 and no join list, so that it bootstraps a cluster of
// its own.
type soloNode struct {
	m   *cluster.Membership
	c   *control.Control
	log *testkit.SyncBuffer
}

// startSolo starts a node named name with settings on dir (a fresh one
// unless it held a node before), its gossip joining join. It fails the
// test if Start fails; with wantLease it waits up to 10 s for the node's
// lease.
func startSolo(t *testing.T, name, dir string, settings control.Settings, wantLease bool, join ...string) *soloNode {
	t.Helper()
	n, err := newSolo(t, name, dir, settings, join...)
	if err != nil {
		t.Fatal(err)
	}
	if wantLease {
		deadline := time.Now().Add(10 * time.Second)
		for !n.c.LeaseValid() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no lease within 10 s", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return n
}

func newSolo(t *testing.T, name, dir string, settings control.Settings, join ...string) (*soloNode, error) {
	t.Helper()
	id, err := control.NodeID(dir)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := control.NewMux(lis)
	t.Cleanup(func() { lis.Close() })
	addr := lis.Addr().String()
	n := &soloNode{log: &testkit.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(n.log, nil)).With("node", name)
	n.m, err = cluster.New(cluster.Config{NodeName: name, GossipAddr: "127.0.0.1:0", GRPCAddr: addr, PeerAddr: addr, AdminAddr: addr,
		Expect: 1, ID: id, Settings: settings.String(), Join: join, RejoinInterval: -1, Logger: log})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.m.Start(ctx); err != nil {
		return nil, err
	}
	t.Cleanup(func() { n.m.Shutdown() })
	local := n.m.Local()
	n.c, err = control.New(control.Config{NodeName: name, DataDir: dir, Expect: 1, Settings: settings, Logger: log,
		Addrs:     control.Addrs{Gossip: local.GossipAddr, Peer: addr},
		Gossip:    n.m,
		Transport: control.TransportConfig{Listener: mux.Raft(), Advertise: addr}})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { n.c.Shutdown() })
	return n, n.c.Start()
}

// TestStrangerInGossipIsNamedNotFatal: two running clusters whose gossip
// merges (a reused address, a join list naming a node of another
// cluster) go on running: neither stops, neither admits the other's node
// to its map, and each names the other's node, and its cluster, in a
// warning. Before, a node that saw a peer of another cluster run other
// settings stopped with ErrMismatch.
func TestStrangerInGossipIsNamedNotFatal(t *testing.T) {
	a := startSolo(t, "a1", t.TempDir(), control.Settings{Replicas: 2, Policy: "exact", Lease: time.Second}, true)
	b := startSolo(t, "b1", t.TempDir(), control.Settings{Replicas: 1, Policy: "exact", Lease: time.Second}, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.m.Join(ctx, []string{a.m.Local().GossipAddr}); err != nil {
		t.Fatal(err)
	}
	nodes := []*soloNode{a, b}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for i, n := range nodes {
			select {
			case err := <-n.c.Fatal():
				t.Fatalf("%s stopped once another cluster's node showed in its gossip: %v", n.c.Self(), err)
			default:
			}
			other := nodes[1-i].c.Self()
			if _, ok := n.c.Map().Member(other); ok {
				t.Fatalf("%s's map lists %s, a node of another cluster", n.c.Self(), other)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i, n := range nodes {
		other := nodes[1-i].c
		if logLine(n.log, "another cluster", "stranger="+other.Self(), other.ClusterID()) == "" {
			t.Errorf("%s logged no warning naming %s and its cluster %s", n.c.Self(), other.Self(), other.ClusterID())
		}
		if !n.c.LeaseValid() {
			t.Errorf("%s holds no lease beside a node of another cluster", n.c.Self())
		}
	}
}

// TestSettingsMismatchStopsOnlyANodeThatJoins: a node without a cluster
// of its own that sees the one cluster it would join run other settings
// is refused (ErrMismatch, from Start or at once after); a node restarted on its data
// directory with a changed flag stops with ErrMismatch once its map
// arrives, and never announces its cluster's ID in gossip.
func TestSettingsMismatchStopsOnlyANodeThatJoins(t *testing.T) {
	r2 := control.Settings{Replicas: 2, Policy: "exact", Lease: time.Second}
	r1 := control.Settings{Replicas: 1, Policy: "exact", Lease: time.Second}
	a := startSolo(t, "a1", t.TempDir(), r2, true)

	t.Run("new node", func(t *testing.T) {
		n, err := newSolo(t, "a2", t.TempDir(), r1, a.m.Local().GossipAddr)
		if err == nil { // gossip's view of a1 arrived after Start
			select {
			case err = <-n.c.Fatal():
			case <-time.After(5 * time.Second):
			}
		}
		if !errors.Is(err, control.ErrMismatch) || !strings.Contains(err.Error(), "--replicas 1") {
			t.Fatalf("Start = %v; want ErrMismatch naming --replicas 1", err)
		}
	})

	t.Run("restarted with a changed flag", func(t *testing.T) {
		dir := t.TempDir()
		b := startSolo(t, "b1", dir, r2, true)
		b.c.Shutdown()
		b.m.Shutdown()
		b2 := startSolo(t, "b1", dir, r1, false, a.m.Local().GossipAddr)
		select {
		case err := <-b2.c.Fatal():
			if !errors.Is(err, control.ErrMismatch) || !strings.Contains(err.Error(), "--replicas 1") {
				t.Fatalf("Fatal = %v; want ErrMismatch naming --replicas 1", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("b1, restarted with --replicas 1 on a cluster of --replicas 2, still runs after 10 s")
		}
		if id := b2.m.Local().ClusterID; id != "" {
			t.Errorf("b1 announced cluster %s in gossip before its settings check failed", id)
		}
		for _, p := range a.m.Peers() {
			if p.Name == "b1" && p.ClusterID != "" {
				t.Errorf("a1 sees b1 announce cluster %s", p.ClusterID)
			}
		}
	})
}
