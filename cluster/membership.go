package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

var (
	// ErrStarted means Start was called twice.
	ErrStarted = errors.New("cluster: membership already started")
	// ErrNotStarted means a call needs a started membership.
	ErrNotStarted = errors.New("cluster: membership not started")
	// ErrClosed means the membership was shut down.
	ErrClosed = errors.New("cluster: membership shut down")
	// ErrJoin means no member of the join list could be reached before the
	// context ended.
	ErrJoin = errors.New("cluster: join")
)

// maxDeparted bounds how many dead or left members Nodes remembers.
const maxDeparted = 64

// Membership is this node's view of the cluster: it runs memberlist, keeps
// an immutable snapshot of the live members, and answers who owns a key.
// Its methods are safe for concurrent use.
type Membership struct {
	cfg Config
	log *slog.Logger
	obs Observer

	ctx    context.Context // cancelled by Shutdown
	cancel context.CancelFunc
	wg     sync.WaitGroup // goroutines started by Start

	life       sync.Mutex // serialises Start, SetLeaving, Leave and Shutdown
	ml         *memberlist.Memberlist
	meta       meta // what this node gossips about itself; under life
	leaving    bool
	left       bool
	closed     bool
	stopRejoin context.CancelFunc
	self       selfAddrs // to skip this node in join lists

	metaBytes atomic.Pointer[[]byte] // read by memberlist's NodeMeta
	inc       atomic.Uint64          // m.meta.Inc

	// lookupIP resolves join names; tests replace it before Start.
	lookupIP func(ctx context.Context, host string) ([]net.IPAddr, error)

	// stateMu guards the fields below. It is taken inside memberlist's
	// callbacks (which hold memberlist's node lock), so nothing may call
	// into memberlist while holding it.
	stateMu  sync.Mutex
	live     map[string]Member
	departed map[string]Member
	epoch    uint64
	roster   *Roster // see Roster; never nil after New
	reborn   bool    // the roster holds a newer entry for this node: take a new incarnation
	unsent   bool    // announcing this node's metadata timed out: announce it again

	changes []Change // the last changes of the live members (Changes); under stateMu

	view  atomic.Pointer[View]
	local atomic.Pointer[Member]

	stored *Roster // the roster last written to Config.Store; dispatcher only

	notify     chan struct{} // capacity 1: wakes the dispatcher
	subMu      sync.Mutex
	subs       map[*subscriber]struct{}
	subsClosed bool
}

type subscriber struct {
	ch   chan *View
	last uint64 // epoch of the last view delivered
}

// New returns a Membership for cfg, not yet started.
func New(cfg Config) (*Membership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cfg.Join = slices.Clone(cfg.Join)
	cfg.GossipKey = slices.Clone(cfg.GossipKey)
	ctx, cancel := context.WithCancel(context.Background())
	m := &Membership{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "cluster"),
		obs:      cfg.Observer,
		ctx:      ctx,
		cancel:   cancel,
		live:     make(map[string]Member),
		departed: make(map[string]Member),
		notify:   make(chan struct{}, 1),
		subs:     make(map[*subscriber]struct{}),
		lookupIP: net.DefaultResolver.LookupIPAddr,
	}
	m.cfg.Logger = m.log
	m.roster = &Roster{}
	if cfg.Store != nil {
		if err := m.loadRoster(); err != nil {
			return nil, err
		}
	}
	m.view.Store(NewView(0, nil))
	return m, nil
}

// rosterBucket and rosterKey locate the roster in Config.Store.
const (
	rosterBucket = "cluster"
	rosterKey    = "roster"
)

