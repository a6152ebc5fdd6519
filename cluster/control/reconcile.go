package control

import (
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

func raftID(id string) raft.ServerID { return raft.ServerID(id) }

// voterGrace is how long a voter may be unseen before a healthy member
// takes its vote.
const voterGrace = 30 * time.Second

// reconcile brings the map and the Raft configuration in line with what
// gossip finds: it adds the nodes of this cluster (or of none yet) that
// run the cluster's settings, records new addresses, gives a name that
// came back with a new ID (its data directory lost) the new ID once the
// old epoch ended, takes forgotten members out of Raft, and places voters.
func (c *Control) reconcile(g *granter) {
	m := c.Map()
	if m.ClusterID == "" {
		return
	}
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return
	}
	servers := make(map[string]raft.Server)
	for _, s := range f.Configuration().Servers {
		servers[string(s.ID)] = s
	}
	settings := m.Settings.String()
	for _, p := range c.cfg.Gossip.Peers() {
		if p.ID == "" || p.ClusterID != "" && p.ClusterID != m.ClusterID || p.Settings != settings {
			continue
		}
		x, found := m.Member(p.Name)
		if p.ClusterID == "" && p.Raft && (!found || x.ID != p.ID) {
			// Raft state and no cluster ID yet: a node that has not
			// applied its map since it started, of another cluster (it
			// says so in a moment) unless its ID is a member's here. A
			// member of this cluster is updated (its new addresses are how
			// the leader reaches it to bring its map), never a stranger.
			continue
		}
		switch {
		case found && x.ID != p.ID && x.Phase != PhaseLeft && x.Live:
			// The name came back under a new ID while its old epoch is
			// live (a lost disk): end the old one first, fenced.
			g.forceEnd(p.Name, x.Epoch, "it came back with a new data directory")
			continue
		case !found || x.ID != p.ID || x.Phase == PhaseLeft || x.Addrs != p.Addrs || x.Zone != p.Zone:
			if _, err := c.apply(command{Op: opAdd, Name: p.Name, ID: p.ID, Zone: p.Zone, Addrs: p.Addrs, At: time.Now().UnixNano()}, time.Second); err != nil {
				c.log.Warn("add a member", "member", p.Name, "err", err)
				continue
			}
			if found && x.ID != p.ID {
				if _, ok := servers[x.ID]; ok {
					if err := c.raft.RemoveServer(raftID(x.ID), 0, time.Second).Error(); err != nil {
						c.log.Warn("remove a member's old ID from raft", "member", p.Name, "err", err)
					}
					delete(servers, x.ID)
				}
			}
			if !found || x.ID != p.ID || x.Phase == PhaseLeft {
				c.log.Info("added a member", "member", p.Name, "id", p.ID, "peer", p.Addrs.Peer)
			}
		}
		s, ok := servers[p.ID]
		switch {
		case !ok:
			if err := c.raft.AddNonvoter(raftID(p.ID), raft.ServerAddress(p.Addrs.Peer), 0, time.Second).Error(); err != nil {
				c.log.Warn("add a member to raft", "member", p.Name, "err", err)
				continue
			}
			servers[p.ID] = raft.Server{Suffrage: raft.Nonvoter, ID: raftID(p.ID), Address: raft.ServerAddress(p.Addrs.Peer)}
		case string(s.Address) != p.Addrs.Peer:
			var err error
			if s.Suffrage == raft.Voter {
				err = c.raft.AddVoter(s.ID, raft.ServerAddress(p.Addrs.Peer), 0, time.Second).Error()
			} else {
				err = c.raft.AddNonvoter(s.ID, raft.ServerAddress(p.Addrs.Peer), 0, time.Second).Error()
			}
			if err != nil {
				c.log.Warn("update a member's raft address", "member", p.Name, "err", err)
			}
		}
	}
	for _, x := range c.Map().Members {
		if x.Phase == PhaseLeft {
			if _, ok := servers[x.ID]; ok {
				if err := c.raft.RemoveServer(raftID(x.ID), 0, time.Second).Error(); err == nil {
					delete(servers, x.ID)
				}
			}
		}
	}
	c.placeVoters(servers)
}

