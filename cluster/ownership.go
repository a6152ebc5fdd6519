package cluster

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/shard"
)

// Errors a node gives when it may not decide a key now. Each maps to
// UNAVAILABLE for the client, with the error's text as the reason.
var (
	// ErrNoQuorum means this node holds no lease: it has no epoch yet, it
	// is cut off from the Raft leader, or the leader cannot reach a quorum
	// of voters.
	ErrNoQuorum = errors.New("cluster: no quorum")
	// ErrMoving means the key's ownership is moving: its state has not
	// arrived yet, or two nodes' maps differ for a moment.
	ErrMoving = errors.New("cluster: ownership moving")
	// ErrOwnerDown means the member that holds the key's latest state is
	// down and nobody else may decide the key: under the exact policy its
	// keys wait for it.
	ErrOwnerDown = errors.New("cluster: owner down")
)

// Policy says what happens to the keys of a member whose epoch ended
// without complete copies of them elsewhere.
type Policy uint8

const (
	// PolicyExact (the default) keeps such keys for the member: nobody
	// decides them until it is back, since their state is out of reach.
	PolicyExact Policy = iota
	// PolicyAvailable lets the next member of each key's rendezvous order
	// decide them, from whatever state it holds (none, without a copy). A
	// key may then allow up to one extra limit in a window.
	PolicyAvailable
)

func (p Policy) String() string {
	if p == PolicyAvailable {
		return "available"
	}
	return "exact"
}

// ParsePolicy parses "exact" or "available".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "exact", "":
		return PolicyExact, nil
	case "available":
		return PolicyAvailable, nil
	}
	return 0, fmt.Errorf("cluster: policy %q: want exact or available", s)
}

// config is one configuration of ownership: a cluster map as this node
// applied it. Who acts for a key and who keeps its copy are pure functions
// of the map (see acting and standby), so two nodes that applied the same
// membership change agree on both. It is immutable.
type config struct {
	self     string
	policy   Policy
	replicas int
	m        *control.Map
	// ring are the members a key's rendezvous order runs over: the owners
	// (phase joined, up or down), and members that left phase joined
	// without handing every key over (leaving, ended without copies),
	// whose keys wait for them. Sorted by name; hashes in the same order.
	ring   []string
	hashes []uint64
	// upAt[i] is up(ring[i]), computed once: copyOf asks it of every ring
	// member for every record of a write.
	upAt []bool
	// members are the map's members by name.
	members map[string]control.Member
	// id identifies the configuration: the version of the map's last
	// membership change. Two nodes at the same id agree on every key.
	id uint64
	// epochs are the epochs of the live members in this configuration.
	epochs map[string]uint64
	// parts are the map's partitions, nil when it has none: then a key's
	// acting member is its partition's leader (see partitions.go), and
	// none of the rendezvous machinery applies.
	parts []control.Partition
	// names are the members' names by Raft ID (with parts).
	names map[string]string
	// tombstoned is set when a partition has a tombstone: only then does
	// a check look its partition up to be penalized.
	tombstoned bool
	// unassigned is set while the cluster's settings ask for partitions
	// and the map has none yet: nobody decides a key then.
	unassigned bool
}

// newConfig builds the configuration of map m for node self.
func newConfig(self string, policy Policy, replicas int, m *control.Map) *config {
	c := &config{self: self, policy: policy, replicas: replicas, m: m, id: m.Changed,
		members: make(map[string]control.Member, len(m.Members)), epochs: make(map[string]uint64)}
	for _, x := range m.Members {
		c.members[x.Name] = x
		if x.Live && x.Phase != control.PhaseLeft {
			c.epochs[x.Name] = x.Epoch
		}
		if x.Phase == control.PhaseJoined || x.Phase == control.PhaseLeaving && !x.Live && !x.Releasable && policy == PolicyExact {
			c.ring = append(c.ring, x.Name)
			c.hashes = append(c.hashes, shard.NodeHash(x.Name))
		}
	}
	c.upAt = make([]bool, len(c.ring))
	for i, name := range c.ring {
		c.upAt[i] = c.up(name)
	}
	c.unassigned = m.Settings.Partitions > 0 && len(m.Partitions) == 0
	if len(m.Partitions) > 0 {
		c.parts, c.names = m.Partitions, make(map[string]string, len(m.Members))
		for _, x := range m.Members {
			c.names[x.ID] = x.Name
		}
		for i := range m.Partitions {
			c.tombstoned = c.tombstoned || m.Partitions[i].Tombstone != 0
		}
	}
	return c
}

// live reports whether name's epoch is live (any phase but left): it may
// hold keys and sends its completes.
func (c *config) live(name string) bool {
	_, ok := c.epochs[name]
	return ok
}

