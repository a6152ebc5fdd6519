package cluster

import (
	"slices"
	"time"
)

// What the operator's view (the web UI, `sluice top`) asks of the cluster
// beyond ownership: a key's standby, and the membership changes this node
// saw lately.

// Standby returns the member that holds a copy of key's state, "" when
// keys have no standby (RouterConfig.Replicas 1) or the key has nobody
// acting for it.
func (r *Router) Standby(key string) string {
	own := r.own.Load()
	if own == nil {
		return ""
	}
	return own.cur.standby(key)
}

// maxChanges bounds the changes Changes remembers.
const maxChanges = 32

// Change is one change of the live members that this node saw.
type Change struct {
	// At is when this node saw it (its wall clock).
	At time.Time
	// Epoch is the epoch of the view the change made.
	Epoch uint64
	// Kind says what changed.
	Kind ChangeKind
	// Member is the member that changed, State its new state, Members the
	// live members after it.
	Member  string
	State   State
	Members int
}

// recordChangeLocked remembers a change, forgetting the oldest beyond
// maxChanges. Called with stateMu held.
func (m *Membership) recordChangeLocked(kind ChangeKind, mem Member, v *View) {
	if len(m.changes) == maxChanges {
		m.changes = slices.Delete(m.changes, 0, 1)
	}
	m.changes = append(m.changes, Change{At: time.Now(), Epoch: v.Epoch, Kind: kind, Member: mem.Name, State: mem.State, Members: v.Len()})
}

// Changes returns the last changes of the live members this node saw
// (its own joining among them), oldest first: at most 32.
func (m *Membership) Changes() []Change {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	return slices.Clone(m.changes)
}

// What the admin API and the operator's view ask of gossip, through the
// router: nothing for a single node, nor before the node joined.

// Peers returns the names of the other live members, as gossip sees them
// now: the members an admin call fans out to.
func (r *Router) Peers() []string {
	if !r.joined() {
		return nil
	}
	var names []string
	for _, m := range r.members().View().Members {
		if m.Name != r.cfg.Self {
			names = append(names, m.Name)
		}
	}
	return names
}

// Gossip returns every node gossip knows, live or not (see
// Membership.Nodes).
func (r *Router) Gossip() []Member {
	if !r.joined() {
		return nil
	}
	return r.members().Nodes()
}

// ViewEpoch returns the epoch of gossip's current view of the live
// members, 0 for a single node.
func (r *Router) ViewEpoch() uint64 {
	if !r.joined() {
		return 0
	}
	return r.members().Epoch()
}

// Changes returns the last changes of the live members this node saw,
// oldest first (see Membership.Changes); none for a single node.
func (r *Router) Changes() []Change {
	if !r.joined() {
		return nil
	}
	return r.members().Changes()
}
