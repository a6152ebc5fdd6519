package control

import (
	"fmt"
	"slices"

	"github.com/sluice-io/sluice/shard"
)

// Partitions separate where a key's state lives from who decides it. A
// key's partition is a pure function of the key (shard.Partition). Each
// partition has a record in the map: the replicas that keep it (an
// assignment that changes only on purpose: a join, a forget, a balance),
// the one that leads it (which follows liveness, among the replicas known
// to hold everything acknowledged: the in-sync set) and the epochs that
// fence both. The state machine checks every change against the
// invariants below, when it applies it, so that no proposer's stale view
// can break them:
//
//   - I1, one decider. The leader of a partition changes from A to B only
//     by A's own transfer (a compare-and-set on the partition, its leader
//     epoch and A's live epoch), by the entry that ends A's epoch (a crash
//     once A's lease is over for sure, a graceful stop, or a new process
//     on A's data directory), or by a forget. Nothing else moves the
//     leader of a partition whose leader is live.
//   - I3, election. A new leader is a live member of the in-sync set, and
//     the leader epoch grows by one on every change of leader.
//   - I4, incarnations. An in-sync entry names the member's ID and the
//     epoch it was admitted in: a member back under a new ID (its data
//     directory is gone) is never in it, and an admission names the
//     admitted member's current epoch.
//   - The in-sync set is never empty: its last member stays in it when its
//     epoch ends, and the partition waits for it (policy exact). The entry
//     that ends an epoch takes the member out of every other in-sync set,
//     so a set of two or more holds live members only.
//
// Acknowledgement by the in-sync set (I2) and one history per partition
// (I5) belong to the replication of records, which reads these records.

// Incarnation is one admission of a member's data to an in-sync set: its
// Raft ID and the epoch it was admitted in.
type Incarnation struct {
	ID    string `json:"id"`
	Epoch uint64 `json:"epoch"`
}

// Partition is one partition's record in the map. A record is never
// changed in place: a change stores a new one.
type Partition struct {
	// Replicas are the IDs of the members that keep the partition, its
	// preferred leader first.
	Replicas []string `json:"replicas"`
	// Leader is the ID of the member that decides its keys; "" while none
	// may (the partition waits).
	Leader string `json:"leader,omitempty"`
	// LeaderEpoch grows by one on every change of leader, to none too.
	LeaderEpoch uint64 `json:"leader_epoch"`
	// Version grows by one on every change of the record: proposals name
	// the version they read.
	Version uint64 `json:"version"`
	// ISR is the in-sync set: the replicas known to hold every record the
	// partition acknowledged. Never empty.
	ISR []Incarnation `json:"isr"`
	// Unclean is set when the leader was chosen outside the in-sync set
	// (policy available): replicas that come back take a snapshot.
	Unclean bool `json:"unclean,omitempty"`
	// Tombstone, when not 0, is the wall clock (Unix nanoseconds) at which
	// every replica that held the partition's acknowledged records was
	// lost: its leaders deny each key for one window from then.
	Tombstone int64 `json:"tombstone,omitempty"`
}

// inSync reports whether the member with ID id is in p's in-sync set.
func (p *Partition) inSync(id string) bool { return p.isrIndex(id) >= 0 }

// firstOther returns the ID of the first member by name, other than the
// one with ID id, that owns keys: live ones first; "" if there is none.
func (m *Map) firstOther(id string) string {
	for _, live := range []bool{true, false} {
		for _, x := range m.Members {
			if x.ID != id && x.Phase == PhaseJoined && (x.Live || !live) {
				return x.ID
			}
		}
	}
	return ""
}

func (p *Partition) isrIndex(id string) int {
	return slices.IndexFunc(p.ISR, func(x Incarnation) bool { return x.ID == id })
}

// withISR returns p with the in-sync set isr, the version bumped.
func (p Partition) withISR(isr []Incarnation) Partition {
	p.ISR = isr
	p.Version++
	return p
}

// led returns p led by id (or by none: ""), its leader epoch bumped.
func (p Partition) led(id string) Partition {
	p.Leader = id
	p.LeaderEpoch++
	return p
}

