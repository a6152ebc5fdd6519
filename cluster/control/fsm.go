package control

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// Ops of the commands the Raft log carries.
const (
	opInit    = "init"    // set the cluster ID and settings, once
	opAdd     = "add"     // add a member, or give a name a new ID
	opAddrs   = "addrs"   // a member's new addresses
	opStart   = "start"   // a member's process starts a new epoch
	opLeaving = "leaving" // a member hands its keys over before it stops
	opEnd     = "end"     // a member's epoch ends
	opSynced  = "synced"  // a member brought its standbys up to date
	opForget  = "forget"  // an operator removes a member whose epoch ended
	opDrop    = "drop"    // tombstones older than a year go

	opPartitions = "partitions" // set the partitions, once
	opReplicas   = "replicas"   // the Raft leader changes replica lists
	opTransfer   = "transfer"   // a leader hands partitions to in-sync replicas
	opReclaim    = "reclaim"    // a leader leads on at the next leader epoch
	opISR        = "isr"        // a leader changes in-sync sets
)

// command is one entry of the Raft log: an op and its arguments.
type command struct {
	Op        string   `json:"op"`
	Name      string   `json:"name,omitempty"`
	ID        string   `json:"id,omitempty"`
	Zone      string   `json:"zone,omitempty"`
	Addrs     Addrs    `json:"addrs,omitzero"`
	Epoch     uint64   `json:"epoch,omitempty"`
	Version   uint64   `json:"version,omitempty"`
	ClusterID string   `json:"cluster_id,omitempty"`
	Settings  Settings `json:"settings,omitzero"`
	// At is the proposer's wall clock, Unix nanoseconds (forget, drop, and
	// add: a member back under a new ID may leave partitions tombstoned).
	At int64 `json:"at,omitempty"`
	// Graceful marks an end the member asked for itself.
	Graceful bool `json:"graceful,omitempty"`
	// Partitions are the partitions a partition command changes, or where
	// a graceful end hands the partitions the member led.
	Partitions []PartitionChange `json:"partitions,omitempty"`
	// MinInsync is the partitions' min-insync (partitions).
	MinInsync int `json:"min_insync,omitempty"`
	// MayHaveLost marks a start whose data directory may have lost
	// acknowledged writes (no clean stop, and the machine rebooted).
	MayHaveLost bool `json:"may_have_lost,omitempty"`
}

func (c command) encode() []byte {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("control: encode command: %v", err)) // strings and numbers only
	}
	return b
}

// Result is what applying a command returned: the epoch a start took, or
// why the command changed nothing.
type Result struct {
	Epoch uint64 `json:"epoch,omitempty"`
	// Version is the Raft index the command was applied at.
	Version uint64 `json:"version,omitempty"`
	Err     string `json:"err,omitempty"`
}

func (r Result) err() error {
	if r.Err == "" {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrRefused, r.Err)
}

// fsm is the Raft state machine: it applies commands to the cluster map
// and publishes each new map. Raft calls Apply, Snapshot and Restore from
// one goroutine; readers load the map without locks.
type fsm struct {
	log     *slog.Logger
	cur     atomic.Pointer[Map]
	mu      sync.Mutex // serialises publish with subscribers
	changed chan struct{}
}

func newFSM(log *slog.Logger) *fsm {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &fsm{log: log, changed: make(chan struct{})}
	f.cur.Store(&Map{})
	return f
}

// current returns the latest applied map and a channel closed when a newer
// one is published.
func (f *fsm) current() (*Map, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur.Load(), f.changed
}

func (f *fsm) publish(m *Map) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur.Store(m)
	close(f.changed)
	f.changed = make(chan struct{})
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) any {
	var c command
	if err := json.Unmarshal(l.Data, &c); err != nil {
		return Result{Err: fmt.Sprintf("undecodable command: %v", err)}
	}
	next, res := apply(f.cur.Load(), c, l.Index)
	if next != nil {
		f.publish(next)
	}
	f.log.Debug("applied", "index", l.Index, "op", c.Op, "member", c.Name, "epoch", c.Epoch, "changed", next != nil, "refused", res.Err)
	res.Version = l.Index
	return res
}

