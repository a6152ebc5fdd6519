package control

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// A node decides keys only while it holds a lease, timed by the leader
// (docs/cluster.md, "Epochs and leases"): it sends Renew(name, epoch) at s
// on its CLOCK_BOOTTIME; the leader commits a Raft barrier after the
// request arrived, checks the epoch is live and not ending, and grants;
// the node then decides until s + L. To end an epoch the leader stops
// granting to it and waits until max(last grant, leadership start) +
// L·(1+ρ) on its own clock, then applies the end. A new leader commits a
// barrier before it grants anything.

// holder is this node's lease: until is the end of the lease on the boot
// clock, for epoch.
type holder struct {
	clock  Clock
	length time.Duration

	mu    sync.Mutex
	epoch uint64
	until atomic.Int64 // ns on clock; 0: none
}

// reset drops the lease and starts over for epoch e.
func (h *holder) reset(e uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.epoch = e
	h.until.Store(0)
}

// extend makes the lease of epoch e run until sent + L, sent being when
// the granted renewal was sent.
func (h *holder) extend(e uint64, sent time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch != e {
		return
	}
	if end := int64(sent + h.length); end > h.until.Load() {
		h.until.Store(end)
	}
}

// valid reports whether the lease of epoch e runs now.
func (h *holder) valid(e uint64) bool {
	u := h.until.Load()
	if u == 0 {
		return false
	}
	h.mu.Lock()
	ok := h.epoch == e
	h.mu.Unlock()
	return ok && int64(h.clock.Now()) < u
}

func (h *holder) remaining(e uint64) time.Duration {
	h.mu.Lock()
	ok := h.epoch == e
	h.mu.Unlock()
	u := h.until.Load()
	if !ok || u == 0 {
		return 0
	}
	return time.Duration(u) - h.clock.Now()
}

// granter is the leader's side of leases, alive while this node leads.
type granter struct {
	c     *Control
	since time.Duration // when this node became leader, on its boot clock
	lease time.Duration // L
	wait  time.Duration // L·(1+ρ)

	mu        sync.Mutex
	pending   []*renewal
	lastGrant map[string]time.Duration
	lastAsk   map[string]time.Duration
	epochSeen map[string]uint64 // the epoch lastAsk is about
	// seenAt is when gossip last saw the member alive, or when this
	// leader first saw its epoch if later.
	seenAt map[string]time.Duration
	ending map[string]ending
	// distrust is set while gossip shows every other live member dead:
	// it hastens no end then.
	distrust bool
	kick     chan struct{}
}

// renewal is one Renew waiting for the next barrier.
type renewal struct {
	name  string
	epoch uint64
	reply chan grant // capacity 1
}

type grant struct {
	granted bool
	reason  string
}

// ending is an epoch the leader is ending: it grants it nothing, and
// applies its end at at.
type ending struct {
	epoch uint64
	at    time.Duration
	why   string
}

// ask queues a renewal and waits for its answer.
func (g *granter) ask(ctx context.Context, name string, e uint64) (bool, string, error) {
	r := &renewal{name: name, epoch: e, reply: make(chan grant, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	g.noteAskLocked(name, e)
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
	select {
	case a := <-r.reply:
		return a.granted, a.reason, nil
	case <-ctx.Done():
		return false, "", ctx.Err()
	}
}

func (g *granter) noteAskLocked(name string, e uint64) {
	if g.epochSeen[name] == e {
		g.lastAsk[name] = g.c.clock.Now()
	}
}

// serve answers the renewals queued so far after one barrier.
func (g *granter) serve() {
	g.mu.Lock()
	batch := g.pending
	g.pending = nil
	g.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	err := g.c.raft.Barrier(time.Second).Error()
	// The map and the time are read under g.mu, so that endDown, which
	// runs beside serve, either sees this grant or has already marked the
	// epoch ending.
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.c.Map()
	now := g.c.clock.Now()
	for _, r := range batch {
		var a grant
		x, ok := m.Member(r.name)
		e, isEnding := g.ending[r.name]
		switch {
		case err != nil:
			a.reason = fmt.Sprintf("the leader could not reach a quorum: %v", err)
		case !ok || x.Phase == PhaseLeft:
			a.reason = "not a member"
		case !x.Live || x.Epoch != r.epoch:
			a.reason = fmt.Sprintf("epoch %d has ended", r.epoch)
		case isEnding && e.epoch == r.epoch:
			a.reason = fmt.Sprintf("epoch %d is ending: %s", r.epoch, e.why)
		default:
			a.granted = true
			g.lastGrant[r.name] = now
		}
		r.reply <- a
	}
}

// leaderLoop runs the leader's duties (lead) while this node leads.
func (c *Control) leaderLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	type run struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var cur *run
	stop := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			cur = nil
		}
	}
	defer stop()
	for {
		if cur != nil {
			select {
			case <-cur.done: // lead gave up (its first barrier failed): start over
				stop()
			default:
			}
		}
		leading := c.raft.State() == raft.Leader
		switch {
		case leading && cur == nil:
			lctx, cancel := context.WithCancel(ctx)
			r := &run{cancel: cancel, done: make(chan struct{})}
			cur = r
			go func() {
				defer close(r.done)
				c.lead(lctx)
			}()
		case !leading:
			stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-c.raft.LeaderCh():
		case <-t.C:
		}
	}
}