// placeVoters keeps voterTarget(servers) voters among the members that are
// healthy (gossip sees them, their epoch is live), spread across zones: it
// promotes a healthy non-voter while there are too few healthy voters, and
// demotes a voter unseen for voterGrace once another took its place.
func (c *Control) placeVoters(servers map[string]raft.Server) {
	m := c.Map()
	now := time.Now()
	healthy := func(id string) bool {
		x, ok := m.MemberByID(id)
		return ok && x.Live && x.Phase == PhaseJoined && c.cfg.Gossip.Alive(x.Name)
	}
	c.unseenMu.Lock()
	defer c.unseenMu.Unlock()
	if c.unseen == nil {
		c.unseen = make(map[string]time.Time)
	}
	var voters, good, spare []string
	zones := make(map[string]bool)
	for id, s := range servers {
		if healthy(id) {
			delete(c.unseen, id)
		} else if _, ok := c.unseen[id]; !ok {
			c.unseen[id] = now
		}
		switch {
		case s.Suffrage == raft.Voter:
			voters = append(voters, id)
			if healthy(id) {
				good = append(good, id)
				x, _ := m.MemberByID(id)
				zones[x.Zone] = true
			}
		case healthy(id):
			spare = append(spare, id)
		}
	}
	slices.Sort(spare)
	target := voterTarget(len(servers))
	if len(good) < target && len(spare) > 0 {
		pick := spare[0]
		for _, id := range spare {
			if x, _ := m.MemberByID(id); !zones[x.Zone] {
				pick = id
				break
			}
		}
		x, _ := m.MemberByID(pick)
		if err := c.raft.AddVoter(raftID(pick), servers[pick].Address, 0, time.Second).Error(); err != nil {
			c.log.Warn("promote a member to voter", "member", x.Name, "err", err)
			return
		}
		c.log.Info("promoted a member to voter", "member", x.Name, "voters", len(voters)+1)
		return
	}
	if len(good) < target {
		return
	}
	for _, id := range voters {
		since, bad := c.unseen[id]
		if !bad || now.Sub(since) < voterGrace {
			continue
		}
		x, _ := m.MemberByID(id)
		if err := c.raft.DemoteVoter(raftID(id), 0, time.Second).Error(); err != nil {
			c.log.Warn("demote a voter that is down", "member", x.Name, "err", err)
			return
		}
		c.log.Warn("demoted a voter that is down", "member", x.Name, "down_for", now.Sub(since).Round(time.Second))
		return
	}
	// More voters than the target (members were forgotten, or the cluster
	// bootstrapped with more than it keeps): each extra voter is one more
	// way to lose the quorum. Demote one, never the leader: one down
	// first, then one whose zone another voter covers.
	if len(voters) <= target {
		return
	}
	slices.Sort(voters)
	perZone := make(map[string]int)
	for _, id := range voters {
		x, _ := m.MemberByID(id)
		perZone[x.Zone]++
	}
	self, pick := c.ID(), ""
	for _, id := range voters {
		x, _ := m.MemberByID(id)
		if id == self {
			continue
		}
		if !healthy(id) {
			pick = id
			break
		}
		if pick == "" && perZone[x.Zone] > 1 || pick == "" && id == voters[len(voters)-1] {
			pick = id
		}
	}
	if pick == "" { // the leader is the last voter and the only one of its zone
		pick = voters[len(voters)-2]
	}
	x, _ := m.MemberByID(pick)
	if err := c.raft.DemoteVoter(raftID(pick), 0, time.Second).Error(); err != nil {
		c.log.Warn("demote a voter beyond the target", "member", x.Name, "err", err)
		return
	}
	c.log.Info("demoted a voter beyond the target", "member", x.Name, "voters", len(voters)-1, "target", target)
}

// The Raft leader places partitions: it sets them once, when the cluster
// first has its members live, and gives a replica list that fell short
// (a member forgotten, or fewer members than replicas when they were
// set) the members PlanReplicas puts there. Both are commands the state
// machine checks (partition.go): the leader's view may be stale, and a
// refused command is tried again on the next round.

// partitionPatience is how long the leader waits for every server of the
// Raft configuration to be a member before it sets the partitions over
// the members there are: a node of the bootstrap that never came up
// must not hold the partitions back for ever.
const partitionPatience = 10 * time.Second

// replicasBatch bounds how many partitions one replicas command changes,
// so that a Raft entry stays small.
const replicasBatch = 1024

// placer is the leader's state for placing partitions, for one term.
type placer struct {
	// absentSince is when the leader first found every member live but
	// servers of the Raft configuration not yet members; zero otherwise.
	absentSince time.Time
}