// PartitionChange is one partition's part of a partition command: the
// version (and, for a leader's commands, the leader epoch) its proposer
// read, and what it asks.
type PartitionChange struct {
	P           int    `json:"p"`
	Version     uint64 `json:"version,omitempty"`
	LeaderEpoch uint64 `json:"leader_epoch,omitempty"`
	// To is a transfer's target (transfer, end).
	To string `json:"to,omitempty"`
	// Replicas is a new replica list (replicas, partitions).
	Replicas []string `json:"replicas,omitempty"`
	// ISR is a new in-sync set (isr).
	ISR []Incarnation `json:"isr,omitempty"`
}

// Partition returns the partition of key in m and its record; ok is false
// when m has no partitions.
func (m *Map) Partition(key string) (p int, rec Partition, ok bool) {
	if m == nil || len(m.Partitions) == 0 {
		return 0, Partition{}, false
	}
	p = shard.Partition(shard.Hash(key), len(m.Partitions))
	return p, m.Partitions[p], true
}

// PartitionLeader returns the name of the member that leads partition p;
// ok is false when p is out of range or no member may decide its keys
// now (the partition waits).
func (m *Map) PartitionLeader(p int) (name string, ok bool) {
	if m == nil || p < 0 || p >= len(m.Partitions) || m.Partitions[p].Leader == "" {
		return "", false
	}
	x, ok := m.MemberByID(m.Partitions[p].Leader)
	return x.Name, ok
}

// LeaderOf returns the partition of key and the name of the member that
// leads it; ok is false when m has no partitions (p is 0 then) or the
// partition has no leader.
func (m *Map) LeaderOf(key string) (p int, name string, ok bool) {
	p, _, ok = m.Partition(key)
	if !ok {
		return 0, "", false
	}
	name, ok = m.PartitionLeader(p)
	return p, name, ok
}

// Led returns the partitions the member with ID id leads, in order.
func (m *Map) Led(id string) []int {
	if m == nil || id == "" {
		return nil
	}
	var out []int
	for i := range m.Partitions {
		if m.Partitions[i].Leader == id {
			out = append(out, i)
		}
	}
	return out
}

// liveByID returns the member with ID id if its epoch is live.
func (m *Map) liveByID(id string) (Member, bool) {
	x, ok := m.MemberByID(id)
	return x, ok && x.Live && x.Phase != PhaseLeft
}

// CheckPartitions returns an error naming the first partition record of m
// that breaks the map's invariants, nil when every record keeps them.
func (m *Map) CheckPartitions() error {
	for i := range m.Partitions {
		if err := m.checkPartition(i, &m.Partitions[i]); err != nil {
			return err
		}
	}
	return nil
}

func (m *Map) checkPartition(i int, p *Partition) error {
	if len(p.Replicas) == 0 {
		return fmt.Errorf("partition %d has no replicas", i)
	}
	for j, id := range p.Replicas {
		if slices.Contains(p.Replicas[:j], id) {
			return fmt.Errorf("partition %d lists replica %s twice", i, id)
		}
	}
	if len(p.ISR) == 0 {
		return fmt.Errorf("partition %d has an empty in-sync set", i)
	}
	for j, x := range p.ISR {
		if !slices.Contains(p.Replicas, x.ID) {
			return fmt.Errorf("partition %d: in-sync %s is not a replica", i, x.ID)
		}
		if p.isrIndex(x.ID) != j {
			return fmt.Errorf("partition %d lists in-sync %s twice", i, x.ID)
		}
		y, ok := m.MemberByID(x.ID)
		if ok && x.Epoch > y.Epoch {
			return fmt.Errorf("partition %d: in-sync %s admitted in epoch %d, after its epoch %d", i, x.ID, x.Epoch, y.Epoch)
		}
		if len(p.ISR) > 1 && (!ok || !y.Live || y.Phase == PhaseLeft) {
			return fmt.Errorf("partition %d: in-sync %s is not live, and not the last in sync", i, x.ID)
		}
	}
	if p.Leader != "" {
		if !p.inSync(p.Leader) {
			return fmt.Errorf("partition %d: leader %s is not in sync", i, p.Leader)
		}
		if _, ok := m.liveByID(p.Leader); !ok {
			return fmt.Errorf("partition %d: leader %s is not live", i, p.Leader)
		}
	}
	return nil
}