// loadRoster reads the roster this node last stored.
func (m *Membership) loadRoster() error {
	var raw []byte
	err := m.cfg.Store.ScanMeta(rosterBucket, func(key string, value []byte) bool {
		if key == rosterKey {
			raw = append([]byte(nil), value...)
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("cluster: read the roster: %w", err)
	}
	if raw == nil {
		return nil
	}
	es, err := decodeRoster(raw)
	if err != nil {
		return err
	}
	m.roster, _ = m.roster.Merge(es...)
	return nil
}

// newIncarnation returns an incarnation above prev: the current time in
// nanoseconds, or prev+1 when the clock is behind it.
func newIncarnation(prev uint64) uint64 {
	return max(uint64(time.Now().UnixNano()), prev+1)
}

// Start binds the gossip address (a bind error returns at once), starts
// memberlist and then joins Config.Join: it resolves the names, contacts
// every address, and retries with backoff until a member answers or ctx
// ends (then it shuts down and returns an error wrapping ErrJoin). Without
// a join list, or with one that names only this node, this node starts a
// new cluster. Once joined, the node keeps contacting join addresses that
// are not in its view every RejoinInterval.
func (m *Membership) Start(ctx context.Context) error {
	m.life.Lock()
	if m.closed {
		m.life.Unlock()
		return ErrClosed
	}
	if m.ml != nil {
		m.life.Unlock()
		return ErrStarted
	}
	prev, _ := m.roster.Entry(m.cfg.NodeName)
	m.meta = newMeta(m.cfg, time.Now().UnixNano(), newIncarnation(prev.Incarnation))
	m.storeMeta()
	mc := m.cfg.memberlistConfig()
	h := hooks{m}
	mc.Delegate, mc.Events, mc.Alive = h, h, h
	ml, err := memberlist.Create(mc)
	if err != nil {
		m.life.Unlock()
		return fmt.Errorf("cluster: start gossip on %s: %w", m.cfg.GossipAddr, err)
	}
	m.ml = ml
	if adv := m.meta.advertised(ml.LocalNode().Addr.String()); adv != m.meta {
		// Peers cannot dial an unspecified host: advertise the gossip IP.
		m.meta = adv
		m.storeMeta()
		if err := ml.UpdateNode(m.cfg.TCPTimeout); err != nil {
			m.log.Warn("advertise gRPC addresses", "grpc", adv.GRPC, "peer", adv.peerAddr(), "admin", adv.adminAddr(), "err", err)
		}
	}
	m.self = newSelfAddrs(ml.LocalNode(), m.cfg.GossipAddr)
	m.stateMu.Lock()
	m.mergeSelfLocked()
	m.stateMu.Unlock()
	local := m.Local()
	m.log.Info("gossip started", "node", local.Name, "gossip", local.GossipAddr, "grpc", local.GRPCAddr,
		"peer", local.PeerAddr, "admin", local.AdminAddr,
		"incarnation", m.meta.Inc, "encrypted", len(m.cfg.GossipKey) > 0)
	m.wg.Add(1)
	go m.dispatch()
	m.life.Unlock()

	if len(m.cfg.Join) > 0 {
		if err := m.Join(ctx, m.cfg.Join); err != nil {
			_ = m.Shutdown()
			return err
		}
	}
	if m.cfg.RejoinInterval > 0 {
		m.life.Lock()
		if !m.closed && !m.left {
			rctx, cancel := context.WithCancel(m.ctx)
			m.stopRejoin = cancel
			m.wg.Add(1)
			go m.rejoinLoop(rctx, ml)
		}
		m.life.Unlock()
	}
	return nil
}

func (m *Membership) storeMeta() {
	b := m.meta.encode()
	m.metaBytes.Store(&b)
	m.inc.Store(m.meta.Inc)
}

// SetLeaving announces that this node is about to leave: peers see it in
// state StateLeaving. It keeps its keys (and stays in every view) until it
// leaves, so a node can hand its keys over between SetLeaving and Leave.
// It waits up to timeout for the announcement to be gossiped. Leave calls
// it if it was not called.
func (m *Membership) SetLeaving(timeout time.Duration) error {
	m.life.Lock()
	defer m.life.Unlock()
	if err := m.runningLocked(); err != nil {
		return err
	}
	return m.setLeavingLocked(timeout)
}

func (m *Membership) setLeavingLocked(timeout time.Duration) error {
	if m.leaving || m.left {
		return nil
	}
	m.leaving = true
	m.meta.Leaving = true
	return m.announceLocked(timeout, "announce leaving")
}

// announceLocked publishes a change of this node's metadata: in its own
// roster and view at once, to peers through gossip within timeout.
func (m *Membership) announceLocked(timeout time.Duration, what string) error {
	m.storeMeta()
	m.stateMu.Lock()
	m.mergeSelfLocked()
	m.stateMu.Unlock()
	if err := m.ml.UpdateNode(max(timeout, time.Millisecond)); err != nil {
		// memberlist keeps the broadcast queued, but a busy or lossy
		// network can leave the others with the old metadata (an
		// incarnation they keep handing keys to) until the next full
		// sync: announce it again shortly, until it goes through.
		m.stateMu.Lock()
		m.unsent = true
		m.stateMu.Unlock()
		time.AfterFunc(announceRetry, m.signal)
		return fmt.Errorf("cluster: %s: %w (announcing again in %v)", what, err, announceRetry)
	}
	m.stateMu.Lock()
	m.unsent = false
	m.stateMu.Unlock()
	return nil
}

// announceRetry is how long after a metadata announcement timed out it is
// sent again.
const announceRetry = 500 * time.Millisecond

// mergeSelfLocked puts this node's own entry, as its metadata says, into
// the roster and publishes the view if that changed it.
func (m *Membership) mergeSelfLocked() {
	e := RosterEntry{Name: m.cfg.NodeName, Incarnation: m.meta.Inc, Phase: m.meta.phase(), GRPCAddr: m.meta.GRPC}
	if m.ml != nil {
		e.GossipAddr = m.ml.LocalNode().Address()
	}
	if r, changed := m.roster.Merge(e); changed {
		m.roster = r
		m.publishLocked(Member{})
	}
}

// Incarnation returns this node's current incarnation (0 before Start).
func (m *Membership) Incarnation() uint64 { return m.metaInc() }

// Reincarnate gives this node a new incarnation, larger than every earlier
// one, and announces it. A node does so when it learns it was fenced: its
// old incarnation will never be granted a lease again. It returns the new
// incarnation.
func (m *Membership) Reincarnate(timeout time.Duration) (uint64, error) {
	m.life.Lock()
	defer m.life.Unlock()
	if err := m.runningLocked(); err != nil {
		return 0, err
	}
	m.reincarnateLocked()
	return m.meta.Inc, m.announceLocked(timeout, "announce a new incarnation")
}

func (m *Membership) reincarnateLocked() {
	prev := m.meta.Inc
	m.stateMu.Lock()
	if e, ok := m.roster.Entry(m.cfg.NodeName); ok {
		prev = max(prev, e.Incarnation)
	}
	m.reborn = false
	m.stateMu.Unlock()
	m.meta.Inc = newIncarnation(prev)
	m.log.Info("new incarnation", "incarnation", m.meta.Inc)
}

// Leave leaves the cluster gracefully: it announces it is leaving (see
// SetLeaving), then that it handed every key over (its roster entry
// becomes PhaseLeft), then gossips its departure, waiting up to timeout in
// all. Peers then see it in state StateLeft at once instead of after failure
// detection, and drop it from the roster. Call it only once every key was
// handed over: a node that could not hand its keys over stops with
// Shutdown alone, and its keys wait for it. The node keeps answering
// gossip until Shutdown, which must follow. Leave after Leave does nothing.
func (m *Membership) Leave(timeout time.Duration) error {
	m.life.Lock()
	defer m.life.Unlock()
	if err := m.runningLocked(); err != nil {
		return err
	}
	if m.left {
		return nil
	}
	if m.stopRejoin != nil {
		m.stopRejoin()
	}
	deadline := time.Now().Add(timeout)
	if err := m.setLeavingLocked(timeout / 4); err != nil {
		m.log.Warn("leave: peers may see this node fail instead of leave", "err", err)
	}
	m.meta.Left = true
	if err := m.announceLocked(timeout/4, "announce the handoff done"); err != nil {
		m.log.Warn("leave: peers may keep waiting for this node", "err", err)
	}
	m.left = true
	if err := m.ml.Leave(max(time.Until(deadline), time.Millisecond)); err != nil {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	m.log.Info("left the cluster")
	return nil
}

func (m *Membership) runningLocked() error {
	switch {
	case m.closed:
		return ErrClosed
	case m.ml == nil:
		return ErrNotStarted
	}
	return nil
}

// Shutdown stops gossip without leaving (peers detect a failure unless
// Leave came first), stops the membership's goroutines and waits for them,
// and closes every subscription. It is safe to call more than once and
// before Start.
func (m *Membership) Shutdown() error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.cancel()
	var err error
	if m.ml != nil {
		if e := m.ml.Shutdown(); e != nil {
			err = fmt.Errorf("cluster: shutdown: %w", e)
		}
	}
	m.wg.Wait()
	m.subMu.Lock()
	m.subsClosed = true
	for s := range m.subs {
		close(s.ch)
		delete(m.subs, s)
	}
	m.subMu.Unlock()
	return err
}

// View returns the current snapshot of the live members. It is shared:
// do not modify it.
func (m *Membership) View() *View { return m.view.Load() }

// Epoch returns the epoch of the current view; see View.Epoch.
func (m *Membership) Epoch() uint64 { return m.view.Load().Epoch }

// Members returns a copy of the live members, sorted by name.
func (m *Membership) Members() []Member { return slices.Clone(m.view.Load().Members) }

// Owner returns the member that owns key in the current view (see
// View.Owner), or the zero Member before Start. It does not allocate.
func (m *Membership) Owner(key string) Member { return m.view.Load().Owner(key) }

// Local returns this node as a member. Before Start its GossipAddr and
// State are empty.
func (m *Membership) Local() Member {
	if p := m.local.Load(); p != nil {
		return *p
	}
	md := newMeta(m.cfg, 0, 0)
	return Member{Name: m.cfg.NodeName, GRPCAddr: md.GRPC, PeerAddr: md.peerAddr(), AdminAddr: md.adminAddr()}
}

// Nodes returns the live members and the last members seen dead or left
// (up to 64, until they come back), sorted by name: the operator's view.
func (m *Membership) Nodes() []Member {
	m.stateMu.Lock()
	nodes := make([]Member, 0, len(m.live)+len(m.departed))
	for _, n := range m.live {
		nodes = append(nodes, n)
	}
	for _, n := range m.departed {
		nodes = append(nodes, n)
	}
	m.stateMu.Unlock()
	slices.SortFunc(nodes, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return nodes
}

// Subscribe returns a channel that receives the current view at once and
// then every later view, and a function that ends the subscription and
// closes the channel. Delivery never blocks memberlist: the channel holds
// one view, and a view the subscriber has not taken yet is replaced by the
// newer one, so a slow subscriber skips views but always ends with the
// latest. Epochs received only increase. Shutdown closes the channel.
func (m *Membership) Subscribe() (<-chan *View, func()) {
	s := &subscriber{ch: make(chan *View, 1)}
	m.subMu.Lock()
	defer m.subMu.Unlock()
	if m.subsClosed {
		close(s.ch)
		return s.ch, func() {}
	}
	v := m.view.Load()
	s.ch <- v
	s.last = v.Epoch
	m.subs[s] = struct{}{}
	return s.ch, func() {
		m.subMu.Lock()
		defer m.subMu.Unlock()
		if _, ok := m.subs[s]; ok {
			delete(m.subs, s)
			close(s.ch)
		}
	}
}

// dispatch delivers new views to subscribers, off memberlist's goroutines.
func (m *Membership) dispatch() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.notify:
		}
		m.storeRoster()
		v := m.view.Load()
		m.subMu.Lock()
		for s := range m.subs {
			if v.Epoch <= s.last {
				continue
			}
			select { // drop a view not taken yet, then send the newest
			case <-s.ch:
			default:
			}
			s.ch <- v // cannot block: this goroutine is the only sender
			s.last = v.Epoch
		}
		m.subMu.Unlock()
	}
}

