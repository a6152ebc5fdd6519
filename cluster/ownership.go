package cluster

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice/shard"
)

// Errors a node gives when it may not decide a key now. Each maps to
// UNAVAILABLE for the client, with the error's text as the reason.
var (
	// ErrNoQuorum means this node holds no lease from a majority of the
	// expected members: it is alone, cut off, paused, or just started.
	ErrNoQuorum = errors.New("cluster: no quorum")
	// ErrMoving means the key's ownership is moving: its state has not
	// arrived yet, or the nodes' views differ for a moment.
	ErrMoving = errors.New("cluster: ownership moving")
	// ErrOwnerDown means the key's owner is down and nobody else may decide
	// the key: under the exact policy its keys wait for it.
	ErrOwnerDown = errors.New("cluster: owner down")
)

// Policy says what happens to the keys of an owner that is down.
type Policy uint8

const (
	// PolicyExact (the default) keeps a down owner's keys for it: nobody
	// decides them until it is back, since their state is out of reach.
	PolicyExact Policy = iota
	// PolicyAvailable lets the next member of each key's rendezvous order
	// decide a down owner's keys, from whatever state it holds (none, if
	// the owner never handed them over), once the owner is fenced. A key
	// may then allow up to one extra limit in a window.
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

// config is one configuration of ownership as this node sees it: who owns
// keys (the roster's joined members, up or down) and who is alive. It is
// immutable.
type config struct {
	self   string
	policy Policy
	// replicas is how many members keep each key: 2 gives every key a
	// standby (see standby), which takes over when the owner is down.
	replicas int
	// owners are the roster's members in PhaseJoined: rendezvous hashing
	// over them gives each key's owner.
	owners *View
	// others are the owners without this node: where its keys would be
	// without it.
	others *View
	// alive are the live members of the membership view that are not
	// leaving, by name.
	alive map[string]Member
	// live are all live members, leaving ones included: every one of them
	// may hold keys and hands over what it holds.
	live map[string]Member
	// roster is the roster the configuration was built from.
	roster *Roster
	// id identifies the configuration across nodes: a hash of the owners,
	// and, when a down owner's keys are taken over (the available policy,
	// or standbys), of which of them are alive. Two nodes that agree on it
	// agree on who acts for every key.
	id uint64
}

// newConfig builds the configuration of view v for node self.
func newConfig(self string, policy Policy, replicas int, v *View) *config {
	c := &config{self: self, policy: policy, replicas: replicas, alive: make(map[string]Member), live: make(map[string]Member), roster: v.Roster}
	for _, m := range v.Members {
		c.live[m.Name] = m
		if m.State == StateAlive {
			c.alive[m.Name] = m
		}
	}
	c.owners = v.Owners()
	c.others = c.owners.Without(self)
	var b []byte
	for _, m := range c.owners.Members {
		b = append(b, m.Name...)
		if c.takesOver() {
			if _, up := c.alive[m.Name]; up {
				b = append(b, '+')
			}
		}
		b = append(b, 0)
	}
	c.id = shard.Hash(string(b))
	return c
}

// Owners returns the view of the members that own keys: the roster's
// members in PhaseJoined, up or down. Rendezvous hashing over it gives
// each key's owner (see docs/cluster.md, "Fenced ownership"). Members that
// are live carry their live addresses; the others what the roster last
// saw. Every member of the returned view has State StateAlive, whatever
// its liveness.
func (v *View) Owners() *View {
	var owners []Member
	for _, name := range v.Roster.Owners() {
		m, ok := v.Member(name)
		if !ok {
			e, _ := v.Roster.Entry(name)
			m = Member{Name: name, GossipAddr: e.GossipAddr, GRPCAddr: e.GRPCAddr, Incarnation: e.Incarnation}
		}
		m.State = StateAlive
		owners = append(owners, m)
	}
	return NewView(v.Epoch, owners)
}

// takesOver reports whether a down owner's keys are decided by the next
// member up (once the owner is fenced): under the available policy, or
// when every key has a standby with its state.
func (c *config) takesOver() bool { return c.policy == PolicyAvailable || c.replicas >= 2 }

// up reports whether the named member is alive and not leaving.
func (c *config) up(name string) bool {
	_, ok := c.alive[name]
	return ok
}

// order returns the owners in key's rendezvous order, best first.
func (c *config) order(key string) []string {
	h := shard.Hash(key)
	type scored struct {
		name  string
		score uint64
	}
	s := make([]scored, len(c.owners.Members))
	for i, m := range c.owners.Members {
		s[i] = scored{m.Name, shard.Score(h, c.owners.hashes[i])}
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

// owner returns the name of key's owner, "" when there are no owners.
func (c *config) owner(key string) string { return c.owners.Owner(key).Name }

// acting returns the member that decides key in this configuration: its
// owner when alive; otherwise, under the available policy, the first
// alive member of the key's order, with the down members before it
// (which it must fence before deciding). It returns "" and the reason when
// nobody may decide the key.
func (c *config) acting(key string) (name string, down []string, err error) {
	o := c.owner(key)
	if o == "" {
		return "", nil, fmt.Errorf("%w: the cluster has no member that owns keys", ErrMoving)
	}
	if c.up(o) {
		return o, nil, nil
	}
	if !c.takesOver() {
		return "", nil, fmt.Errorf("%w: %s, which owns the key, is down; under the exact policy its keys wait for it", ErrOwnerDown, o)
	}
	for _, n := range c.order(key) {
		if c.up(n) {
			return n, down, nil
		}
		down = append(down, n)
	}
	return "", nil, fmt.Errorf("%w: no member that owns keys is up", ErrOwnerDown)
}

// standby returns the member that keeps a copy of key: the first member up
// after the key's acting member in its rendezvous order; "" without
// standbys (replicas < 2), or when no other member is up. It does not
// allocate.
func (c *config) standby(key string) string {
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
	h := shard.Hash(key)
	var actingScore uint64
	for i, m := range c.owners.Members {
		if m.Name == acting {
			actingScore = shard.Score(h, c.owners.hashes[i])
		}
	}
	best, bestScore := "", uint64(0)
	for i, m := range c.owners.Members {
		if m.Name == acting || !c.up(m.Name) {
			continue
		}
		sc := shard.Score(h, c.owners.hashes[i])
		// After acting in the order: a lower score, or an equal one and a
		// larger name.
		if sc > actingScore || sc == actingScore && m.Name < acting {
			continue
		}
		if best == "" || sc > bestScore || sc == bestScore && m.Name < best {
			best, bestScore = m.Name, sc
		}
	}
	return best
}

// actingName is acting without the reason.
func (c *config) actingName(key string) string {
	n, _, _ := c.acting(key)
	return n
}

// complete records that a member finished handing keys over to this node
// in one of its configurations.
type complete struct {
	inc    uint64 // the sender's incarnation
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
	// first; hist[len-1] is cur. hist[0] == nil means this incarnation
	// held nothing before: every key it acts for is gained.
	hist []*config
	// inc is this node's incarnation the completes were addressed to.
	inc uint64
	// completes holds, per member, the last "nothing more for you" it sent
	// this incarnation.
	completes map[string]complete
	// fenced holds, per down member, the incarnation fenced and when the
	// fence lets this node act for its keys (policy available, standbys).
	fenced map[string]fence
	// synced holds, per member, the configuration and the member's
	// incarnation for which this node last brought it up to date as the
	// standby of its keys (standbys only).
	synced map[string]syncMark
	// promoted is the configuration in which this node merged the copies
	// it keeps of the keys it now acts for into them (standbys only).
	promoted uint64
	// settled reports that no key this node acts for waits for anything:
	// the fast path of the gate.
	settled bool
	// waitingFor lists the members whose handoff (or fence) gained keys
	// wait for, for logs and errors.
	waitingFor []string
	// waitingLive reports that some of them are live: their completes are
	// on the way, and the node should get no traffic until they arrive.
	// Waiting only for members that are down (their keys wait for them)
	// costs just those keys: the node is ready for the others.
	waitingLive bool
	// changed is closed when a newer ownership replaces this one.
	changed chan struct{}
}

// maxHist bounds the configurations kept while some are unsettled; past
// it, the node forgets what it held and treats every key as gained.
const maxHist = 16

// next returns the ownership after a new configuration. A new incarnation
// starts over: nothing held.
func (o *ownership) next(cur *config, inc uint64, now time.Time) *ownership {
	n := &ownership{cur: cur, inc: inc, completes: o.completes, fenced: o.fenced, synced: o.synced, changed: make(chan struct{})}
	if o.cur != nil && cur.id == o.cur.id {
		n.promoted = o.promoted
	}
	switch {
	case o.cur == nil || inc != o.inc:
		n.hist = []*config{nil, cur}
		n.completes, n.synced = nil, nil
	case cur.id == o.cur.id:
		n.hist = append(slices.Clone(o.hist[:len(o.hist)-1]), cur)
	default:
		n.hist = append(slices.Clone(o.hist), cur)
		if len(n.hist) > maxHist {
			n.hist = []*config{nil, cur}
		}
	}
	n.settle(now)
	return n
}

// fence is a down member's incarnation fenced by a majority, and when
// this node may act for its keys (L·(1+ρ) after the last promise).
type fence struct {
	inc uint64
	at  time.Time
}

// syncMark is a standby brought up to date: in which configuration, at
// which of its incarnations. From then on every write of the keys it keeps
// reaches it; a key whose standby it became since still needs its state.
type syncMark struct {
	cfg *config
	inc uint64
}

// with returns the ownership with a member's complete or a fence recorded.
func (o *ownership) with(from string, c *complete, f *fence, now time.Time) *ownership {
	return o.amended(now, func(n *ownership) {
		if c != nil {
			n.completes = cloneMap(o.completes)
			n.completes[from] = *c
		}
		if f != nil {
			n.fenced = cloneMap(o.fenced)
			n.fenced[from] = *f
		}
	})
}

// amended returns a copy of o changed by f, settled again at now.
func (o *ownership) amended(now time.Time, f func(*ownership)) *ownership {
	n := *o
	n.changed = make(chan struct{})
	f(&n)
	n.settle(now)
	return &n
}

// syncedWith reports whether member was brought up to date, as the standby
// of this node's keys, in the current configuration and its current
// incarnation.
func (o *ownership) syncedWith(member string) bool {
	s, ok := o.synced[member]
	return ok && s.cfg.id == o.cur.id && s.inc == o.cur.live[member].Incarnation
}

// syncedFor reports whether standby holds key's state: it was brought up
// to date at its current incarnation in a configuration where this node
// acted for key and it was the key's standby already.
func (o *ownership) syncedFor(key, standby string) bool {
	s, ok := o.synced[standby]
	if !ok || s.inc != o.cur.live[standby].Incarnation {
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

// completeFrom reports whether member has told this node it holds nothing
// more for it in the current configuration.
func (o *ownership) completeFrom(member string) bool {
	c, ok := o.completes[member]
	if !ok || c.config != o.cur.id {
		return false
	}
	if m, live := o.cur.live[member]; live {
		return c.inc == m.Incarnation
	}
	e, _ := o.cur.roster.Entry(member)
	return c.inc == e.Incarnation
}

// gone reports whether member holds nothing any more: it handed every key
// over and left, or it sent its complete for the current configuration
// before it went down.
func (o *ownership) gone(member string) bool {
	if e, ok := o.cur.roster.Entry(member); ok && e.Phase == PhaseLeft {
		return true
	}
	return o.completeFrom(member)
}

// fencedAt reports whether down member's fence lets this node act for its
// keys at now: its latest known incarnation is fenced, and the wait is
// over.
func (o *ownership) fencedAt(member string, now time.Time) bool {
	f, ok := o.fenced[member]
	if !ok || now.Before(f.at) {
		return false
	}
	if m, ok := o.cur.owners.Member(member); ok && m.Incarnation > f.inc {
		return false
	}
	return true
}

// settle computes settled and waitingFor, and drops the history once
// nothing waits: every live member sent its complete, and every member
// that held keys in an older configuration is live (so it sent one too)
// or, under the available policy, fenced.
//
// With standbys, it also waits for this node's own copies to be promoted
// and for every live member to be brought up to date as a standby.
func (o *ownership) settle(now time.Time) {
	o.waitingFor = o.waitingFor[:0:0]
	o.waitingLive = false
	waiting := make(map[string]bool)
	if len(o.hist) > 1 {
		for name := range o.cur.live {
			if name != o.cur.self && !o.completeFrom(name) {
				waiting[name] = true
			}
		}
		for _, h := range o.holders() {
			if _, live := o.cur.live[h]; !live && !o.gone(h) && !o.fencedAt(h, now) {
				waiting[h] = true
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
		for name := range o.cur.alive {
			if name != o.cur.self && !o.syncedWith(name) {
				waiting[name] = true
			}
		}
	}
	for name := range waiting {
		o.waitingFor = append(o.waitingFor, name)
		_, live := o.cur.live[name]
		o.waitingLive = o.waitingLive || live || name == o.cur.self
	}
	slices.Sort(o.waitingFor)
	o.settled = len(waiting) == 0
}

// holders returns the members that may hold keys this node gained: in
// every older configuration of hist, the owners and acting members; for a
// node that held nothing, every owner but itself.
func (o *ownership) holders() []string {
	set := make(map[string]bool)
	for _, c := range o.hist[:len(o.hist)-1] {
		if c == nil {
			for _, m := range o.cur.owners.Members {
				set[m.Name] = true
			}
			continue
		}
		for _, m := range c.owners.Members {
			set[m.Name] = true
		}
	}
	delete(set, o.cur.self)
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// gate reports whether this node may decide key now, given that it acts
// for it in the current configuration: nil, or why not. A key this node
// acted for in every configuration since the last settled one is held; a
// gained key waits until every live member sent its complete, and until
// the members that held it before are live (and so completed) or fenced.
func (o *ownership) gate(key string, now time.Time) error {
	if o.settled {
		return nil
	}
	held, err := o.gateHistory(key, now)
	if err != nil {
		return err
	}
	if o.cur.replicas >= 2 {
		if !held && o.promoted != o.cur.id {
			return fmt.Errorf("%w: waiting for %s to take its copy of the key", ErrMoving, o.cur.self)
		}
		if sb := o.cur.standby(key); sb != "" && !o.syncedFor(key, sb) {
			return fmt.Errorf("%w: waiting for the key's standby %s to be brought up to date", ErrMoving, sb)
		}
	}
	return nil
}

// gateHistory is the part of gate that looks at the configurations since
// the last settled one: held reports that this node held the key in every
// one of them.
func (o *ownership) gateHistory(key string, now time.Time) (held bool, err error) {
	if len(o.hist) <= 1 {
		return true, nil
	}
	var prev []string
	held = true
	for _, c := range o.hist[:len(o.hist)-1] {
		if c == nil {
			held = false
			// Where the key would have been without this node.
			if w := o.cur.others.Owner(key).Name; w != "" {
				prev = append(prev, w)
			}
			continue
		}
		a := c.actingName(key)
		if a != o.cur.self {
			held = false
		}
		if a != "" && a != o.cur.self {
			prev = append(prev, a)
		}
		if w := c.owner(key); w != "" && w != o.cur.self && w != a {
			prev = append(prev, w)
		}
	}
	if held {
		return true, nil
	}
	for _, p := range prev {
		if _, live := o.cur.live[p]; live {
			continue // covered by its complete, below
		}
		if o.gone(p) || o.fencedAt(p, now) {
			continue
		}
		if !o.cur.takesOver() {
			return false, fmt.Errorf("%w: waiting for the handoff of %s, which held the key and is down", ErrMoving, p)
		}
		return false, fmt.Errorf("%w: waiting for %s, which held the key and is down, to be fenced", ErrMoving, p)
	}
	for name := range o.cur.live {
		if name != o.cur.self && !o.completeFrom(name) {
			return false, fmt.Errorf("%w: waiting for the handoff of %s", ErrMoving, name)
		}
	}
	return false, nil
}