// placePartitions sets the partitions of a cluster that has none yet
// once it is ready (every member that owns keys is live, and every Raft
// server is a member or partitionPatience passed), else adds replicas to
// the lists that are short. Each is one command.
func (c *Control) placePartitions(pl *placer) {
	m := c.Map()
	if m.ClusterID == "" || m.Settings.Partitions == 0 {
		return
	}
	if len(m.Partitions) > 0 {
		changes := replicaChanges(m)
		if len(changes) == 0 {
			return
		}
		if _, err := c.apply(command{Op: opReplicas, Partitions: changes}, time.Second); err != nil {
			c.log.Warn("add replicas to partitions", "partitions", len(changes), "err", err)
			return
		}
		c.log.Info("added replicas to partitions that had too few (they join out of sync)", "partitions", len(changes))
		return
	}
	ok, absent := pl.due(m, c.raftServers(), time.Now())
	if !ok {
		return
	}
	if len(absent) > 0 {
		c.log.Warn("setting the partitions over the members there are: servers of the raft configuration are still not members", "servers", absent, "waited", partitionPatience)
	}
	cmd := partitionsCommand(m)
	if _, err := c.apply(cmd, 5*time.Second); err != nil {
		c.log.Warn("set the partitions", "partitions", len(cmd.Partitions), "err", err)
		return
	}
	c.log.Info("set the partitions", "partitions", len(cmd.Partitions), "replicas", min(m.Settings.Replicas, len(m.Owners())), "min_insync", cmd.MinInsync)
}

// due reports whether the leader sets m's partitions at now: every
// member that owns keys is live, and every server of the Raft
// configuration (servers, their IDs) is a member, or the leader has
// waited partitionPatience for those that are not (absent, then).
func (pl *placer) due(m *Map, servers []string, now time.Time) (ok bool, absent []string) {
	if ownersLive(m) != "" {
		pl.absentSince = time.Time{}
		return false, nil
	}
	absent = absentServers(m, servers)
	if len(absent) == 0 {
		return true, nil
	}
	if pl.absentSince.IsZero() {
		pl.absentSince = now
	}
	return now.Sub(pl.absentSince) >= partitionPatience, absent
}

// raftServers returns the IDs of the servers of the Raft configuration.
func (c *Control) raftServers() []string {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var ids []string
	for _, s := range f.Configuration().Servers {
		ids = append(ids, string(s.ID))
	}
	return ids
}

// ownersLive returns why m's members are not ready for partitions, ""
// when they are: there is a member that owns keys, and every one is live.
// Every replica then starts in sync, with nothing to catch up.
func ownersLive(m *Map) string {
	n := 0
	for _, x := range m.Members {
		if x.Phase != PhaseJoined {
			continue
		}
		if !x.Live {
			return fmt.Sprintf("%s is not live", x.Name)
		}
		n++
	}
	if n == 0 {
		return "no member"
	}
	return ""
}

// absentServers returns the IDs of servers that are no member of m: at
// bootstrap, nodes the leader has not added yet.
func absentServers(m *Map, servers []string) []string {
	var out []string
	for _, id := range servers {
		if _, ok := m.MemberByID(id); !ok {
			out = append(out, id)
		}
	}
	return out
}

// partitionsCommand returns the command that sets m's partitions: the
// replica lists PlanReplicas gives over the members that own keys, and
// the cluster's min-insync.
func partitionsCommand(m *Map) command {
	plan := PlanReplicas(m, m.Settings.Partitions, m.Settings.Replicas)
	cmd := command{Op: opPartitions, MinInsync: max(m.Settings.MinInsync, 1), Partitions: make([]PartitionChange, len(plan))}
	for p, ids := range plan {
		cmd.Partitions[p] = PartitionChange{P: p, Replicas: ids}
	}
	return cmd
}

// replicaChanges returns the changes that fill m's replica lists shorter
// than the setting (or than the members that own keys, if fewer): each
// keeps its list and adds the members PlanReplicas puts there, out of
// sync. At most replicasBatch of them; none when no list is short.
func replicaChanges(m *Map) []PartitionChange {
	want := min(max(m.Settings.Replicas, 1), len(m.Owners()))
	var plan [][]string
	var changes []PartitionChange
	for i, p := range m.Partitions {
		if len(p.Replicas) >= want {
			continue
		}
		if plan == nil {
			plan = PlanReplicas(m, len(m.Partitions), m.Settings.Replicas)
		}
		ids := slices.Clone(p.Replicas)
		for _, id := range plan[i] {
			if len(ids) < want && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		if len(ids) == len(p.Replicas) {
			continue
		}
		changes = append(changes, PartitionChange{P: i, Version: p.Version, Replicas: ids})
		if len(changes) == replicasBatch {
			break
		}
	}
	return changes
}
