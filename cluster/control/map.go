package control

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice/shard"
)

// Phase is where a member of the map stands.
type Phase uint8

const (
	// PhaseJoined is a member that owns keys, up or down.
	PhaseJoined Phase = iota + 1
	// PhaseLeaving is a member handing its keys over before it stops (with
	// one replica, where its keys have no copy): it owns none, and keys
	// that were its own wait for its handoff.
	PhaseLeaving
	// PhaseLeft is a member an operator forgot: it owns nothing and nothing
	// waits for it. It joins again as a new member if it comes back.
	PhaseLeft
)

func (p Phase) String() string {
	switch p {
	case PhaseJoined:
		return "joined"
	case PhaseLeaving:
		return "leaving"
	case PhaseLeft:
		return "left"
	}
	return "unknown"
}

// Settings are the cluster-wide settings every member must share. They
// are fixed when the cluster is bootstrapped; a node started with other
// values is refused.
type Settings struct {
	// Replicas is how many members keep each key: 1, or 2 (a standby);
	// with partitions, how many keep each partition.
	Replicas int `json:"replicas"`
	// Policy is "exact" or "available": what happens to the keys of a
	// member whose epoch ended without complete copies.
	Policy string `json:"policy"`
	// Lease is L, how long a lease runs after the renewal was sent.
	Lease time.Duration `json:"lease"`
	// Partitions is how many partitions the keys fall in (see
	// partition.go): 0 for none, else a power of two. The Raft leader sets
	// the partitions' records once the first members are live.
	Partitions int `json:"partitions,omitempty"`
	// MinInsync is how many in-sync replicas a partition needs to
	// acknowledge a write: 1 to Replicas, default 1; only with partitions.
	MinInsync int `json:"min_insync,omitempty"`
}

// Validate returns an error naming every setting of s that is not valid,
// nil when they all are. Zero values stand for their defaults.
func (s Settings) Validate() error {
	var errs []error
	if s.Policy != "" && s.Policy != "exact" && s.Policy != "available" {
		errs = append(errs, fmt.Errorf("control: settings: --owner-policy %q: want exact or available", s.Policy))
	}
	replicas := max(s.Replicas, 1)
	switch {
	case s.Partitions == 0 && s.MinInsync != 0:
		errs = append(errs, fmt.Errorf("control: settings: --min-insync %d without --partitions: it counts a partition's replicas, and the cluster has none", s.MinInsync))
	case s.Partitions == 0:
	case shard.CheckPartitions(s.Partitions) != nil:
		errs = append(errs, fmt.Errorf("control: settings: --partitions %d: want 0 (none) or a power of two up to %d", s.Partitions, shard.MaxPartitions))
	case s.MinInsync < 0 || s.MinInsync > replicas:
		errs = append(errs, fmt.Errorf("control: settings: --min-insync %d with --replicas %d: want 1 to %d (a partition has %d replicas)", s.MinInsync, replicas, replicas, replicas))
	case replicas == 2 && s.MinInsync == 2:
		// Every restart takes one replica of a pair out of the in-sync
		// set until it caught up: with both needed, the partitions it
		// replicates would refuse every write meanwhile.
		errs = append(errs, errors.New("control: settings: --replicas 2 with --min-insync 2: a restart of one node would refuse writes on every partition it replicates until it caught up; use --min-insync 1, or --replicas 3 with --min-insync 2"))
	}
	return errors.Join(errs...)
}

// Mismatch returns a sentence naming the first setting in which o differs
// from s (the cluster's), "" when they agree.
func (s Settings) Mismatch(o Settings) string {
	switch {
	case s.Replicas != o.Replicas:
		return fmt.Sprintf("--replicas %d, but the cluster runs with --replicas %d", o.Replicas, s.Replicas)
	case s.Policy != o.Policy:
		return fmt.Sprintf("--owner-policy %s, but the cluster runs with --owner-policy %s", o.Policy, s.Policy)
	case s.Lease != o.Lease:
		return fmt.Sprintf("a lease of %v, but the cluster runs with %v", o.Lease, s.Lease)
	case s.Partitions != o.Partitions:
		return fmt.Sprintf("--partitions %d, but the cluster runs with --partitions %d", o.Partitions, s.Partitions)
	case s.MinInsync != o.MinInsync:
		return fmt.Sprintf("--min-insync %d, but the cluster runs with --min-insync %d", o.MinInsync, s.MinInsync)
	}
	return ""
}