// lead does the leader's work until ctx ends: it commits a barrier, then
// grants leases, ends the epochs of members that stopped renewing,
// initialises a new cluster, adds the members gossip finds, places
// voters, and places partitions (sets them once, fills short replica
// lists).
func (c *Control) lead(ctx context.Context) {
	since := c.clock.Now()
	if err := c.raft.Barrier(5 * time.Second).Error(); err != nil {
		c.log.Warn("new leader: barrier", "err", err)
		return
	}
	g := &granter{c: c, since: since, lease: c.cfg.Settings.Lease, wait: time.Duration(float64(c.cfg.Settings.Lease) * (1 + c.cfg.ClockDrift)),
		lastGrant: map[string]time.Duration{}, lastAsk: map[string]time.Duration{}, epochSeen: map[string]uint64{}, seenAt: map[string]time.Duration{},
		ending: map[string]ending{}, kick: make(chan struct{}, 1)}
	c.granter.Store(g)
	defer c.granter.Store(nil)
	c.log.Info("leading the cluster", "cluster", c.ClusterID())
	if c.ClusterID() == "" {
		if _, err := c.apply(command{Op: opInit, ClusterID: newUUID(), Settings: c.cfg.Settings}, 5*time.Second); err != nil {
			c.log.Error("initialise the cluster", "err", err)
			return
		}
		c.log.Info("initialised the cluster", "cluster", c.ClusterID(), "settings", c.cfg.Settings.String())
	}
	// Renewals are granted on a goroutine of their own: a reconcile or an
	// epoch's end waiting on a slow quorum must not hold a lease back.
	granting := make(chan struct{})
	go func() {
		defer close(granting)
		for {
			select {
			case <-ctx.Done():
				g.failPending()
				return
			case <-g.kick:
				g.serve()
			}
		}
	}()
	defer func() { <-granting }()
	var pl placer
	c.reconcile(g)
	c.placePartitions(&pl)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastReconcile := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			g.endDown()
			if time.Since(lastReconcile) >= reconcileEvery {
				c.reconcile(g)
				c.placePartitions(&pl)
				c.dropTombstones()
				lastReconcile = time.Now()
			}
		}
	}
}

// reconcileEvery is how often the leader compares the map and the Raft
// configuration with what gossip finds.
const reconcileEvery = 250 * time.Millisecond

// failPending answers the renewals left when leadership ends.
func (g *granter) failPending() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.pending {
		r.reply <- grant{reason: "leadership lost"}
	}
	g.pending = nil
}

// endDown ends the epochs of members that stopped renewing, once their
// lease is over for sure (see checkLocked).
func (g *granter) endDown() {
	c := g.c
	m := c.Map()
	now := c.clock.Now()
	g.mu.Lock()
	todo, marked, distrust := g.checkLocked(m, now, c.cfg.NodeName, c.cfg.Gossip.Alive)
	g.mu.Unlock()
	if distrust != "" {
		c.log.Warn(distrust)
	}
	for _, e := range marked {
		c.log.Warn("ending the epoch of a member that is down once its lease is over", "member", e.name, "epoch", e.epoch,
			"why", e.why, "in", (e.at - now).Round(time.Millisecond))
	}
	for _, d := range todo {
		if _, err := c.apply(command{Op: opEnd, Name: d.name, Epoch: d.epoch}, time.Second); err != nil {
			c.log.Warn("end an epoch", "member", d.name, "epoch", d.epoch, "err", err)
			continue
		}
		x, _ := c.Map().Member(d.name)
		c.log.Warn("ended the epoch of a member that is down", "member", d.name, "epoch", d.epoch, "keys_go_on_from_copies", x.Releasable)
	}
}

// due is an epoch whose end the leader applies now.
type due struct {
	name  string
	epoch uint64
}

// marked is an epoch the leader just started to end.
type marked struct {
	name string
	ending
}