// applyPartitions applies a partition command of member x (found: x is a
// member) to n, a clone of the map; it returns why it refused, "" when it
// applied.
func applyPartitions(n *Map, c command, x Member, found bool) string {
	if c.Op != opPartitions && len(n.Partitions) == 0 {
		return c.Op + ": the cluster has no partitions"
	}
	switch c.Op {
	case opPartitions:
		return initPartitions(n, c)
	case opReplicas:
		return setReplicas(n, c)
	}
	// The rest are a leader's commands: its epoch must be live.
	if !found || !x.Live || x.Epoch != c.Epoch || x.ID != c.ID {
		return fmt.Sprintf("%s: %s epoch %d is not live", c.Op, c.Name, c.Epoch)
	}
	next := slices.Clone(n.Partitions)
	seen := make(map[int]bool, len(c.Partitions))
	for _, ch := range c.Partitions {
		if ch.P < 0 || ch.P >= len(next) || seen[ch.P] {
			return fmt.Sprintf("%s: partition %d is out of range or named twice", c.Op, ch.P)
		}
		seen[ch.P] = true
		p := next[ch.P]
		if p.Leader != x.ID || p.LeaderEpoch != ch.LeaderEpoch {
			return fmt.Sprintf("%s: %s does not lead partition %d at leader epoch %d (leader %q at %d)",
				c.Op, c.Name, ch.P, ch.LeaderEpoch, p.Leader, p.LeaderEpoch)
		}
		switch c.Op {
		case opTransfer:
			if why := n.canLead(&p, ch.To, x.ID); why != "" {
				return fmt.Sprintf("transfer partition %d: %s", ch.P, why)
			}
			next[ch.P] = p.led(ch.To)
			next[ch.P].Version++
		case opReclaim:
			next[ch.P] = p.led(x.ID)
			next[ch.P].Version++
		case opISR:
			if p.Version != ch.Version {
				return fmt.Sprintf("isr: partition %d is at version %d, not %d", ch.P, p.Version, ch.Version)
			}
			if why := n.checkISR(&p, ch.ISR); why != "" {
				return fmt.Sprintf("isr: partition %d: %s", ch.P, why)
			}
			next[ch.P] = p.withISR(slices.Clone(ch.ISR))
		default:
			return fmt.Sprintf("unknown op %q", c.Op)
		}
	}
	n.Partitions = next
	return ""
}

// canLead returns why the member with ID to may not take over p from the
// member with ID from, "" when it may: it is another live member of p's
// in-sync set.
func (m *Map) canLead(p *Partition, to, from string) string {
	switch {
	case to == "" || to == from:
		return fmt.Sprintf("no target other than %s", from)
	case !p.inSync(to):
		return fmt.Sprintf("%s is not in sync", to)
	}
	y, ok := m.liveByID(to)
	if !ok {
		return fmt.Sprintf("%s is not live", to)
	}
	if p.ISR[p.isrIndex(to)].Epoch > y.Epoch {
		return fmt.Sprintf("%s was admitted in a later epoch than its own", to)
	}
	return ""
}

// checkISR returns why isr may not replace p's in-sync set, "" when it
// may: it keeps the leader's entry, is a set of p's replicas, keeps every
// entry it keeps unchanged and admits members in their current epoch.
func (m *Map) checkISR(p *Partition, isr []Incarnation) string {
	for j, x := range isr {
		if !slices.Contains(p.Replicas, x.ID) {
			return fmt.Sprintf("%s is not a replica", x.ID)
		}
		if slices.ContainsFunc(isr[:j], func(y Incarnation) bool { return y.ID == x.ID }) {
			return fmt.Sprintf("%s is named twice", x.ID)
		}
		if i := p.isrIndex(x.ID); i >= 0 {
			if p.ISR[i] != x {
				return fmt.Sprintf("%s is in sync as admitted in epoch %d, not %d", x.ID, p.ISR[i].Epoch, x.Epoch)
			}
			continue
		}
		y, ok := m.liveByID(x.ID)
		if !ok || y.Epoch != x.Epoch {
			return fmt.Sprintf("%s epoch %d is not live: only a live epoch is admitted", x.ID, x.Epoch)
		}
	}
	if !slices.ContainsFunc(isr, func(y Incarnation) bool { return y.ID == p.Leader }) {
		return fmt.Sprintf("the leader %s leaves it", p.Leader)
	}
	return ""
}