// String encodes the settings in a few bytes, for gossip metadata:
// r<replicas>,<policy>,<lease>ms, then p<partitions>,i<min-insync> when
// the cluster has partitions. Without partitions it is the form nodes
// of earlier versions parse.
func (s Settings) String() string {
	str := fmt.Sprintf("r%d,%s,%dms", s.Replicas, s.Policy, s.Lease.Milliseconds())
	if s.Partitions != 0 {
		str += fmt.Sprintf(",p%d,i%d", s.Partitions, s.MinInsync)
	}
	return str
}

// ParseSettings reads what String wrote.
func ParseSettings(str string) (Settings, error) {
	var s Settings
	var ms int64
	parts := strings.Split(str, ",")
	if len(parts) != 3 && len(parts) != 5 {
		return s, fmt.Errorf("control: settings %q: want r<replicas>,<policy>,<lease>ms, then p<partitions>,i<min-insync> with partitions", str)
	}
	if _, err := fmt.Sscanf(parts[0], "r%d", &s.Replicas); err != nil {
		return s, fmt.Errorf("control: settings %q: replicas: %v", str, err)
	}
	s.Policy = parts[1]
	if _, err := fmt.Sscanf(parts[2], "%dms", &ms); err != nil {
		return s, fmt.Errorf("control: settings %q: lease: %v", str, err)
	}
	s.Lease = time.Duration(ms) * time.Millisecond
	if len(parts) == 5 {
		var ok bool
		// String writes this form only with partitions, and a cluster
		// with partitions has a min-insync.
		if s.Partitions, ok = positive(parts[3], "p"); !ok {
			return s, fmt.Errorf("control: settings %q: partitions: want p<N>, N from 1", str)
		}
		if s.MinInsync, ok = positive(parts[4], "i"); !ok {
			return s, fmt.Errorf("control: settings %q: min-insync: want i<N>, N from 1", str)
		}
	}
	return s, nil
}