// apply returns the map after command c at Raft index index (nil when c
// changes nothing) and the command's result. It is deterministic: it reads
// nothing but m, c and index.
func apply(m *Map, c command, index uint64) (*Map, Result) {
	refuse := func(format string, args ...any) (*Map, Result) {
		return nil, Result{Err: fmt.Sprintf(format, args...)}
	}
	if c.Op != opInit && m.ClusterID == "" {
		return refuse("the cluster is not initialised")
	}
	n := m.clone()
	n.Version = index
	change := func() { n.Changed = index }
	x, found := m.Member(c.Name)
	switch c.Op {
	case opInit:
		if m.ClusterID != "" {
			return refuse("the cluster is initialised already (%s)", m.ClusterID)
		}
		if c.ClusterID == "" {
			return refuse("init without a cluster ID")
		}
		n.ClusterID, n.Settings = c.ClusterID, c.Settings
	case opAdd:
		switch {
		case c.Name == "" || c.ID == "":
			return refuse("add: a member needs a name and an ID")
		case found && x.ID == c.ID && x.Phase != PhaseLeft:
			if x.Addrs == c.Addrs && x.Zone == c.Zone {
				return nil, Result{}
			}
			x.Addrs, x.Zone = c.Addrs, c.Zone
			n.put(x)
		case found && x.ID != c.ID && x.Live && x.Phase != PhaseLeft:
			return refuse("add %s under ID %s: its epoch %d under ID %s has not ended", c.Name, c.ID, x.Epoch, x.ID)
		case found && x.ID != c.ID && x.Phase != PhaseLeft:
			// The name's data directory is gone: a new member under the
			// same name. Its keys go on as its last epoch's end allows;
			// without complete copies the new member waits for every
			// member before it decides them (Lost).
			lost := !x.Releasable
			old := x.ID
			x = Member{Name: c.Name, ID: c.ID, Zone: c.Zone, Addrs: c.Addrs, Phase: PhaseJoined, Epoch: x.Epoch,
				Releasable: x.Releasable, Lost: lost}
			n.put(x)
			losePartitions(n, old, c.ID, c.At)
			change()
		default:
			// New, or back after it was forgotten: it holds nothing the
			// others lack, so nothing waits for it until it starts.
			n.put(Member{Name: c.Name, ID: c.ID, Zone: c.Zone, Addrs: c.Addrs, Phase: PhaseJoined, Epoch: x.Epoch, Releasable: true})
			change()
		}
	case opAddrs:
		if !found || x.ID != c.ID {
			return refuse("addrs: no member %s with ID %s", c.Name, c.ID)
		}
		if x.Addrs == c.Addrs {
			return nil, Result{}
		}
		x.Addrs = c.Addrs
		n.put(x)
	case opStart:
		switch {
		case !found || x.ID != c.ID:
			return refuse("start: no member %s with ID %s", c.Name, c.ID)
		case x.Phase == PhaseLeft:
			return refuse("start: %s was forgotten; it joins again first", c.Name)
		}
		if x.Live {
			// The member's previous process is gone (its successor holds
			// its data directory): its epoch ends here.
			x.Releasable = releasable(m, x)
			x.Live = false
			n.put(x)
			endPartitions(n, x, nil)
		}
		n.LastEpoch++
		x.Epoch, x.Live, x.Synced, x.Phase = n.LastEpoch, true, 0, PhaseJoined
		n.put(x)
		startPartitions(n, x, c.MayHaveLost)
		change()
		return n, Result{Epoch: x.Epoch}
	case opLeaving:
		if !found || !x.Live || x.Epoch != c.Epoch {
			return refuse("leaving: %s epoch %d is not live", c.Name, c.Epoch)
		}
		if x.Phase == PhaseLeaving {
			return nil, Result{}
		}
		x.Phase = PhaseLeaving
		n.put(x)
		change()
	case opEnd:
		if !found || !x.Live || x.Epoch != c.Epoch {
			return refuse("end: %s epoch %d is not live", c.Name, c.Epoch)
		}
		x.Releasable = releasable(m, x)
		x.Live = false
		n.put(x)
		var to map[int]string
		if c.Graceful {
			to = make(map[int]string, len(c.Partitions))
			for _, ch := range c.Partitions {
				to[ch.P] = ch.To
			}
		}
		endPartitions(n, x, to)
		change()
	case opSynced:
		switch {
		case !found || !x.Live || x.Epoch != c.Epoch:
			return refuse("synced: %s epoch %d is not live", c.Name, c.Epoch)
		case c.Version < m.Changed:
			return refuse("synced: version %d is older than the last change %d", c.Version, m.Changed)
		case x.Synced >= c.Version:
			return nil, Result{}
		}
		x.Lost = false
		if m.otherLive(x.Name) {
			x.Synced = c.Version
		}
		n.put(x)
	case opForget:
		switch {
		case !found || x.Phase == PhaseLeft:
			return refuse("forget: no member %s", c.Name)
		case x.Live:
			return refuse("forget: %s epoch %d has not ended", c.Name, x.Epoch)
		}
		if !x.Releasable {
			n.Tombstones = append(n.Tombstones, Tombstone{Name: x.Name, ID: x.ID, At: c.At, Ring: ringWithout(m, x.Name)})
		}
		x.Phase = PhaseLeft
		n.put(x)
		losePartitions(n, x.ID, "", c.At)
		change()
	case opDrop:
		kept := n.Tombstones[:0]
		for _, t := range n.Tombstones {
			if c.At-t.At < int64(tombstoneLife) {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(m.Tombstones) {
			return nil, Result{}
		}
		n.Tombstones = kept
	case opPartitions, opReplicas, opTransfer, opReclaim, opISR:
		if why := applyPartitions(n, c, x, found); why != "" {
			return refuse("%s", why)
		}
	default:
		return refuse("unknown op %q", c.Op)
	}
	return n, Result{}
}

// ringWithout returns the ownership ring of m without the member named
// name, for a tombstone: the members a key's rendezvous order runs over
// (as the cluster package builds it: the owners, up or down, and members
// that left phase joined without handing every key over) and whether a
// key's order walks past each.
func ringWithout(m *Map, name string) []RingMember {
	available := m.Settings.Policy == "available"
	var out []RingMember
	for _, x := range m.Members {
		inRing := x.Phase == PhaseJoined || x.Phase == PhaseLeaving && !x.Live && !x.Releasable && !available
		if x.Name == name || !inRing {
			continue
		}
		up := x.Live && x.Phase == PhaseJoined
		out = append(out, RingMember{Name: x.Name, Passes: !up && (available || x.Releasable && x.Phase == PhaseJoined)})
	}
	return out
}

// releasable reports whether x's epoch, ending now in m, leaves complete
// copies of its keys: with standbys, x brought them up to date since the
// last change (and every write after was acknowledged only once its
// standby had it); with one replica, x was leaving and handed every key
// over since the last change.
func releasable(m *Map, x Member) bool {
	if x.Synced == 0 || x.Synced < m.Changed {
		return false
	}
	return m.Settings.Replicas >= 2 || x.Phase == PhaseLeaving
}

// Snapshot implements raft.FSM.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return snapshot{f.cur.Load()}, nil
}

// Restore implements raft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var m Map
	if err := json.NewDecoder(rc).Decode(&m); err != nil {
		return fmt.Errorf("control: restore the cluster map: %w", err)
	}
	f.publish(&m)
	return nil
}

type snapshot struct{ m *Map }

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.m); err != nil {
		sink.Cancel()
		return fmt.Errorf("control: snapshot the cluster map: %w", err)
	}
	return sink.Close()
}

func (snapshot) Release() {}