// initPartitions sets the map's partitions, once: every replica starts in
// sync (they hold nothing yet), and the first live replica of each leads.
func initPartitions(n *Map, c command) string {
	switch {
	case len(n.Partitions) > 0:
		return fmt.Sprintf("partitions: the cluster has %d partitions already", len(n.Partitions))
	case shard.CheckPartitions(len(c.Partitions)) != nil:
		return fmt.Sprintf("partitions: %v", shard.CheckPartitions(len(c.Partitions)))
	case c.MinInsync < 1:
		return fmt.Sprintf("partitions: min-insync %d: want 1 or more", c.MinInsync)
	}
	parts := make([]Partition, len(c.Partitions))
	for i, ch := range c.Partitions {
		if ch.P != i {
			return fmt.Sprintf("partitions: change %d names partition %d", i, ch.P)
		}
		if why := n.checkReplicas(ch.Replicas); why != "" {
			return fmt.Sprintf("partitions: partition %d: %s", i, why)
		}
		p := Partition{Replicas: slices.Clone(ch.Replicas), Version: 1}
		for _, id := range ch.Replicas {
			y, _ := n.MemberByID(id)
			p.ISR = append(p.ISR, Incarnation{ID: id, Epoch: y.Epoch})
			if p.Leader == "" && y.Live {
				p.Leader, p.LeaderEpoch = id, 1
			}
		}
		parts[i] = p
	}
	n.Partitions, n.MinInsync = parts, c.MinInsync
	return ""
}

// checkReplicas returns why ids may not be a replica list, "" when they
// may: one to Replicas+1 distinct members that were not forgotten (one
// more than the setting while a new replica catches up).
func (m *Map) checkReplicas(ids []string) string {
	if len(ids) == 0 || len(ids) > max(m.Settings.Replicas, 1)+1 {
		return fmt.Sprintf("%d replicas: want 1 to %d", len(ids), max(m.Settings.Replicas, 1)+1)
	}
	for j, id := range ids {
		if slices.Contains(ids[:j], id) {
			return fmt.Sprintf("replica %s is named twice", id)
		}
		if y, ok := m.MemberByID(id); !ok || y.Phase == PhaseLeft {
			return fmt.Sprintf("no member with ID %s", id)
		}
	}
	return ""
}

// setReplicas changes replica lists, proposed by the Raft leader (a join,
// a forget, a balance). A list keeps the leader and every in-sync
// replica: one leaves only once it left the in-sync set.
func setReplicas(n *Map, c command) string {
	next := slices.Clone(n.Partitions)
	for _, ch := range c.Partitions {
		if ch.P < 0 || ch.P >= len(next) {
			return fmt.Sprintf("replicas: partition %d is out of range", ch.P)
		}
		p := next[ch.P]
		if p.Version != ch.Version {
			return fmt.Sprintf("replicas: partition %d is at version %d, not %d", ch.P, p.Version, ch.Version)
		}
		if why := n.checkReplicas(ch.Replicas); why != "" {
			return fmt.Sprintf("replicas: partition %d: %s", ch.P, why)
		}
		for _, x := range p.ISR {
			if !slices.Contains(ch.Replicas, x.ID) {
				return fmt.Sprintf("replicas: partition %d: in-sync %s would leave the replicas", ch.P, x.ID)
			}
		}
		p.Replicas = slices.Clone(ch.Replicas)
		p.Version++
		next[ch.P] = p
	}
	n.Partitions = next
	return ""
}

// endPartitions moves what member x held when its epoch ends in n (a
// crash, a graceful stop, or a new process on its data directory): it
// leaves every in-sync set it is not the last member of, and each
// partition it led goes to its target in to (a graceful stop's), or else
// to the first live in-sync replica in the replicas' order, or else to
// none (the partition waits) or, under policy available, to the first
// live replica (unclean). x is already marked not live in n.
func endPartitions(n *Map, x Member, to map[int]string) {
	if len(n.Partitions) == 0 {
		return
	}
	next := slices.Clone(n.Partitions)
	changed := false
	for i := range next {
		p := next[i]
		j := p.isrIndex(x.ID)
		if j < 0 && p.Leader != x.ID {
			continue
		}
		if j >= 0 && len(p.ISR) > 1 {
			p = p.withISR(slices.Delete(slices.Clone(p.ISR), j, j+1))
		}
		if p.Leader == x.ID {
			p = n.elect(p, to[i], x.ID)
		}
		next[i], changed = p, true
	}
	if changed {
		n.Partitions = next
	}
}