// positive returns the number after prefix in str, if str is prefix and
// a number from 1, nothing else.
func positive(str, prefix string) (int, bool) {
	digits, ok := strings.CutPrefix(str, prefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n >= 1 && digits[0] != '+'
}

// Addrs are where a member serves.
type Addrs struct {
	// Gossip is its memberlist address (IP:port).
	Gossip string `json:"gossip,omitempty"`
	// GRPC is its decisions API.
	GRPC string `json:"grpc,omitempty"`
	// Peer is its peer service and Raft transport.
	Peer string `json:"peer,omitempty"`
	// Admin is its admin service.
	Admin string `json:"admin,omitempty"`
}

// Member is one member of the cluster map.
type Member struct {
	// Name is the node's name: rendezvous hashing of keys uses it.
	Name string `json:"name"`
	// ID is the member's Raft server ID, a UUID created with its data
	// directory: a node that lost its data directory comes back under a new
	// ID, as a new member with the same name.
	ID string `json:"id"`
	// Zone is the failure domain the node says it runs in (may be empty);
	// voters are spread across zones.
	Zone string `json:"zone,omitempty"`
	// Addrs are its addresses as it announced them.
	Addrs Addrs `json:"addrs"`
	// Phase is where it stands.
	Phase Phase `json:"phase"`
	// Epoch is its current epoch, or its last one when not Live. Every
	// process start takes a new epoch; epochs only grow, cluster-wide.
	Epoch uint64 `json:"epoch,omitempty"`
	// Live reports that Epoch has not ended: the member may hold a lease
	// and decide keys.
	Live bool `json:"live,omitempty"`
	// Releasable is set when Epoch ended while its standbys held every
	// acknowledged hit of its keys (Synced was at least the last change):
	// its keys go on from those copies. An epoch that ended without it
	// keeps its keys waiting for the member to come back (policy exact).
	Releasable bool `json:"releasable,omitempty"`
	// Synced is the map version (a Changed value) at which the member last
	// brought every standby of its keys up to date, with at least one other
	// member live; 0 if never in this epoch.
	Synced uint64 `json:"synced,omitempty"`
	// Lost is set when the member came back under a new ID (its data
	// directory is gone) after an epoch that ended without complete
	// copies: before it decides its keys it waits for every member that
	// may hold a copy of them. Cleared by its first Synced.
	Lost bool `json:"lost,omitempty"`
}

// Tombstone records a member forgotten while it held keys that have no
// complete copy elsewhere: whoever decides one of those keys, whatever its
// rank and whenever it joined or came back, denies it for one window of
// the key's limit, so that the hits the forgotten member allowed and the
// ones allowed after it never share a window.
type Tombstone struct {
	// Name and ID are the forgotten member's.
	Name string `json:"name"`
	ID   string `json:"id"`
	// At is the leader's wall clock, Unix nanoseconds, when it was
	// forgotten; the map drops the tombstone after the longest window.
	At int64 `json:"at"`
	// Ring is the ownership ring when the member was forgotten, the member
	// itself left out: which keys it held is a function of it (see
	// RingMember), not of who is a member now. Empty in tombstones written
	// before it was recorded: those bear on the keys for which the
	// forgotten member ranks before the deciding node.
	Ring []RingMember `json:"ring,omitempty"`
}

// RingMember is a member a key's rendezvous order ran over when a
// tombstone was made. A key's state was with the forgotten member if,
// walking the key's order over the ring and the forgotten member, the
// forgotten member comes before every member that does not pass.
type RingMember struct {
	Name string `json:"name"`
	// Passes is set for a member that was down with complete copies of
	// its keys elsewhere (or down at all, under the available policy): a
	// key's order walked past it. A member that was up acted for the keys
	// it ranks first for; one that was down without complete copies kept
	// them waiting.
	Passes bool `json:"passes,omitempty"`
}

// TombstoneKey identifies a tombstone (a Tombstone holds a slice, so it
// cannot be a map key itself).
type TombstoneKey struct {
	Name, ID string
	At       int64
}

// Key returns t's key.
func (t Tombstone) Key() TombstoneKey { return TombstoneKey{t.Name, t.ID, t.At} }

// tombstoneLife is how long a tombstone is kept: longer than the longest
// window the engine takes (actor.DefaultMaxWindow, ten years).
const tombstoneLife = 3651 * 24 * time.Hour

// Map is the cluster map: what every node agrees on, in the order the Raft
// log applied it. A Map is immutable; the state machine builds a new one on
// every change.
type Map struct {
	// Version is the Raft index of the last entry that changed the map.
	Version uint64 `json:"version"`
	// Changed is the Version of the last membership change (a member added,
	// an epoch started or ended, a phase changed): the version standby
	// copies are measured against.
	Changed uint64 `json:"changed"`
	// ClusterID names the cluster, set once at bootstrap.
	ClusterID string `json:"cluster_id"`
	// Settings are the cluster-wide settings.
	Settings Settings `json:"settings"`
	// Members are sorted by name, one per name.
	Members []Member `json:"members"`
	// Tombstones are forgotten members whose keys had no complete copy.
	Tombstones []Tombstone `json:"tombstones,omitempty"`
	// LastEpoch is the largest epoch handed out.
	LastEpoch uint64 `json:"last_epoch"`
	// Partitions are the partitions' records, indexed by partition (see
	// partition.go); empty until they are set, once.
	Partitions []Partition `json:"partitions,omitempty"`
	// MinInsync is how many in-sync replicas a partition needs to
	// acknowledge a write.
	MinInsync int `json:"min_insync,omitempty"`
}

// Member returns the member named name.
func (m *Map) Member(name string) (Member, bool) {
	if m == nil {
		return Member{}, false
	}
	i, ok := slices.BinarySearchFunc(m.Members, name, func(x Member, n string) int { return strings.Compare(x.Name, n) })
	if !ok {
		return Member{}, false
	}
	return m.Members[i], true
}

// MemberByID returns the member whose Raft ID is id.
func (m *Map) MemberByID(id string) (Member, bool) {
	if m == nil {
		return Member{}, false
	}
	for _, x := range m.Members {
		if x.ID == id {
			return x, true
		}
	}
	return Member{}, false
}

// Owners returns the names of the members that own keys (phase joined,
// up or down), sorted.
func (m *Map) Owners() []string {
	var names []string
	for _, x := range m.members() {
		if x.Phase == PhaseJoined {
			names = append(names, x.Name)
		}
	}
	return names
}

// LiveMembers returns the members whose epoch is live (any phase but
// left), sorted by name.
func (m *Map) LiveMembers() []Member {
	var out []Member
	for _, x := range m.members() {
		if x.Live && x.Phase != PhaseLeft {
			out = append(out, x)
		}
	}
	return out
}

func (m *Map) members() []Member {
	if m == nil {
		return nil
	}
	return m.Members
}

// clone returns a copy of m whose slices may be changed.
func (m *Map) clone() *Map {
	n := *m
	n.Members = slices.Clone(m.Members)
	n.Tombstones = slices.Clone(m.Tombstones)
	return &n
}

// put stores x, replacing the member of the same name.
func (m *Map) put(x Member) {
	i, ok := slices.BinarySearchFunc(m.Members, x.Name, func(y Member, n string) int { return strings.Compare(y.Name, n) })
	if ok {
		m.Members[i] = x
		return
	}
	m.Members = slices.Insert(m.Members, i, x)
}

// otherLive reports whether a member other than name has a live epoch and
// owns keys.
func (m *Map) otherLive(name string) bool {
	for _, x := range m.Members {
		if x.Name != name && x.Live && x.Phase == PhaseJoined {
			return true
		}
	}
	return false
}