// storeRoster writes the roster to Config.Store when it changed since it
// was last written, and takes a new incarnation when the roster holds a
// newer entry for this node than the one it announces.
func (m *Membership) storeRoster() {
	m.stateMu.Lock()
	r, reborn, unsent := m.roster, m.reborn, m.unsent
	m.stateMu.Unlock()
	if unsent && !reborn {
		if m.life.TryLock() {
			if m.runningLocked() == nil && !m.left {
				if err := m.announceLocked(m.cfg.TCPTimeout, "announce this node's metadata again"); err != nil {
					m.log.Warn("metadata not announced", "err", err)
				}
			}
			m.life.Unlock()
		} else {
			time.AfterFunc(50*time.Millisecond, m.signal)
		}
	}
	if reborn {
		// Shutdown holds the life lock while it waits for this goroutine:
		// never block on it here; try again shortly instead.
		if m.life.TryLock() {
			if m.runningLocked() == nil && !m.leaving && !m.left {
				m.reincarnateLocked()
				if err := m.announceLocked(m.cfg.TCPTimeout, "announce a new incarnation"); err != nil {
					m.log.Warn("new incarnation", "err", err)
				}
			}
			m.life.Unlock()
		} else {
			time.AfterFunc(50*time.Millisecond, m.signal)
		}
		m.stateMu.Lock()
		r = m.roster
		m.stateMu.Unlock()
	}
	if m.cfg.Store == nil || r == m.stored {
		return
	}
	if err := m.cfg.Store.PutMeta(rosterBucket, rosterKey, r.encode()); err != nil {
		m.log.Error("store the roster", "err", err)
		return
	}
	m.stored = r
}

