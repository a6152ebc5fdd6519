package control

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// fakeNet is gossip among the nodes of one test: every node sees every
// node registered and not dropped, with what each announced.
type fakeNet struct {
	mu    sync.Mutex
	peers map[string]Peer
}

// drop makes the named node vanish from every node's gossip.
func (n *fakeNet) drop(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.peers, name)
}

// netGossip is one node's view of a fakeNet.
type netGossip struct {
	net  *fakeNet
	name string
}

func (g netGossip) Peers() []Peer {
	g.net.mu.Lock()
	defer g.net.mu.Unlock()
	var out []Peer
	for _, p := range g.net.peers {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (g netGossip) Alive(name string) bool {
	g.net.mu.Lock()
	defer g.net.mu.Unlock()
	_, ok := g.net.peers[name]
	return ok
}

func (g netGossip) JoinsOthers() bool { return true }

func (g netGossip) SetClusterID(id string) {
	g.net.mu.Lock()
	defer g.net.mu.Unlock()
	if p, ok := g.net.peers[g.name]; ok {
		p.ClusterID = id
		g.net.peers[g.name] = p
	}
}

func (g netGossip) SetBootstrap(boot string, raft bool) {
	g.net.mu.Lock()
	defer g.net.mu.Unlock()
	if p, ok := g.net.peers[g.name]; ok {
		p.Boot, p.Raft = boot, raft
		g.net.peers[g.name] = p
	}
}

// peerService is the part of a node's peer service the control plane
// needs: it passes renewals and proposals to the Control.
type peerService struct {
	sluicepb.UnimplementedPeerServiceServer
	c *Control
}

func (s peerService) Renew(ctx context.Context, req *sluicepb.RenewRequest) (*sluicepb.RenewResponse, error) {
	granted, why := s.c.HandleRenew(ctx, req.FromNode, req.Epoch)
	return &sluicepb.RenewResponse{Granted: granted, Reason: why, Node: req.FromNode}, nil
}

func (s peerService) Propose(ctx context.Context, req *sluicepb.ProposeRequest) (*sluicepb.ProposeResponse, error) {
	res, err := s.c.HandlePropose(ctx, req.FromNode, req.Command)
	if err != nil {
		return nil, err
	}
	return &sluicepb.ProposeResponse{Result: res}, nil
}

// startNodes starts the control planes of a cluster of the nodes named,
// bootstrapped together (--expect their count) over a fakeNet, each with
// its peer service, and waits until each holds a lease.
func startNodes(t *testing.T, settings Settings, names ...string) (*fakeNet, []*Control) {
	t.Helper()
	gossip := &fakeNet{peers: make(map[string]Peer)}
	type prepared struct {
		name, dir, addr string
		mux             *Mux
	}
	var ps []prepared
	announced := Config{Settings: settings}.withDefaults().Settings.String()
	for _, name := range names {
		dir := t.TempDir()
		id, err := NodeID(dir)
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lis.Close() })
		addr := lis.Addr().String()
		gossip.peers[name] = Peer{Name: name, ID: id, Expect: len(names), Settings: announced, Addrs: Addrs{Peer: addr}}
		ps = append(ps, prepared{name, dir, addr, NewMux(lis)})
	}
	var nodes []*Control
	for _, p := range ps {
		c, err := New(Config{NodeName: p.name, DataDir: p.dir, Expect: len(names), Settings: settings, Addrs: Addrs{Peer: p.addr},
			Gossip: netGossip{gossip, p.name}, Transport: TransportConfig{Listener: p.mux.Raft(), Advertise: p.addr}})
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		sluicepb.RegisterPeerServiceServer(srv, peerService{c: c})
		go srv.Serve(p.mux.GRPC())
		t.Cleanup(func() {
			c.Shutdown()
			srv.Stop()
		})
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, c)
	}
	for _, c := range nodes {
		if err := testkit.Wait(20*time.Second, func() error {
			if !c.LeaseValid() {
				return errNoLeaseYet
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", c.Self(), err)
		}
	}
	return gossip, nodes
}

// countOp returns how many commands of op c's Raft log holds.
func countOp(t *testing.T, c *Control, op string) int {
	t.Helper()
	first, err := c.store.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := c.store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := max(first, 1); i <= last; i++ {
		var l raft.Log
		if err := c.store.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		var cmd command
		if l.Type == raft.LogCommand && json.Unmarshal(l.Data, &cmd) == nil && cmd.Op == op {
			n++
		}
	}
	return n
}

// waitMap polls c's map until ok accepts it, for up to 20 s.
func waitMap(t *testing.T, c *Control, what string, ok func(*Map) bool) *Map {
	t.Helper()
	var m *Map
	if err := testkit.Wait(20*time.Second, func() error {
		if m = c.Map(); !ok(m) {
			return errors.New(what)
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: not within 20 s: %+v", what, m.Partitions)
	}
	return m
}

// TestPartitionsOfASoloNode: a cluster of one bootstrapped with 8
// partitions gets them, in one command, once its node is live: every
// partition kept and led by it, in sync in its epoch. A partition's
// leader moves it by its own commands only: a reclaim and an in-sync
// change commit, a transfer to itself or at an old leader epoch is
// refused (ErrRefused), and the leader takes those commands from a member
// for itself, never for another.
func TestPartitionsOfASoloNode(t *testing.T) {
	c := startSoloWith(t, time.Second, func(cfg *Config) { cfg.Settings.Partitions = 8 })
	m := waitMap(t, c, "8 partitions", func(m *Map) bool { return len(m.Partitions) == 8 })
	if m.MinInsync != 1 || m.Settings.Partitions != 8 || m.Settings.MinInsync != 1 {
		t.Errorf("map: min-insync %d, settings %+v; want 1, 8 partitions at min-insync 1", m.MinInsync, m.Settings)
	}
	self := Incarnation{ID: c.ID(), Epoch: c.Epoch()}
	for p, rec := range m.Partitions {
		if !slices.Equal(rec.Replicas, []string{c.ID()}) || !slices.Equal(rec.ISR, []Incarnation{self}) || rec.Leader != c.ID() || rec.LeaderEpoch != 1 {
			t.Errorf("partition %d: %+v; want n1 alone, in sync in epoch %d, leading at epoch 1", p, rec, self.Epoch)
		}
	}
	if _, name, ok := m.LeaderOf("some key"); !ok || name != "n1" {
		t.Errorf("LeaderOf(some key) = %q, %v; want n1", name, ok)
	}
	// The leader's next rounds propose nothing more.
	for range 3 {
		c.placePartitions(&placer{})
	}
	if n := countOp(t, c, opPartitions); n != 1 {
		t.Errorf("the raft log holds %d partitions commands; want 1", n)
	}

	ctx := context.Background()
	if err := c.Reclaim(ctx, []PartitionChange{{P: 0, LeaderEpoch: 1}}); err != nil {
		t.Fatalf("Reclaim(0 at leader epoch 1) = %v", err)
	}
	if rec := c.Map().Partitions[0]; rec.Leader != c.ID() || rec.LeaderEpoch != 2 {
		t.Errorf("partition 0 after the reclaim: %+v; want n1 at leader epoch 2", rec)
	}
	p1 := c.Map().Partitions[1]
	if err := c.ChangeISR(ctx, []PartitionChange{{P: 1, Version: p1.Version, LeaderEpoch: p1.LeaderEpoch, ISR: p1.ISR}}); err != nil {
		t.Fatalf("ChangeISR(1, the same set) = %v", err)
	}
	if rec := c.Map().Partitions[1]; rec.Version != p1.Version+1 {
		t.Errorf("partition 1 after an in-sync change: version %d; want %d", rec.Version, p1.Version+1)
	}
	for _, tt := range []struct {
		name string
		ch   PartitionChange
		want string
	}{
		{"to itself", PartitionChange{P: 0, LeaderEpoch: 2, To: c.ID()}, "no target"},
		{"at an old leader epoch", PartitionChange{P: 0, LeaderEpoch: 1, To: c.ID()}, "does not lead"},
	} {
		before := c.Map()
		err := c.Transfer(ctx, []PartitionChange{tt.ch})
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Transfer %s = %v; want ErrRefused naming %q", tt.name, err, tt.want)
		}
		if !reflect.DeepEqual(c.Map().Partitions, before.Partitions) {
			t.Errorf("a refused transfer %s changed the partitions", tt.name)
		}
	}

	// Through the peer service: a member's command for itself applies;
	// one for another member is refused before it reaches the log.
	reclaim := command{Op: opReclaim, Name: "n1", ID: c.ID(), Epoch: c.Epoch(), Partitions: []PartitionChange{{P: 2, LeaderEpoch: 1}}}
	raw, err := c.HandlePropose(ctx, "n1", reclaim.encode())
	var res Result
	if err != nil || json.Unmarshal(raw, &res) != nil || res.Err != "" {
		t.Fatalf("HandlePropose(n1's own reclaim) = %s, %v; want it applied", raw, err)
	}
	if rec := c.Map().Partitions[2]; rec.LeaderEpoch != 2 {
		t.Errorf("partition 2 after n1's reclaim through the peer service: %+v; want leader epoch 2", rec)
	}
	before := c.Map()
	reclaim.Partitions[0].LeaderEpoch = 2
	if _, err := c.HandlePropose(ctx, "n2", reclaim.encode()); err == nil || !strings.Contains(err.Error(), "n2 may not change n1") {
		t.Errorf("HandlePropose(n1's reclaim, sent by n2) = %v; want refused", err)
	}
	if c.Map().Version != before.Version {
		t.Errorf("a proposal for another member changed the map")
	}
}

// TestPartitionsOfThreeNodes: three nodes bootstrapped with two replicas
// get every partition on two of them, both in sync, the first leading,
// leaderships spread; a follower's transfer goes through the Raft leader
// and moves its partition to the other replica at the next leader epoch
// (the same transfer again is refused); no node moves another's
// partition; a node that leaves hands each partition it led to its
// target, and once it is forgotten the lists it was on get the third
// node as a learner, in one command.
func TestPartitionsOfThreeNodes(t *testing.T) {
	gossip, nodes := startNodes(t, Settings{Replicas: 2, Policy: "exact", Lease: time.Second, Partitions: 8}, "n1", "n2", "n3")
	for _, c := range nodes {
		waitMap(t, c, c.Self()+": 8 partitions, 3 members live", func(m *Map) bool {
			return len(m.Partitions) == 8 && len(m.LiveMembers()) == 3
		})
	}
	var leader *Control
	for _, c := range nodes {
		if c.raft.State() == raft.Leader {
			leader = c
		}
	}
	if leader == nil {
		t.Fatal("no raft leader")
	}
	m := leader.Map()
	leads := make(map[string]int)
	for p, rec := range m.Partitions {
		if len(rec.Replicas) != 2 || len(rec.ISR) != 2 || rec.Leader != rec.Replicas[0] || rec.LeaderEpoch != 1 {
			t.Errorf("partition %d: %+v; want 2 replicas, both in sync, the first leading at epoch 1", p, rec)
		}
		for _, x := range rec.ISR {
			if y, ok := m.MemberByID(x.ID); !ok || !y.Live || y.Epoch != x.Epoch {
				t.Errorf("partition %d: in sync %+v, not its member's live epoch", p, x)
			}
		}
		leads[rec.Leader]++
	}
	for _, c := range nodes {
		if n := leads[c.ID()]; n < 2 || n > 3 {
			t.Errorf("%s leads %d of 8 partitions; want 2 or 3 (%v)", c.Self(), n, leads)
		}
	}
	if n := countOp(t, leader, opPartitions); n != 1 {
		t.Errorf("the leader's log holds %d partitions commands; want 1", n)
	}

	// A follower that leads a partition transfers it.
	var f *Control
	for _, c := range nodes {
		if c != leader && len(m.Led(c.ID())) > 0 {
			f = c
			break
		}
	}
	if f == nil {
		t.Fatalf("no follower leads a partition: %+v", m.Partitions)
	}
	p := m.Led(f.ID())[0]
	rec := m.Partitions[p]
	to := rec.Replicas[1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	transfer := []PartitionChange{{P: p, LeaderEpoch: rec.LeaderEpoch, To: to}}
	if err := f.Transfer(ctx, transfer); err != nil {
		t.Fatalf("%s: Transfer(%d to %s) = %v", f.Self(), p, to, err)
	}
	waitMap(t, f, "the transferred partition led by its other replica", func(m *Map) bool {
		return m.Partitions[p].Leader == to && m.Partitions[p].LeaderEpoch == rec.LeaderEpoch+1
	})
	if err := f.Transfer(ctx, transfer); !errors.Is(err, ErrRefused) {
		t.Errorf("%s: the same transfer again = %v; want ErrRefused", f.Self(), err)
	}

	// f proposes a transfer of another node's partition: refused.
	m = leader.Map()
	var other *Control
	for _, c := range nodes {
		if c != f && len(m.Led(c.ID())) > 0 {
			other = c
			break
		}
	}
	if other == nil {
		t.Fatalf("no node but %s leads a partition: %+v", f.Self(), m.Partitions)
	}
	q := m.Led(other.ID())[0]
	theirs := command{Op: opTransfer, Name: other.Self(), ID: other.ID(), Epoch: other.Epoch(),
		Partitions: []PartitionChange{{P: q, LeaderEpoch: m.Partitions[q].LeaderEpoch, To: m.Partitions[q].Replicas[1]}}}
	if _, err := leader.HandlePropose(ctx, f.Self(), theirs.encode()); err == nil || !strings.Contains(err.Error(), "may not change") {
		t.Errorf("HandlePropose(%s's transfer, sent by %s) = %v; want refused", other.Self(), f.Self(), err)
	}
	if got := leader.Map().Partitions[q]; !reflect.DeepEqual(got, m.Partitions[q]) {
		t.Errorf("partition %d after another node's proposal: %+v; want unchanged %+v", q, got, m.Partitions[q])
	}

	// f leaves, handing each partition it leads to its other replica.
	m = f.Map()
	var targets []PartitionChange
	want := make(map[int]string)
	var had []int
	for i, rec := range m.Partitions {
		if slices.Contains(rec.Replicas, f.ID()) {
			had = append(had, i)
		}
		if rec.Leader == f.ID() {
			want[i] = slices.DeleteFunc(slices.Clone(rec.Replicas), func(id string) bool { return id == f.ID() })[0]
			targets = append(targets, PartitionChange{P: i, To: want[i]})
		}
	}
	if err := f.LeaveWith(ctx, targets); err != nil {
		t.Fatalf("%s: LeaveWith(%+v) = %v", f.Self(), targets, err)
	}
	m = waitMap(t, leader, f.Self()+"'s epoch ended", func(m *Map) bool {
		x, _ := m.Member(f.Self())
		return !x.Live
	})
	for i, rec := range m.Partitions {
		if rec.inSync(f.ID()) || rec.Leader == f.ID() {
			t.Errorf("partition %d after %s left: %+v; want it out of sync, not leading", i, f.Self(), rec)
		}
		if to, ok := want[i]; ok && rec.Leader != to {
			t.Errorf("partition %d after %s left: led by %s; want its target %s", i, f.Self(), rec.Leader, to)
		}
	}

	// f is forgotten: the lists it was on are one short, and the third
	// node joins each as a learner.
	gossip.drop(f.Self())
	f.Shutdown()
	if err := leader.Forget(ctx, f.Self()); err != nil {
		t.Fatalf("Forget(%s) = %v", f.Self(), err)
	}
	before := m
	m = waitMap(t, leader, "every partition on two replicas without "+f.Self(), func(m *Map) bool {
		for _, rec := range m.Partitions {
			if len(rec.Replicas) != 2 || slices.Contains(rec.Replicas, f.ID()) {
				return false
			}
		}
		return true
	})
	for _, i := range had {
		rec := m.Partitions[i]
		added := slices.DeleteFunc(slices.Clone(rec.Replicas), func(id string) bool { return slices.Contains(before.Partitions[i].Replicas, id) })
		if len(added) != 1 || rec.inSync(added[0]) || rec.Leader != before.Partitions[i].Leader {
			t.Errorf("partition %d, which %s held: %+v; want one learner added, not in sync, its leader kept", i, f.Self(), rec)
		}
	}
	if n := countOp(t, leader, opReplicas); n != 1 {
		t.Errorf("the leader's log holds %d replicas commands; want 1", n)
	}
}
