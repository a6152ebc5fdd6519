package cluster

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Phase is where a member of the roster stands.
type Phase uint8

const (
	// PhaseJoined is a member that owns keys, whether it is up or down.
	PhaseJoined Phase = iota + 1
	// PhaseLeaving is a member handing its keys over before it leaves: it
	// owns none, and its keys wait for its handoff.
	PhaseLeaving
	// PhaseLeft is a member that handed every key over and left, or that an
	// operator forgot. It owns nothing and nothing waits for it.
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

// RosterEntry is one member of the roster.
type RosterEntry struct {
	// Name is the member's node name.
	Name string `json:"name"`
	// Incarnation is chosen by the member at each start (and when it was
	// fenced), larger than any of its earlier ones.
	Incarnation uint64 `json:"inc"`
	// Phase is where it stands.
	Phase Phase `json:"phase"`
	// GossipAddr and GRPCAddr are its addresses as last seen: a node that
	// restarts contacts the gossip addresses of the roster to rejoin.
	GossipAddr string `json:"gossip,omitempty"`
	GRPCAddr   string `json:"grpc,omitempty"`
}

// newer reports whether e supersedes o: a later incarnation, or the same
// one further along (joined, then leaving, then left).
func (e RosterEntry) newer(o RosterEntry) bool {
	if e.Incarnation != o.Incarnation {
		return e.Incarnation > o.Incarnation
	}
	return e.Phase > o.Phase
}

// Roster is the cluster's membership as it is meant to be: every node that
// joined and has not left, up or down. It only moves forward: entries merge
// by (incarnation, phase), the larger winning, so every node that has seen
// the same entries holds the same roster whatever the order it saw them
// in. A Roster is immutable; Merge returns a new one.
type Roster struct {
	entries []RosterEntry // sorted by name, one per name
}

// Entries returns the entries sorted by name. Do not modify them.
func (r *Roster) Entries() []RosterEntry {
	if r == nil {
		return nil
	}
	return r.entries
}

// Entry returns the entry of the member named name.
func (r *Roster) Entry(name string) (RosterEntry, bool) {
	if r == nil {
		return RosterEntry{}, false
	}
	i, ok := slices.BinarySearchFunc(r.entries, name, func(e RosterEntry, n string) int { return strings.Compare(e.Name, n) })
	if !ok {
		return RosterEntry{}, false
	}
	return r.entries[i], true
}

// Merge returns the roster with each of es merged in, and whether anything
// changed. An entry with an empty name or an unknown phase is ignored.
func (r *Roster) Merge(es ...RosterEntry) (*Roster, bool) {
	out := &Roster{}
	if r != nil {
		out.entries = r.entries
	}
	changed := false
	for _, e := range es {
		if e.Name == "" || e.Phase < PhaseJoined || e.Phase > PhaseLeft {
			continue
		}
		i, ok := slices.BinarySearchFunc(out.entries, e.Name, func(x RosterEntry, n string) int { return strings.Compare(x.Name, n) })
		switch {
		case !ok:
			out.entries = slices.Insert(slices.Clone(out.entries), i, e)
		case e.newer(out.entries[i]):
			out.entries = slices.Clone(out.entries)
			out.entries[i] = e
		case e.Incarnation == out.entries[i].Incarnation && e.Phase == out.entries[i].Phase &&
			(e.GossipAddr != "" && e.GossipAddr != out.entries[i].GossipAddr || e.GRPCAddr != "" && e.GRPCAddr != out.entries[i].GRPCAddr):
			// The same member at new addresses.
			out.entries = slices.Clone(out.entries)
			out.entries[i] = e
		default:
			continue
		}
		changed = true
	}
	if !changed {
		return r, false
	}
	return out, true
}

// Owners returns the names of the members that own keys (phase joined),
// sorted.
func (r *Roster) Owners() []string {
	var names []string
	for _, e := range r.Entries() {
		if e.Phase == PhaseJoined {
			names = append(names, e.Name)
		}
	}
	return names
}

// encode returns the roster as JSON, for the disk and for gossip.
func (r *Roster) encode() []byte {
	b, err := json.Marshal(r.Entries())
	if err != nil {
		panic(fmt.Sprintf("cluster: encode roster: %v", err)) // strings and numbers only
	}
	return b
}

// decodeRoster reads entries written by encode.
func decodeRoster(b []byte) ([]RosterEntry, error) {
	var es []RosterEntry
	if err := json.Unmarshal(b, &es); err != nil {
		return nil, fmt.Errorf("cluster: decode roster: %w", err)
	}
	return es, nil
}