// nodeUp records a member that joined or changed; called by memberlist
// with its node lock held.
func (m *Membership) nodeUp(n *memberlist.Node, kind ChangeKind) {
	md, err := decodeMeta(n.Meta)
	if err != nil {
		m.log.Warn("ignoring member with unreadable metadata", "member", n.Name, "err", err)
		return
	}
	mem := Member{
		Name:        n.Name,
		GossipAddr:  n.Address(),
		GRPCAddr:    md.GRPC,
		PeerAddr:    md.peerAddr(),
		AdminAddr:   md.adminAddr(),
		State:       StateAlive,
		Started:     md.started(),
		Incarnation: md.Inc,
	}
	if md.Leaving {
		mem.State = StateLeaving
	}
	m.stateMu.Lock()
	m.mergeRosterLocked(RosterEntry{Name: n.Name, Incarnation: md.Inc, Phase: md.phase(), GossipAddr: mem.GossipAddr, GRPCAddr: md.GRPC})
	old, existed := m.live[n.Name]
	if existed && sameMember(old, mem) {
		m.stateMu.Unlock()
		return
	}
	if !existed {
		kind = ChangeJoined
	} else if kind == ChangeJoined {
		kind = ChangeUpdated
	}
	m.live[n.Name] = mem
	delete(m.departed, n.Name)
	v := m.publishLocked(mem)
	m.recordChangeLocked(kind, mem, v)
	m.stateMu.Unlock()
	m.obs.Changed(kind, v.Epoch, v.Len())
	m.log.Info("member "+kind.String(), "member", mem.Name, "gossip", mem.GossipAddr, "grpc", mem.GRPCAddr, "peer", mem.PeerAddr,
		"state", mem.State.String(), "epoch", v.Epoch, "members", v.Len())
}

