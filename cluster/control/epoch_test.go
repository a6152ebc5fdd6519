package control

import (
	"encoding/json"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// soloGossip is the gossip of a node alone: it sees itself.
type soloGossip struct {
	mu   sync.Mutex
	self Peer
}

func (g *soloGossip) Peers() []Peer {
	g.mu.Lock()
	defer g.mu.Unlock()
	return []Peer{g.self}
}
func (g *soloGossip) Alive(string) bool { return true }
func (g *soloGossip) JoinsOthers() bool { return false }
func (g *soloGossip) SetClusterID(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.self.ClusterID = id
}
func (g *soloGossip) SetBootstrap(boot string, raft bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.self.Boot, g.self.Raft = boot, raft
}

// startSolo starts the control plane of a cluster of one and waits for its
// lease.
func startSolo(t *testing.T, lease time.Duration) *Control {
	t.Helper()
	return startSoloWith(t, lease, func(*Config) {})
}

// startSoloWith is startSolo with changes to the configuration.
func startSoloWith(t *testing.T, lease time.Duration, change func(*Config)) *Control {
	t.Helper()
	dir := t.TempDir()
	id, err := NodeID(dir)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := NewMux(lis)
	t.Cleanup(func() { mux.GRPC().Close() })
	addr := lis.Addr().String()
	settings := Settings{Replicas: 1, Policy: "exact", Lease: lease}
	g := &soloGossip{self: Peer{Name: "n1", ID: id, Expect: 1, Addrs: Addrs{Peer: addr}}}
	cfg := Config{NodeName: "n1", DataDir: dir, Expect: 1, Settings: settings, Addrs: Addrs{Peer: addr},
		Gossip: g, Transport: TransportConfig{Listener: mux.Raft(), Advertise: addr}}
	change(&cfg)
	// Gossip announces the settings the control plane runs with,
	// defaults applied: the leader adds a node only if they match the
	// map's.
	g.self.Settings = cfg.withDefaults().Settings.String()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Shutdown() })
	if err := testkit.Wait(10*time.Second, func() error {
		if !c.LeaseValid() {
			return errNoLeaseYet
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

var errNoLeaseYet = errors.New("no lease yet")

// TestLeaseOfTheAdmittingEpoch: once this node moved to a new epoch and
// holds its lease, the lease of the epoch before is not valid: a decision
// admitted under it, committed after the change, is not acknowledged
// (cluster.Router checks LeaseValidFor the epoch that admitted the call).
// Before, the check after the commit asked LeaseValid, the lease of the
// current epoch, and said yes.
func TestLeaseOfTheAdmittingEpoch(t *testing.T) {
	c := startSolo(t, time.Second)
	admitted := c.Epoch()
	if !c.LeaseValidFor(admitted) {
		t.Fatalf("LeaseValidFor(%d), the live epoch with its lease = false; want true", admitted)
	}
	// The epoch ends and the node starts another, as after a pause, between
	// the admission and the check after the commit.
	if _, err := c.apply(command{Op: opEnd, Name: "n1", Epoch: admitted}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var res struct{ Epoch uint64 }
	if err := testkit.Wait(10*time.Second, func() error {
		if res.Epoch = c.Epoch(); res.Epoch == admitted || !c.LeaseValid() {
			return errNoLeaseYet
		}
		return nil
	}); err != nil {
		t.Fatalf("after the end of epoch %d: %v", admitted, err)
	}
	if res.Epoch == admitted {
		t.Fatalf("the new epoch is %d, the one that admitted the call", admitted)
	}
	if !c.LeaseValid() {
		t.Fatalf("LeaseValid() at epoch %d with its lease = false; want true", res.Epoch)
	}
	if c.LeaseValidFor(admitted) {
		t.Errorf("LeaseValidFor(%d) after the node moved to epoch %d with a lease = true; want false: the epoch that admitted the call ended", admitted, res.Epoch)
	}
	if !c.LeaseValidFor(res.Epoch) {
		t.Errorf("LeaseValidFor(%d), the live epoch with its lease = false; want true", res.Epoch)
	}
}

// TestMayHaveLostOnFirstStartOnly: a process whose data directory may have
// lost acknowledged writes says so in the first epoch it starts, and only
// there: its later epochs (after a pause, say) lost nothing.
func TestMayHaveLostOnFirstStartOnly(t *testing.T) {
	c := startSoloWith(t, time.Second, func(cfg *Config) { cfg.MayHaveLost = true })
	startOf := func() command {
		t.Helper()
		var l raft.Log
		if err := c.store.GetLog(c.epochAt.Load(), &l); err != nil {
			t.Fatal(err)
		}
		var cmd command
		if err := json.Unmarshal(l.Data, &cmd); err != nil || cmd.Op != opStart {
			t.Fatalf("entry %d: %s (%v); want a start", c.epochAt.Load(), l.Data, err)
		}
		return cmd
	}
	if !startOf().MayHaveLost {
		t.Fatalf("the first start says nothing of a possible loss")
	}
	first := c.Epoch()
	if _, err := c.apply(command{Op: opEnd, Name: "n1", Epoch: first}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Wait(10*time.Second, func() error {
		if c.Epoch() == first || !c.LeaseValid() {
			return errNoLeaseYet
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if startOf().MayHaveLost {
		t.Fatalf("the second start of one process says it may have lost writes")
	}
}
