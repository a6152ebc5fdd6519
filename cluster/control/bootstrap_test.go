package control_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
)

// heldGossip is real gossip that the test holds back: while held, the
// control plane's announcement of its cluster ID (and, with holdRaft, of
// its Raft state) waits, and the nodes named in hide are left out of what
// it sees. It plays the late gossip of a first start: the cluster ID
// follows the bootstrap by a second or more, and views differ.
type heldGossip struct {
	*cluster.Membership
	holdRaft bool

	mu       sync.Mutex
	held     bool
	hide     map[string]bool
	cluster  string // the cluster ID announced while held
	boot     string // the bootstrap announcement while held
	raft     bool
	bootSeen bool
}

func (g *heldGossip) Peers() []control.Peer {
	g.mu.Lock()
	hide := g.hide
	g.mu.Unlock()
	return slices.DeleteFunc(g.Membership.Peers(), func(p control.Peer) bool { return hide[p.Name] })
}

func (g *heldGossip) SetClusterID(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held {
		g.cluster = id
		return
	}
	g.Membership.SetClusterID(id)
}

func (g *heldGossip) SetBootstrap(boot string, raft bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held && g.holdRaft {
		g.boot, g.raft, g.bootSeen = boot, raft, true
		raft = false
	}
	g.Membership.SetBootstrap(boot, raft)
}

// release announces what was held and shows every node.
func (g *heldGossip) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held, g.hide = false, nil
	if g.bootSeen {
		g.Membership.SetBootstrap(g.boot, g.raft)
	}
	if g.cluster != "" {
		g.Membership.SetClusterID(g.cluster)
	}
}

// bootNode is one node of a bootstrap test: gossip and control plane.
type bootNode struct {
	name    string
	dir     string
	lis     net.Listener
	mux     *control.Mux
	ml      *cluster.Membership
	gossip  *heldGossip
	ctl     *control.Control
	logs    *slog.Logger
	settles control.Settings
}

type tlogWriter struct {
	t    *testing.T
	name string
	mu   sync.Mutex
	done bool
}

func (w *tlogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(w.name + ": " + strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// startGossip starts node name's gossip with --expect expect, joining join
// (none: it starts alone). Its control plane is not started yet.
func startGossip(t *testing.T, name string, expect int, holdRaft bool, join ...string) *bootNode {
	t.Helper()
	n := &bootNode{name: name, dir: t.TempDir(), settles: control.Settings{Replicas: 1, Policy: "exact", Lease: time.Second}}
	w := &tlogWriter{t: t, name: name}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	n.logs = slog.New(slog.NewTextHandler(w, nil))
	id, err := control.NodeID(n.dir)
	if err != nil {
		t.Fatal(err)
	}
	if n.lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n.mux = control.NewMux(n.lis)
	addr := n.lis.Addr().String()
	n.ml, err = cluster.New(cluster.Config{NodeName: name, GossipAddr: "127.0.0.1:0", GRPCAddr: addr, PeerAddr: addr, AdminAddr: addr,
		Expect: expect, ID: id, Settings: n.settles.String(), Join: join, Logger: n.logs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.ml.Start(ctx); err != nil {
		t.Fatal(err)
	}
	n.gossip = &heldGossip{Membership: n.ml, holdRaft: holdRaft, held: true}
	t.Cleanup(func() {
		if n.ctl != nil {
			n.ctl.Shutdown()
		}
		n.ml.Shutdown()
		n.mux.Raft().Close()
		n.mux.GRPC().Close()
	})
	return n
}

// startControl starts the node's control plane.
func (n *bootNode) startControl(t *testing.T, expect int) {
	t.Helper()
	local := n.ml.Local()
	addr := n.lis.Addr().String()
	c, err := control.New(control.Config{NodeName: n.name, DataDir: n.dir, Expect: expect, Settings: n.settles,
		Addrs: control.Addrs{Gossip: local.GossipAddr, Peer: addr}, Gossip: n.gossip, Logger: n.logs,
		Transport: control.TransportConfig{Listener: n.mux.Raft(), Advertise: addr}})
	if err != nil {
		t.Fatal(err)
	}
	n.ctl = c
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond every 50 ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// TestBootstrapOnce: the cluster forms once, whatever the order of a first
// start and however late gossip tells of it. Six nodes start empty with
// --expect 3 (below the node count, and below a majority of it): n3, n4
// and n5 first, which bootstrap; then n0, n1 and n2, which see all six
// while n3..n5's gossip does not yet carry their cluster ID (nor, in the
// second case, their Raft state), and n3..n5 do not see them yet. Once
// gossip catches up, exactly one cluster ID exists and every node has it.
func TestBootstrapOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six nodes")
	}
	for _, tc := range []struct {
		name     string
		holdRaft bool
	}{
		{"cluster ID late", false},
		{"cluster ID and Raft state late", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const expect = 3
			var nodes []*bootNode
			first := startGossip(t, "n3", expect, tc.holdRaft)
			seed := first.ml.Local().GossipAddr
			nodes = append(nodes, first, startGossip(t, "n4", expect, tc.holdRaft, seed), startGossip(t, "n5", expect, tc.holdRaft, seed))
			groupA := slices.Clone(nodes)
			for _, n := range groupA {
				n.startControl(t, expect)
			}
			if !waitFor(20*time.Second, func() bool {
				for _, n := range groupA {
					if n.ctl.ClusterID() == "" {
						return false
					}
				}
				return true
			}) {
				t.Fatal("n3, n4, n5 (--expect 3) formed no cluster within 20 s")
			}
			hide := map[string]bool{"n0": true, "n1": true, "n2": true}
			for _, n := range groupA {
				n.gossip.mu.Lock()
				n.gossip.hide = hide
				n.gossip.mu.Unlock()
			}
			var groupB []*bootNode
			for _, name := range []string{"n0", "n1", "n2"} {
				groupB = append(groupB, startGossip(t, name, expect, tc.holdRaft, seed))
			}
			nodes = append(groupB, groupA...)
			if !waitFor(10*time.Second, func() bool {
				for _, n := range nodes {
					if n.ml.View().Len() != len(nodes) {
						return false
					}
				}
				return true
			}) {
				t.Fatal("gossip did not show all six nodes to each within 10 s")
			}
			for _, n := range groupB {
				n.startControl(t, expect)
			}
			// The window: n0..n2 see six nodes, none announcing a cluster.
			waitFor(5*time.Second, func() bool { return groupB[0].ctl.ClusterID() != "" })
			for _, n := range nodes {
				n.gossip.release()
			}
			if !waitFor(20*time.Second, func() bool {
				for _, n := range nodes {
					if n.ctl.ClusterID() == "" {
						return false
					}
				}
				return true
			}) {
				t.Fatalf("not every node is in a cluster 20 s after gossip caught up: %s", clusterIDs(nodes))
			}
			ids := make(map[string]bool)
			for _, n := range nodes {
				ids[n.ctl.ClusterID()] = true
			}
			if len(ids) != 1 {
				t.Fatalf("cluster IDs after a first start of six nodes with --expect 3: %s; want one, shared by all", clusterIDs(nodes))
			}
		})
	}
}

func clusterIDs(nodes []*bootNode) string {
	var parts []string
	for _, n := range nodes {
		id := n.ctl.ClusterID()
		if id == "" {
			id = "none"
		}
		parts = append(parts, fmt.Sprintf("%s: %s", n.name, id))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
