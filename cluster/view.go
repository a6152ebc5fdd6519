package cluster

import (
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice/shard"
)

// State is a member's state as this node last heard it.
type State uint8

const (
	// StateAlive is a live member.
	StateAlive State = iota + 1
	// StateLeft is a member that left gossip gracefully.
	StateLeft
	// StateDead is a member that failure detection declared dead, or that
	// left without announcing it first.
	StateDead
)

func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateLeft:
		return "left"
	case StateDead:
		return "dead"
	}
	return "unknown"
}

// Live reports whether a member in state s is part of the live view.
func (s State) Live() bool { return s == StateAlive }

// Member is one node of the cluster as this node sees it.
type Member struct {
	// Name is the node's unique, stable name; ownership hashes it.
	Name string
	// GossipAddr is the IP:port the node gossips on.
	GossipAddr string
	// GRPCAddr is the host:port of the node's gRPC API (decisions).
	GRPCAddr string
	// PeerAddr is the host:port of its peer service and Raft, which peers
	// dial to forward checks, hand state over, copy writes, renew leases
	// and replicate the log: GRPCAddr unless the node serves it on a
	// listener of its own.
	PeerAddr string
	// AdminAddr is the host:port of its admin service, which the other
	// nodes dial for the admin calls they fan out: GRPCAddr unless the
	// node serves it on a listener of its own.
	AdminAddr string
	// State is the member's state.
	State State
	// Started is when the node's process started its membership. A member
	// seen again under the same name with another Started is a new process:
	// it restarted, whatever its address.
	Started time.Time
	// ID is its Raft server ID, drawn with its data directory.
	ID string
	// ClusterID is the cluster it announces it belongs to, "" until it
	// joined one.
	ClusterID string
	// Raft says whether it has Raft state; Boot is the digest of its
	// bootstrap set (see control.Peer).
	Raft bool
	Boot string
	// Expect, Settings and Zone are what it announces: its --expect, its
	// cluster-wide settings and its failure domain.
	Expect   int
	Settings string
	Zone     string
}

// ChangeKind says what changed a view.
type ChangeKind uint8

const (
	// ChangeJoined: a member joined, or came back after being declared dead
	// or leaving.
	ChangeJoined ChangeKind = iota + 1
	// ChangeUpdated: a live member's metadata changed (an address, or the
	// cluster it belongs to).
	ChangeUpdated
	// ChangeLeft: a member left gracefully.
	ChangeLeft
	// ChangeFailed: a member was declared dead.
	ChangeFailed
)

func (k ChangeKind) String() string {
	switch k {
	case ChangeJoined:
		return "joined"
	case ChangeUpdated:
		return "updated"
	case ChangeLeft:
		return "left"
	case ChangeFailed:
		return "failed"
	}
	return "unknown"
}

// View is an immutable snapshot of the members gossip sees alive, as this
// node saw them at one moment. Gossip only finds members and suspects
// failures: who owns which key is the cluster map's (package control).
// Views are shared: never modify one or its Members.
type View struct {
	// Epoch numbers this node's views: it increases by at least one with
	// every change of the live members or of their metadata, and never goes
	// back while the process runs. It is local: two nodes' epochs are not
	// comparable, and a restarted node counts from 1 again.
	Epoch uint64
	// Members are the live members sorted by name, each name once.
	Members []Member

	hashes []uint64 // shard.NodeHash of each member's name, same order
}

// NewView returns a view of the given members at epoch, keeping those that
// are live, sorted by name. When a name appears twice, the first wins. It
// copies members.
func NewView(epoch uint64, members []Member) *View {
	live := make([]Member, 0, len(members))
	for _, m := range members {
		if m.State.Live() {
			live = append(live, m)
		}
	}
	slices.SortStableFunc(live, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	live = slices.CompactFunc(live, func(a, b Member) bool { return a.Name == b.Name })
	v := &View{Epoch: epoch, Members: live, hashes: make([]uint64, len(live))}
	for i, m := range live {
		v.hashes[i] = shard.NodeHash(m.Name)
	}
	return v
}

// Len returns the number of live members.
func (v *View) Len() int { return len(v.Members) }

// Owner returns the member that owns key: the one with the highest
// rendezvous score (shard.Score of the key's hash and the member name's
// hash), ties going to the smallest name. It returns the zero Member when
// the view is empty. It does not allocate.
func (v *View) Owner(key string) Member {
	i := shard.Owner(shard.Hash(key), v.hashes)
	if i < 0 {
		return Member{}
	}
	return v.Members[i]
}

// OwnerIndex returns the index in Members of the owner of the key whose
// shard.Hash is keyHash, or -1 when the view is empty.
func (v *View) OwnerIndex(keyHash uint64) int { return shard.Owner(keyHash, v.hashes) }

// Member returns the live member with the given name.
func (v *View) Member(name string) (Member, bool) {
	i, ok := slices.BinarySearchFunc(v.Members, name, func(m Member, n string) int { return strings.Compare(m.Name, n) })
	if !ok {
		return Member{}, false
	}
	return v.Members[i], true
}