// nodeDown records a member that left or failed; called by memberlist with
// its node lock held.
func (m *Membership) nodeDown(n *memberlist.Node) {
	m.stateMu.Lock()
	mem, ok := m.live[n.Name]
	if !ok {
		m.stateMu.Unlock()
		return
	}
	delete(m.live, n.Name)
	if md, err := decodeMeta(n.Meta); err == nil && md.Left {
		m.mergeRosterLocked(RosterEntry{Name: n.Name, Incarnation: md.Inc, Phase: PhaseLeft, GossipAddr: n.Address(), GRPCAddr: md.GRPC})
	}
	kind, state := ChangeFailed, StateDead
	if mem.State == StateLeaving || isLeaving(n.Meta) {
		kind, state = ChangeLeft, StateLeft
	}
	mem.State = state
	m.departed[n.Name] = mem
	if len(m.departed) > maxDeparted {
		m.forgetOldestDepartedLocked()
	}
	v := m.publishLocked(mem)
	m.recordChangeLocked(kind, mem, v)
	m.stateMu.Unlock()
	m.obs.Changed(kind, v.Epoch, v.Len())
	m.log.Info("member "+kind.String(), "member", mem.Name, "gossip", mem.GossipAddr, "epoch", v.Epoch, "members", v.Len())
}

