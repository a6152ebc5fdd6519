package control

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// Bootstrap: every node of the first start calls Raft's BootstrapCluster
// with the identical configuration, or none does (docs/cluster.md,
// "Bootstrap", gives the argument).
//
// A node without Raft state keeps a bootstrap set: the nodes (Raft ID and
// name) gossip has shown it alive without Raft state, without a cluster ID
// and with its settings, itself included. The set only grows; it is saved
// in raft.db before its digest is announced in gossip (so a restart does
// not shrink it), and it stops changing once the node has Raft state. The
// node bootstraps when its set holds at least Expect nodes (2 with Expect
// 1 and a join list that names others), every other node of the set is
// seen alive announcing the same digest, no node is seen with a cluster
// ID, and no node is seen with Raft state under another digest. The
// configuration is the set: sorted by name, the first voterTarget of them
// vote, the rest do not.
//
// Why two sets cannot both be bootstrapped: say x1 bootstrapped with C1
// and x2 with C2 ≠ C1. Whoever is seen announcing the digest of a set had
// that set at some time; sets only grow, and freeze at bootstrap. A node z
// in both sets was seen announcing both, so one set contains the other,
// say C2 ⊂ C1 (strictly). Then x2 is in C1, and x1 saw it announce C1;
// x2's set was C1 at some time, and C2 when it froze: C1 ⊆ C2, a
// contradiction. So C1 and C2 share no node, and each holds at least
// Expect nodes: two clusters need 2·Expect nodes started empty, each half
// bootstrapping before it saw any node of the other.

// BootDigestLen is the length of a bootstrap set's digest, in hex digits.
const BootDigestLen = 32

// bootSet is a node's bootstrap set: Raft server ID → node name.
type bootSet map[string]string

// digest names the set and the settings it bootstraps with.
func (s bootSet) digest(settings string) string {
	h := sha256.New()
	fmt.Fprintf(h, "sluice bootstrap set 1\n%s\n", settings)
	for _, id := range slices.Sorted(maps.Keys(s)) {
		fmt.Fprintf(h, "%s %s\n", id, s[id])
	}
	return hex.EncodeToString(h.Sum(nil))[:BootDigestLen]
}

// hasState reports whether this node has Raft state: a log entry, a term
// (it voted or stood) or a snapshot. BootstrapCluster refuses then.
func (c *Control) hasState() bool {
	if c.raft.LastIndex() > 0 {
		return true
	}
	ok, err := raft.HasExistingState(c.store, c.store, c.snaps)
	return ok || err != nil
}

// tryBootstrap grows this node's bootstrap set from what gossip shows and
// bootstraps the cluster with it once the rules above allow.
func (c *Control) tryBootstrap(loud func(string, ...any)) {
	peers := c.cfg.Gossip.Peers()
	for _, p := range peers {
		if p.ClusterID != "" {
			return // a cluster exists: its leader adds this node
		}
	}
	settings := c.cfg.Settings.String()
	grown := maps.Clone(c.boot)
	if grown == nil {
		grown = make(bootSet)
	}
	grown[c.ID()] = c.cfg.NodeName
	for _, p := range peers {
		if p.ID == "" || p.Raft || p.Name == c.cfg.NodeName {
			continue
		}
		if p.Settings != settings {
			loud("a node runs other settings: it is left out of the bootstrap, and refused once the cluster exists",
				"node", p.Name, "its_settings", p.Settings, "settings", settings)
			continue
		}
		if p.Expect != c.cfg.Expect {
			loud("a node runs with another --expect: it bootstraps with the others all the same",
				"node", p.Name, "its_expect", p.Expect, "expect", c.cfg.Expect)
		}
		if _, ok := grown[p.ID]; !ok {
			grown[p.ID] = p.Name
		}
	}
	if len(grown) != len(c.boot) {
		if err := c.store.saveBootSet(grown); err != nil {
			c.log.Error("save the bootstrap set", "err", err)
			return
		}
		c.boot, c.bootDigest = grown, grown.digest(settings)
		c.bootGrown = time.Now()
		c.cfg.Gossip.SetBootstrap(c.bootDigest, false)
	}

	need := c.cfg.Expect
	if need == 1 && c.cfg.Gossip.JoinsOthers() {
		need = 2
		if len(c.boot) < need {
			loud("--expect 1, but the join list names other nodes: waiting to join them rather than bootstrapping alone")
		}
	}
	if len(c.boot) < need {
		return
	}
	byID := make(map[string]Peer, len(peers))
	for _, p := range peers {
		if p.ID == "" {
			continue
		}
		byID[p.ID] = p
		if p.Raft && p.Boot != c.bootDigest && p.Name != c.cfg.NodeName {
			loud("a node has Raft state from another bootstrap: waiting for its cluster to add this node", "node", p.Name)
			return
		}
	}
	var waiting []string
	for id, name := range c.boot {
		if p, ok := byID[id]; !ok || (id != c.ID() && p.Boot != c.bootDigest) {
			waiting = append(waiting, name)
		}
	}
	if len(waiting) > 0 {
		if time.Since(c.bootGrown) > bootPatience {
			slices.Sort(waiting)
			loud("waiting to bootstrap: nodes of this node's bootstrap set are not seen, or announce another set",
				"waiting_for", waiting, "set", len(c.boot), "expect", c.cfg.Expect)
		}
		return
	}
	servers, names := c.boot.configuration(byID)
	err := c.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return // Raft state arrived meanwhile (a vote, or the leader's log)
	}
	if err != nil {
		c.log.Error("bootstrap the cluster", "err", err)
		return
	}
	c.log.Info("bootstrapped the cluster", "servers", names, "voters", names[:voterTarget(len(names))], "expect", c.cfg.Expect)
}

// bootPatience is how long a node waits on its bootstrap set before it
// says whom it waits for.
const bootPatience = 10 * time.Second

// configuration is the Raft configuration of the set, with the addresses
// gossip shows (byID holds every member): sorted by name, the first
// voterTarget vote. It returns the names in the same order.
func (s bootSet) configuration(byID map[string]Peer) ([]raft.Server, []string) {
	ids := slices.SortedFunc(maps.Keys(s), func(a, b string) int {
		if c := strings.Compare(s[a], s[b]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	voters := voterTarget(len(ids))
	servers := make([]raft.Server, len(ids))
	names := make([]string, len(ids))
	for i, id := range ids {
		suffrage := raft.Voter
		if i >= voters {
			suffrage = raft.Nonvoter
		}
		servers[i] = raft.Server{Suffrage: suffrage, ID: raft.ServerID(id), Address: raft.ServerAddress(byID[id].Addrs.Peer)}
		names[i] = s[id]
	}
	return servers, names
}