// checkLocked looks at every live member of m but self at now (alive is
// what gossip says of a member now): it marks ending the epochs of the
// members that are down (downLocked), and returns those whose end is due
// (their lease is over for sure), those it marked, and a warning to log
// when this leader starts or stops distrusting gossip ("" otherwise).
//
// Gossip only hastens the end of a member that stopped renewing. A leader
// whose gossip shows every other live member dead distrusts it (its own
// gossip is more likely cut off than all of them down): it ends epochs on
// missed renewals alone until gossip sees one of them alive again.
func (g *granter) checkLocked(m *Map, now time.Duration, self string, alive func(string) bool) (todo []due, newly []marked, distrust string) {
	others, seen := 0, 0
	for _, x := range m.Members {
		if x.Live && x.Phase != PhaseLeft && x.Name != self {
			others++
			if alive(x.Name) {
				seen++
			}
		}
	}
	trust := others == 0 || seen > 0
	switch {
	case !trust && !g.distrust:
		distrust = fmt.Sprintf("gossip shows every other member dead (%d) while this node leads: it is more likely cut off than they are; epochs end on missed renewals only", others)
	case trust && g.distrust:
		distrust = "gossip sees other members alive again: it hastens the end of members that stopped renewing"
	}
	g.distrust = !trust
	for _, x := range m.Members {
		if !x.Live || x.Phase == PhaseLeft {
			delete(g.ending, x.Name)
			continue
		}
		if g.epochSeen[x.Name] != x.Epoch {
			// A new epoch: its renewals are counted from now, and gossip,
			// which may still remember the member's previous process as
			// dead, is not heard until it missed renewals too.
			g.epochSeen[x.Name] = x.Epoch
			g.lastAsk[x.Name] = now
			g.seenAt[x.Name] = now
		}
		e, isEnding := g.ending[x.Name]
		if isEnding && e.epoch != x.Epoch {
			delete(g.ending, x.Name)
			isEnding = false
		}
		if !isEnding && x.Name != self {
			why := g.downLocked(x.Name, now, alive(x.Name), trust, g.lease)
			if why == "" {
				continue
			}
			e = ending{epoch: x.Epoch, at: max(g.lastGrant[x.Name], g.since) + g.wait, why: why}
			g.ending[x.Name] = e
			isEnding = true
			newly = append(newly, marked{x.Name, e})
		}
		if isEnding && now >= e.at {
			todo = append(todo, due{x.Name, x.Epoch})
		}
	}
	return todo, newly, distrust
}

// downLocked says why the member named name is down at now, "" if it is
// not. A member is down only when its renewals stopped: none arrived for
// longer than the lease, or, when gossip is trusted and has not seen it
// alive now, none arrived for hastenAfter of the lease. A member that
// renews is never down, whatever gossip says: its gossip port may be cut
// while Raft and the peer service work, or a stale rumour of its death
// may be spreading after a partition healed.
func (g *granter) downLocked(name string, now time.Duration, alive, trust bool, lease time.Duration) string {
	if alive {
		g.seenAt[name] = now
	}
	ask, ok := g.lastAsk[name]
	if !ok {
		ask = g.since
	}
	silent := now - ask
	switch {
	case silent > lease:
		return fmt.Sprintf("no renewal for %v", silent.Round(time.Millisecond))
	case trust && !alive && silent > hastenAfter(lease):
		return fmt.Sprintf("no renewal for %v, and gossip has not seen it alive for %v",
			silent.Round(time.Millisecond), (now - g.seenAt[name]).Round(time.Millisecond))
	}
	return ""
}

// hastenAfter is how long a member that gossip declares dead may go
// without renewing before the leader ends its epoch: three renewals (one
// every lease/4) missed in a row.
func hastenAfter(lease time.Duration) time.Duration { return lease * 3 / 4 }

// forceEnd makes the leader end the live epoch of the member named name
// once its lease is over, whatever gossip says.
func (g *granter) forceEnd(name string, e uint64, why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if cur, ok := g.ending[name]; ok && cur.epoch == e {
		return
	}
	g.ending[name] = ending{epoch: e, at: max(g.lastGrant[name], g.since) + g.wait, why: why}
}

// forget ends the member's epoch (fenced: once its lease is over), then
// marks it left and takes it out of the Raft configuration.
func (c *Control) forget(ctx context.Context, g *granter, name string) error {
	if name == c.cfg.NodeName {
		return fmt.Errorf("%w: %s is the leader", ErrAlive, name)
	}
	if c.cfg.Gossip.Alive(name) {
		return fmt.Errorf("%w: gossip sees %s alive; stop it (or let it leave) first", ErrAlive, name)
	}
	for {
		m, changed := c.Watch()
		x, ok := m.Member(name)
		if !ok || x.Phase == PhaseLeft {
			return fmt.Errorf("%w: %q is not a member", ErrNoMember, name)
		}
		if !x.Live {
			break
		}
		g.forceEnd(name, x.Epoch, "an operator forgets it")
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("control: forget %s: its epoch has not ended yet: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	x, _ := c.Map().Member(name)
	if _, err := c.apply(command{Op: opForget, Name: name, At: time.Now().UnixNano()}, 5*time.Second); err != nil {
		return err
	}
	c.log.Warn("forgot a member", "member", name, "keys_go_on_from_copies", x.Releasable)
	if err := c.raft.RemoveServer(raftID(x.ID), 0, 5*time.Second).Error(); err != nil {
		c.log.Warn("remove a forgotten member from raft", "member", name, "err", err)
	}
	return nil
}

// dropTombstones removes the tombstones older than the longest window.
func (c *Control) dropTombstones() {
	now := time.Now().UnixNano()
	for _, t := range c.Map().Tombstones {
		if now-t.At >= int64(tombstoneLife) {
			if _, err := c.apply(command{Op: opDrop, At: now}, time.Second); err != nil {
				c.log.Warn("drop old tombstones", "err", err)
			}
			return
		}
	}
}