func isLeaving(b []byte) bool {
	md, err := decodeMeta(b)
	return err == nil && md.Leaving
}

func sameMember(a, b Member) bool {
	return a.Name == b.Name && a.GossipAddr == b.GossipAddr && a.GRPCAddr == b.GRPCAddr &&
		a.PeerAddr == b.PeerAddr && a.AdminAddr == b.AdminAddr &&
		a.State == b.State && a.Started.Equal(b.Started) && a.Incarnation == b.Incarnation
}

// mergeRosterLocked merges es into the roster; a change publishes a new
// view (and the dispatcher stores the roster). An entry newer than this
// node's own (a lost disk, a clock that went back, an operator who forgot
// this node) makes the dispatcher take a new incarnation above it.
func (m *Membership) mergeRosterLocked(es ...RosterEntry) {
	r, changed := m.roster.Merge(es...)
	if !changed {
		return
	}
	m.roster = r
	if e, ok := r.Entry(m.cfg.NodeName); ok && m.metaBytes.Load() != nil {
		own := RosterEntry{Incarnation: m.metaInc(), Phase: m.metaPhase()}
		if e.newer(own) && !m.leavingOrLeft() {
			m.reborn = true
		}
	}
	m.publishLocked(Member{})
}

// metaInc, metaPhase and leavingOrLeft read what this node announces; they
// use the metadata bytes (atomic) so that memberlist's callbacks need not
// take the life lock.
func (m *Membership) metaInc() uint64 { return m.inc.Load() }

func (m *Membership) metaPhase() Phase {
	b := m.metaBytes.Load()
	if b == nil {
		return PhaseJoined
	}
	md, _ := decodeMeta(*b)
	return md.phase()
}

func (m *Membership) leavingOrLeft() bool { return m.metaPhase() != PhaseJoined }

// Errors of Forget.
var (
	// ErrAlive means a member cannot be forgotten because it is alive.
	ErrAlive = errors.New("cluster: the member is alive")
	// ErrNoMember means the roster has no member of that name.
	ErrNoMember = errors.New("cluster: no such member")
)