// elect returns p with a new leader in place of from: target if it may
// lead, else the first live in-sync replica, else none, or under policy
// available the first live replica, out of sync (unclean).
func (m *Map) elect(p Partition, target, from string) Partition {
	p.Version++
	if target != "" && m.canLead(&p, target, from) == "" {
		return p.led(target)
	}
	for _, id := range p.Replicas {
		if m.canLead(&p, id, from) == "" {
			return p.led(id)
		}
	}
	if m.Settings.Policy == "available" {
		for _, id := range p.Replicas {
			if y, ok := m.liveByID(id); ok && id != from {
				p = p.led(id)
				p.ISR, p.Unclean = []Incarnation{{ID: id, Epoch: y.Epoch}}, true
				return p
			}
		}
	}
	return p.led("")
}

// startPartitions gives member x, whose new epoch just started in n, the
// partitions that waited for it: those whose in-sync set is x alone. Its
// entry names its new epoch. A process whose last stop may have lost
// acknowledged writes (mayHaveLost: no clean stop and a new boot, in a
// mode that does not sync each write) takes none: under policy exact
// those partitions wait for an operator.
func startPartitions(n *Map, x Member, mayHaveLost bool) {
	if len(n.Partitions) == 0 {
		return
	}
	next := slices.Clone(n.Partitions)
	changed := false
	for i := range next {
		p := next[i]
		if p.Leader != "" || len(p.ISR) != 1 || p.ISR[0].ID != x.ID {
			continue
		}
		if mayHaveLost {
			if n.Settings.Policy != "available" {
				continue
			}
			p.Unclean = true
		}
		p = p.withISR([]Incarnation{{ID: x.ID, Epoch: x.Epoch}})
		next[i], changed = p.led(x.ID), true
	}
	if n.Settings.Policy == "available" {
		// Under policy available a partition that waits takes any live
		// replica, out of sync.
		for i := range next {
			p := next[i]
			if p.Leader == "" && slices.Contains(p.Replicas, x.ID) {
				p.ISR, p.Unclean = []Incarnation{{ID: x.ID, Epoch: x.Epoch}}, true
				p.Version++
				next[i], changed = p.led(x.ID), true
			}
		}
	}
	if changed {
		n.Partitions = next
	}
}

// losePartitions drops the member with ID id from every replica list and
// in-sync set of n: it was forgotten, or came back under a new ID (its
// data directory is gone), which then takes its place in the replica
// lists (replacement; "" for none). A partition whose in-sync set was that
// member alone lost its acknowledged records: it gets a tombstone at the
// wall clock at and the first live replica as its leader.
func losePartitions(n *Map, id, replacement string, at int64) {
	if len(n.Partitions) == 0 {
		return
	}
	next := slices.Clone(n.Partitions)
	for i := range next {
		p := next[i]
		r := slices.Index(p.Replicas, id)
		if r < 0 {
			continue
		}
		p.Replicas = slices.Clone(p.Replicas)
		switch {
		case replacement != "" && !slices.Contains(p.Replicas, replacement):
			p.Replicas[r] = replacement
		case len(p.Replicas) > 1:
			p.Replicas = slices.Delete(p.Replicas, r, r+1)
		default:
			// Its only replica: the first other member takes its place
			// (the balancer moves it later).
			other := n.firstOther(id)
			if other == "" {
				continue
			}
			p.Replicas[r] = other
		}
		lost := len(p.ISR) == 1 && p.ISR[0].ID == id
		if j := p.isrIndex(id); j >= 0 && !lost {
			p.ISR = slices.Delete(slices.Clone(p.ISR), j, j+1)
		}
		p.Version++
		if lost {
			p.ISR, p.Tombstone = nil, at
			p.Leader = ""
			for _, rid := range p.Replicas {
				if y, ok := n.liveByID(rid); ok {
					p.ISR = []Incarnation{{ID: rid, Epoch: y.Epoch}}
					p = p.led(rid)
					break
				}
			}
			if p.Leader == "" {
				// No live replica: the first one is in sync (it holds no
				// more than a new replica) and leads once it starts.
				p.ISR = []Incarnation{{ID: p.Replicas[0]}}
				p.LeaderEpoch++
			}
		}
		next[i] = p
	}
	n.Partitions = next
}

// InSync reports whether the member with Raft ID id is in p's in-sync set.
func (p *Partition) InSync(id string) bool { return p.inSync(id) }