// up reports whether name owns keys and its epoch is live: it may act for
// keys and keep copies.
func (c *config) up(name string) bool {
	x, ok := c.members[name]
	return ok && x.Live && x.Phase == control.PhaseJoined
}

// passes reports whether a key's order goes on past name, which is not up:
// its epoch ended leaving complete copies (or it never started), or the
// available policy decides its keys from whatever is there.
func (c *config) passes(name string) bool {
	x := c.members[name]
	return c.policy == PolicyAvailable || x.Releasable && x.Phase == control.PhaseJoined
}

// order returns the ring in key's rendezvous order, best first.
func (c *config) order(key string) []string {
	h := shard.Hash(key)
	type scored struct {
		name  string
		score uint64
	}
	s := make([]scored, len(c.ring))
	for i, name := range c.ring {
		s[i] = scored{name, shard.Score(h, c.hashes[i])}
	}
	slices.SortFunc(s, func(a, b scored) int {
		if a.score != b.score {
			if a.score > b.score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	names := make([]string, len(s))
	for i := range s {
		names[i] = s[i].name
	}
	return names
}

// owner returns the name of key's owner (the first of its order), "" when
// the ring is empty.
func (c *config) owner(key string) string {
	if c.parts != nil {
		return c.names[c.partOf(key).Replicas[0]]
	}
	i := shard.Owner(shard.Hash(key), c.hashes)
	if i < 0 {
		return ""
	}
	return c.ring[i]
}

// acting returns the member that decides key in this configuration: the
// first member of its order that is up, walking past members that are
// down with complete copies elsewhere. It returns "" and why when nobody
// may decide the key, and then waitOn names the member whose return (or
// forgetting) the key waits for.
func (c *config) acting(key string) (name, waitOn string, err error) {
	if c.parts != nil {
		return c.leaderOf(key)
	}
	if c.unassigned {
		return "", "", fmt.Errorf("%w: the cluster's partitions are not assigned yet (its first members are still starting)", ErrMoving)
	}
	o := c.owner(key)
	if o == "" {
		return "", "", fmt.Errorf("%w: the cluster has no member that owns keys", ErrMoving)
	}
	if c.up(o) {
		return o, "", nil
	}
	return c.walk(c.order(key), "")
}

// walk returns the first member of order, skipping skip, that is up, past
// the members down with complete copies; or the member it waits on.
func (c *config) walk(order []string, skip string) (name, waitOn string, err error) {
	for _, n := range order {
		switch {
		case n == skip:
		case c.up(n):
			return n, "", nil
		case !c.passes(n):
			return "", n, fmt.Errorf("%w: %s, which holds the key's latest state, is down and its keys have no complete copy elsewhere; they wait for it (or for `sluice members forget %s`)", ErrOwnerDown, n, n)
		}
	}
	return "", "", fmt.Errorf("%w: no member that owns keys is up", ErrOwnerDown)
}

// holder returns the member that holds key's latest state in this
// configuration: the member acting for it, or the member it waits on.
func (c *config) holder(key string) string {
	a, w, _ := c.acting(key)
	if a != "" {
		return a
	}
	return w
}

// holderWithout is holder for a configuration without member skip: where
// the key's state is when skip does not count.
func (c *config) holderWithout(key, skip string) string {
	a, w, _ := c.walk(c.order(key), skip)
	if a != "" {
		return a
	}
	return w
}

// standby returns the member that keeps a copy of key: the first member up
// after the key's acting member in its order; "" without standbys
// (replicas < 2), or when no other member is up. It does not allocate when
// the key's owner is up.
func (c *config) standby(key string) string {
	if c.parts != nil {
		return c.followerOf(key)
	}
	if c.replicas < 2 {
		return ""
	}
	acting, _, err := c.acting(key)
	if err != nil {
		return ""
	}
	return c.standbyAfter(key, acting)
}

// standbyAfter is standby for a key whose acting member is known.
func (c *config) standbyAfter(key, acting string) string {
	if c.replicas < 2 {
		return ""
	}
	return c.standbyAfterHash(shard.Hash(key), acting)
}

// standbyAfterHash is standbyAfter for the key whose shard.Hash is h.
func (c *config) standbyAfterHash(h uint64, acting string) string {
	var actingScore uint64
	for i, name := range c.ring {
		if name == acting {
			actingScore = shard.Score(h, c.hashes[i])
		}
	}
	best, bestScore := "", uint64(0)
	for i, name := range c.ring {
		if name == acting || !c.upAt[i] {
			continue
		}
		sc := shard.Score(h, c.hashes[i])
		// After acting in the order: a lower score, or an equal one and a
		// larger name.
		if sc > actingScore || sc == actingScore && name < acting {
			continue
		}
		if best == "" || sc > bestScore || sc == bestScore && name < best {
			best, bestScore = name, sc
		}
	}
	return best
}

// copyOf reports whether self acts for key and, if it does, the key's
// standby after it (standbyAfter), hashing the key once: what a write's
// copies need of every record.
func (c *config) copyOf(key, self string) (acting bool, standby string) {
	h := shard.Hash(key)
	if i := shard.Owner(h, c.hashes); i >= 0 && c.upAt[i] {
		acting = c.ring[i] == self // the owner is up: it acts
	} else {
		acting = c.actingName(key) == self
	}
	if !acting || c.replicas < 2 {
		return acting, ""
	}
	return true, c.standbyAfterHash(h, self)
}

// actingName is acting without the reason.
func (c *config) actingName(key string) string {
	n, _, _ := c.acting(key)
	return n
}

// complete records that a member finished handing keys over to this node
// in one of its configurations.
type complete struct {
	epoch  uint64 // the sender's epoch
	config uint64
	seq    uint64
}

// ownership is what this node may decide right now: the current
// configuration, the configurations since it last held every key it acts
// for (hist), and what arrived since. It is immutable: the router builds a
// new one on every change and reads it without locks.
type ownership struct {
	cur *config
	// hist are the configurations since the last settled one, oldest
	// first; hist[len-1] is cur. hist[0] == nil means this epoch held
	// nothing before: every key it acts for is gained.
	hist []*config
	// epoch is this node's epoch the completes were addressed to.
	epoch uint64
	// completes holds, per member, the last "nothing more for you" it sent
	// this epoch.
	completes map[string]complete
	// synced holds, per member, the configuration and the member's epoch
	// for which this node last brought it up to date as the standby of its
	// keys (standbys only).
	synced map[string]syncMark
	// promoted is the configuration in which this node merged the copies
	// it keeps of the keys it now acts for into them (standbys only).
	promoted uint64
	// settled reports that no key this node acts for waits for anything:
	// the fast path of the gate.
	settled bool
	// waitingFor lists the members gained keys wait for, for logs and
	// errors.
	waitingFor []string
	// waitingLive reports that some of them are live: their completes are
	// on the way, and the node should get no traffic until they arrive.
	// Waiting only for members that are down costs just their keys: the
	// node is ready for the others.
	waitingLive bool
	// changed is closed when a newer ownership replaces this one.
	changed chan struct{}
}

// maxHist bounds the configurations kept while some are unsettled; past
// it, the node forgets what it held and treats every key as gained.
const maxHist = 16

// next returns the ownership after a new configuration, for this node's
// epoch. A new epoch starts over: nothing held.
func (o *ownership) next(cur *config, epoch uint64) *ownership {
	n := &ownership{cur: cur, epoch: epoch, completes: o.completes, synced: o.synced, changed: make(chan struct{})}
	if o.cur != nil && cur.id == o.cur.id {
		n.promoted = o.promoted
	}
	if o.cur != nil && startedSince(o.cur, cur) {
		// A member whose epoch started is now the standby of some keys
		// another member kept until now; should its epoch end again,
		// those keys would go back to that member, which has missed every
		// write meanwhile. Every standby is brought up to date again.
		n.synced = nil
	}
	switch {
	case o.cur == nil || epoch != o.epoch:
		n.hist = []*config{nil, cur}
		n.completes, n.synced, n.promoted = nil, nil, 0
	case cur.id == o.cur.id:
		n.hist = append(slices.Clone(o.hist[:len(o.hist)-1]), cur)
	default:
		n.hist = append(slices.Clone(o.hist), cur)
		if len(n.hist) > maxHist {
			n.hist = []*config{nil, cur}
		}
	}
	if cur.parts != nil {
		// Partitions: a leader holds every acknowledged write of its
		// partitions, so nothing waits for a handoff.
		n.hist, n.completes, n.synced = []*config{cur}, nil, nil
	}
	n.settle()
	return n
}

// startedSince reports whether a member's epoch is live in cur that was
// not in old (a member started, or joined).
func startedSince(old, cur *config) bool {
	for name, e := range cur.epochs {
		if old.epochs[name] != e {
			return true
		}
	}
	return false
}

// syncMark is a standby brought up to date: in which configuration, at
// which of its epochs. From then on every write of the keys it keeps
// reaches it; a key whose standby it became since still needs its state.
type syncMark struct {
	cfg   *config
	epoch uint64
}

// with returns the ownership with a member's complete recorded.
func (o *ownership) with(from string, c complete) *ownership {
	return o.amended(func(n *ownership) {
		n.completes = cloneMap(o.completes)
		n.completes[from] = c
	})
}

// amended returns a copy of o changed by f, settled again.
func (o *ownership) amended(f func(*ownership)) *ownership {
	n := *o
	n.changed = make(chan struct{})
	f(&n)
	n.settle()
	return &n
}

// syncedWith reports whether member was brought up to date, as the standby
// of this node's keys, in the current configuration and its current epoch.
func (o *ownership) syncedWith(member string) bool {
	s, ok := o.synced[member]
	return ok && s.cfg.id == o.cur.id && s.epoch == o.cur.epochs[member]
}

// syncedFor reports whether standby holds key's state: it was brought up
// to date at its current epoch in a configuration where this node acted
// for key and it was the key's standby already.
func (o *ownership) syncedFor(key, standby string) bool {
	s, ok := o.synced[standby]
	if !ok || s.epoch != o.cur.epochs[standby] {
		return false
	}
	return s.cfg.id == o.cur.id || s.cfg.actingName(key) == o.cur.self && s.cfg.standby(key) == standby
}

func cloneMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// completeFrom reports whether the live member has told this node it
// holds nothing more for it in the current configuration.
func (o *ownership) completeFrom(member string) bool {
	c, ok := o.completes[member]
	return ok && c.config == o.cur.id && c.epoch == o.cur.epochs[member]
}

// resolved reports whether member, which is not live, holds nothing any
// key this node gained waits for: it was forgotten, its epoch ended with
// complete copies elsewhere (those are on live members, who send them with
// their completes), or the available policy goes on without it.
func (o *ownership) resolved(member string) bool {
	x, ok := o.cur.members[member]
	return !ok || x.Phase == control.PhaseLeft || x.Releasable || o.cur.policy == PolicyAvailable
}

// lost reports whether this node came back without its data directory
// after an epoch that ended without complete copies: then, under the exact
// policy, its gained keys wait for every member that may keep a copy.
func (o *ownership) lost() bool {
	x := o.cur.members[o.cur.self]
	return x.Lost && o.cur.policy == PolicyExact
}

// settle computes settled and waitingFor, and drops the history once
// nothing waits: every live member sent its complete, and every member
// that may hold a gained key and is down is resolved. With standbys, it
// also waits for this node's own copies to be promoted and for every live
// member to be brought up to date as a standby.
func (o *ownership) settle() {
	o.waitingFor = o.waitingFor[:0:0]
	o.waitingLive = false
	if o.cur.parts != nil {
		o.settled = true
		return
	}
	waiting := make(map[string]bool)
	if len(o.hist) > 1 {
		for name := range o.cur.epochs {
			if name != o.cur.self && !o.completeFrom(name) {
				waiting[name] = true
			}
		}
		for _, h := range o.holders() {
			if !o.cur.live(h) && !o.resolved(h) {
				waiting[h] = true
			}
		}
		if o.lost() {
			for _, name := range o.cur.ring {
				if name != o.cur.self && !o.cur.live(name) {
					waiting[name] = true
				}
			}
		}
		if len(waiting) == 0 {
			o.hist = []*config{o.cur}
		}
	}
	if o.cur.replicas >= 2 {
		if o.promoted != o.cur.id {
			waiting[o.cur.self] = true
		}
		for name := range o.cur.epochs {
			if name != o.cur.self && o.cur.up(name) && !o.syncedWith(name) {
				waiting[name] = true
			}
		}
	}
	for name := range waiting {
		o.waitingFor = append(o.waitingFor, name)
		o.waitingLive = o.waitingLive || o.cur.live(name) || name == o.cur.self
	}
	slices.Sort(o.waitingFor)
	o.settled = len(waiting) == 0
}

// holders returns the members that may hold keys this node gained: every
// member of an older configuration of hist that was live or that keys
// waited on; for an epoch that held nothing, every member of the current
// map.
func (o *ownership) holders() []string {
	set := make(map[string]bool)
	for _, c := range o.hist[:len(o.hist)-1] {
		if c == nil {
			c = o.cur
		}
		for name, x := range c.members {
			if x.Phase != control.PhaseLeft && (x.Live || !c.passes(name)) {
				set[name] = true
			}
		}
	}
	delete(set, o.cur.self)
	return slices.Sorted(func(yield func(string) bool) {
		for n := range set {
			if !yield(n) {
				return
			}
		}
	})
}

// gate reports whether this node may decide key now, given that it acts
// for it in the current configuration: nil, or why not. A key this node
// acted for in every configuration since the last settled one is held; a
// gained key waits until every live member sent its complete, and until
// every member that held it since is live (and so completed) or resolved.
func (o *ownership) gate(key string) error {
	if o.settled {
		return nil
	}
	held, err := o.gateHistory(key)
	if err != nil {
		return err
	}
	if o.cur.replicas >= 2 {
		if !held && o.promoted != o.cur.id {
			return &waitError{member: o.cur.self, err: fmt.Errorf("%w: waiting for %s to take its copy of the key", ErrMoving, o.cur.self)}
		}
		if sb := o.cur.standby(key); sb != "" && !o.syncedFor(key, sb) {
			return &waitError{member: sb, err: fmt.Errorf("%w: waiting for the key's standby %s to be brought up to date", ErrMoving, sb)}
		}
	}
	return nil
}

// gateHistory is the part of gate that looks at the configurations since
// the last settled one: held reports that this node held the key in every
// one of them.
func (o *ownership) gateHistory(key string) (held bool, err error) {
	if len(o.hist) <= 1 {
		return true, nil
	}
	self := o.cur.self
	var prev []string
	held = true
	for _, c := range o.hist[:len(o.hist)-1] {
		if c == nil {
			held = false
			continue
		}
		if h := c.holder(key); h != self {
			held = false
			if h != "" {
				prev = append(prev, h)
			}
		}
	}
	if held {
		return true, nil
	}
	// Where the key's state went while this node did not hold it, as the
	// current map tells (configurations this node skipped included).
	if h := o.cur.holderWithout(key, self); h != "" {
		prev = append(prev, h)
	}
	for _, p := range prev {
		if o.cur.live(p) {
			continue // covered by its complete, below
		}
		if !o.resolved(p) {
			return false, fmt.Errorf("%w: waiting for the handoff of %s, which held the key and is down", ErrOwnerDown, p)
		}
	}
	for name := range o.cur.epochs {
		if name != self && !o.completeFrom(name) {
			return false, &waitError{member: name, err: fmt.Errorf("%w: waiting for the handoff of %s", ErrMoving, name)}
		}
	}
	if o.lost() {
		for _, name := range o.cur.ring {
			if name != self && !o.cur.live(name) {
				return false, fmt.Errorf("%w: this node lost its data and its last epoch ended without complete copies: waiting for %s, which may keep one", ErrOwnerDown, name)
			}
		}
	}
	return false, nil
}

// waitError is a gate's refusal that waits for a live member (its
// complete, or its copies brought up to date): worth waiting for while
// gossip sees the member alive, not when it does not (see admit).
type waitError struct {
	member string
	err    error
}

func (e *waitError) Error() string { return e.err.Error() }
func (e *waitError) Unwrap() error { return e.err }

// penalty is a tombstone's effect on a key this node decides: the key is
// denied until until, because the forgotten member named by the tombstone
// may have allowed hits that nobody counts any more.
type penalty struct {
	name string
	from time.Time // when this node first saw the tombstone
}

// penalties returns the tombstones of the current map that bear on key,
// whichever node decides it: the forgotten member held the key's state
// when it was forgotten (tombstoneHeld), and this node is not that member
// with its old data.
func (c *config) penalties(key string, seen map[control.TombstoneKey]time.Time) []penalty {
	if len(c.m.Tombstones) == 0 {
		return nil
	}
	var out []penalty
	h := shard.Hash(key)
	selfID := c.members[c.self].ID
	for _, t := range c.m.Tombstones {
		if t.Name == c.self && t.ID == selfID {
			continue
		}
		if c.tombstoneHeld(t, h) {
			out = append(out, penalty{name: t.Name, from: seen[t.Key()]})
		}
	}
	return out
}

// tombstoneHeld reports whether the forgotten member of t held the state
// of the key hashed to h when it was forgotten: in the key's rendezvous
// order over the ring of that moment, it comes before every member that
// acted for keys or kept them waiting. Members that joined or came back
// since change nothing: a key is penalized wherever it goes. A tombstone
// without its ring (written by an older version) falls back to the
// forgotten member ranking before this node.
func (c *config) tombstoneHeld(t control.Tombstone, h uint64) bool {
	score := shard.Score(h, shard.NodeHash(t.Name))
	before := func(name string, sc uint64) bool { return sc > score || sc == score && name < t.Name }
	if len(t.Ring) == 0 {
		return !before(c.self, shard.Score(h, shard.NodeHash(c.self)))
	}
	for _, x := range t.Ring {
		if !x.Passes && before(x.Name, shard.Score(h, shard.NodeHash(x.Name))) {
			return false
		}
	}
	return true
}