// Forget removes the member named name from the roster (PhaseLeft at its
// latest incarnation): it owns no keys any more, and nothing waits for the
// state it held. It is for a member that is down for good; a live member
// is refused with ErrAlive, and so is this node. The roster spreads the
// change by gossip; if the member comes back, it joins again under a new
// incarnation.
func (m *Membership) Forget(name string) error {
	if name == m.cfg.NodeName {
		return fmt.Errorf("%w: %s is this node", ErrAlive, name)
	}
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	if _, live := m.live[name]; live {
		return fmt.Errorf("%w: %s is in this node's view; stop it (or let it leave) first", ErrAlive, name)
	}
	e, ok := m.roster.Entry(name)
	if !ok {
		return fmt.Errorf("%w: %q is not in the roster", ErrNoMember, name)
	}
	if e.Phase == PhaseLeft {
		return nil
	}
	e.Phase = PhaseLeft
	m.log.Warn("forgetting a member: its keys go to the others without its state", "member", name, "incarnation", e.Incarnation)
	m.mergeRosterLocked(e)
	return nil
}

// Roster returns the current roster.
func (m *Membership) Roster() *Roster {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	return m.roster
}

func (m *Membership) forgetOldestDepartedLocked() {
	var oldest string
	var at time.Time
	for name, d := range m.departed {
		if oldest == "" || d.Started.Before(at) {
			oldest, at = name, d.Started
		}
	}
	delete(m.departed, oldest)
}

// publishLocked stores a new view of the live members and wakes the
// dispatcher. changed is the member that changed.
func (m *Membership) publishLocked(changed Member) *View {
	m.epoch++
	members := make([]Member, 0, len(m.live))
	for _, mem := range m.live {
		members = append(members, mem)
	}
	v := NewView(m.epoch, members)
	v.Roster = m.roster
	m.view.Store(v)
	if changed.Name == m.cfg.NodeName {
		m.local.Store(&changed)
	}
	m.signal()
	return v
}

// signal wakes the dispatcher.
func (m *Membership) signal() {
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// hooks receives memberlist's callbacks for a Membership.
type hooks struct{ m *Membership }

// NodeMeta implements memberlist.Delegate.
func (h hooks) NodeMeta(limit int) []byte {
	b := *h.m.metaBytes.Load()
	if len(b) > limit {
		panic(fmt.Sprintf("cluster: node meta of %d bytes over memberlist's limit %d", len(b), limit)) // Validate bounds it
	}
	return b
}

// NotifyMsg implements memberlist.Delegate; Sluice sends no user messages.
func (hooks) NotifyMsg([]byte) {}

// GetBroadcasts implements memberlist.Delegate.
func (hooks) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState implements memberlist.Delegate: the roster travels with every
// push-pull, so a node that joins learns the members that are down too.
func (h hooks) LocalState(join bool) []byte { return h.m.Roster().encode() }

// MergeRemoteState implements memberlist.Delegate.
func (h hooks) MergeRemoteState(buf []byte, join bool) {
	es, err := decodeRoster(buf)
	if err != nil {
		h.m.log.Warn("ignoring a peer's unreadable roster", "err", err)
		return
	}
	h.m.stateMu.Lock()
	h.m.mergeRosterLocked(es...)
	h.m.stateMu.Unlock()
}

// NotifyJoin implements memberlist.EventDelegate.
func (h hooks) NotifyJoin(n *memberlist.Node) { h.m.nodeUp(n, ChangeJoined) }

// NotifyUpdate implements memberlist.EventDelegate.
func (h hooks) NotifyUpdate(n *memberlist.Node) { h.m.nodeUp(n, ChangeUpdated) }

// NotifyLeave implements memberlist.EventDelegate.
func (h hooks) NotifyLeave(n *memberlist.Node) { h.m.nodeDown(n) }

// NotifyAlive implements memberlist.AliveDelegate: nodes that do not carry
// Sluice metadata (another memberlist application on the same network)
// are kept out.
func (hooks) NotifyAlive(n *memberlist.Node) error {
	if _, err := decodeMeta(n.Meta); err != nil {
		return fmt.Errorf("not a sluice node: metadata: %v", err)
	}
	return nil
}
