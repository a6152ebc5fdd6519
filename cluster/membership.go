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

	"github.com/sluice-io/sluice/cluster/control"
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

	life       sync.Mutex // serialises Start, SetClusterID, Leave and Shutdown
	ml         *memberlist.Memberlist
	meta       meta // what this node gossips about itself; under life
	left       bool
	closed     bool
	stopRejoin context.CancelFunc
	self       selfAddrs // to skip this node in join lists

	metaBytes   atomic.Pointer[[]byte] // read by memberlist's NodeMeta
	joinsOthers atomic.Bool            // the join list named other nodes

	// lookupIP resolves join names; tests replace it before Start.
	lookupIP func(ctx context.Context, host string) ([]net.IPAddr, error)

	// stateMu guards the fields below. It is taken inside memberlist's
	// callbacks (which hold memberlist's node lock), so nothing may call
	// into memberlist while holding it.
	stateMu  sync.Mutex
	live     map[string]Member
	departed map[string]Member
	epoch    uint64
	known    []string // gossip addresses of the cluster map's members (SetKnown)
	unsent   bool     // announcing this node's metadata timed out: announce it again

	changes []Change // the last changes of the live members (Changes); under stateMu

	view  atomic.Pointer[View]
	local atomic.Pointer[Member]

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
	m.view.Store(NewView(0, nil))
	return m, nil
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
	m.meta = newMeta(m.cfg, time.Now().UnixNano())
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
	targets, _, _ := m.resolve(context.Background(), m.cfg.Join)
	m.joinsOthers.Store(len(targets) > 0)
	local := m.Local()
	m.log.Info("gossip started", "node", local.Name, "gossip", local.GossipAddr, "grpc", local.GRPCAddr,
		"peer", local.PeerAddr, "admin", local.AdminAddr, "encrypted", len(m.cfg.GossipKey) > 0)
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
}

// announceLocked publishes a change of this node's metadata to peers
// through gossip within timeout.
func (m *Membership) announceLocked(timeout time.Duration, what string) error {
	m.storeMeta()
	if err := m.ml.UpdateNode(max(timeout, time.Millisecond)); err != nil {
		// memberlist keeps the broadcast queued, but a busy or lossy
		// network can leave the others with the old metadata until the
		// next full sync: announce it again shortly, until it goes
		// through.
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

// Leave gossips this node's departure, waiting up to timeout: peers then
// see it in state StateLeft at once instead of after failure detection.
// (What happens to its keys is the cluster map's business: see
// control.Control.Leave.) The node keeps answering gossip until Shutdown,
// which must follow. Leave after Leave does nothing.
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
	m.meta.Left = true
	if err := m.announceLocked(timeout/2, "announce leaving"); err != nil {
		m.log.Warn("leave: peers may record a failure rather than a departure", "err", err)
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

// SetClusterID announces the cluster this node belongs to (its peers then
// stop counting it among the nodes that may bootstrap one). It implements
// control.Gossip.
func (m *Membership) SetClusterID(id string) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.runningLocked() != nil || m.meta.Cluster == id {
		return
	}
	m.meta.Cluster = id
	if err := m.announceLocked(m.cfg.TCPTimeout, "announce the cluster ID"); err != nil {
		m.log.Warn("cluster ID not announced yet", "err", err)
	}
	self := m.Local()
	self.ClusterID = id
	m.local.Store(&self)
}

// SetBootstrap announces whether this node has Raft state and the digest
// of its bootstrap set. It implements control.Gossip.
func (m *Membership) SetBootstrap(boot string, raft bool) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.runningLocked() != nil || m.meta.Boot == boot && m.meta.Raft == raft {
		return
	}
	m.meta.Boot, m.meta.Raft = boot, raft
	if err := m.announceLocked(m.cfg.TCPTimeout, "announce the bootstrap state"); err != nil {
		m.log.Warn("bootstrap state not announced yet", "err", err)
	}
	self := m.Local()
	self.Boot, self.Raft = boot, raft
	m.local.Store(&self)
}

// Peers returns the nodes gossip sees alive now, this one included, with
// what they announce. It implements control.Gossip.
func (m *Membership) Peers() []control.Peer {
	var out []control.Peer
	self := false
	for _, x := range m.View().Members {
		if x.Name == m.cfg.NodeName {
			self = true
		}
		out = append(out, control.Peer{Name: x.Name, ID: x.ID, ClusterID: x.ClusterID, Raft: x.Raft, Boot: x.Boot, Zone: x.Zone, Expect: x.Expect,
			Settings: x.Settings, Addrs: control.Addrs{Gossip: x.GossipAddr, GRPC: x.GRPCAddr, Peer: x.PeerAddr, Admin: x.AdminAddr}})
	}
	if !self {
		m.life.Lock()
		md := m.meta
		m.life.Unlock()
		l := m.Local()
		out = append(out, control.Peer{Name: m.cfg.NodeName, ID: md.ID, ClusterID: md.Cluster, Raft: md.Raft, Boot: md.Boot, Zone: md.Zone, Expect: md.Expect,
			Settings: md.Settings, Addrs: control.Addrs{Gossip: l.GossipAddr, GRPC: md.GRPC, Peer: md.peerAddr(), Admin: md.adminAddr()}})
	}
	return out
}

// Alive reports whether gossip sees the named node alive now. It
// implements control.Gossip.
func (m *Membership) Alive(name string) bool {
	x, ok := m.View().Member(name)
	return ok && x.State == StateAlive
}

// JoinsOthers reports whether the join list named nodes other than this
// one when the node started. It implements control.Gossip.
func (m *Membership) JoinsOthers() bool { return m.joinsOthers.Load() }

// SetKnown gives the gossip addresses of the cluster map's members: the
// rejoin loop contacts those that are not in the view (a restarted node
// finds the members it knew even when its join list names only itself).
func (m *Membership) SetKnown(addrs []string) {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	m.known = slices.Clone(addrs)
}

func (m *Membership) knownAddrs() []string {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	return m.known
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
	md := newMeta(m.cfg, 0)
	return Member{Name: m.cfg.NodeName, GRPCAddr: md.GRPC, PeerAddr: md.peerAddr(), AdminAddr: md.adminAddr(), ID: m.cfg.ID}
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
		m.retryAnnounce()
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

// retryAnnounce announces this node's metadata again when the last
// announcement timed out.
func (m *Membership) retryAnnounce() {
	m.stateMu.Lock()
	unsent := m.unsent
	m.stateMu.Unlock()
	if !unsent {
		return
	}
	// Shutdown holds the life lock while it waits for this goroutine:
	// never block on it here; try again shortly instead.
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

// nodeUp records a member that joined or changed; called by memberlist
// with its node lock held.
func (m *Membership) nodeUp(n *memberlist.Node, kind ChangeKind) {
	md, err := decodeMeta(n.Meta)
	if err != nil {
		m.log.Warn("ignoring member with unreadable metadata", "member", n.Name, "err", err)
		return
	}
	mem := Member{
		Name:       n.Name,
		GossipAddr: n.Address(),
		GRPCAddr:   md.GRPC,
		PeerAddr:   md.peerAddr(),
		AdminAddr:  md.adminAddr(),
		State:      StateAlive,
		Started:    md.started(),
		ID:         md.ID,
		ClusterID:  md.Cluster,
		Raft:       md.Raft,
		Boot:       md.Boot,
		Expect:     md.Expect,
		Settings:   md.Settings,
		Zone:       md.Zone,
	}
	m.stateMu.Lock()
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
	kind, state := ChangeFailed, StateDead
	if md, err := decodeMeta(n.Meta); err == nil && md.Left {
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

func sameMember(a, b Member) bool {
	return a.Name == b.Name && a.GossipAddr == b.GossipAddr && a.GRPCAddr == b.GRPCAddr &&
		a.PeerAddr == b.PeerAddr && a.AdminAddr == b.AdminAddr &&
		a.State == b.State && a.Started.Equal(b.Started) && a.ID == b.ID && a.ClusterID == b.ClusterID &&
		a.Raft == b.Raft && a.Boot == b.Boot &&
		a.Expect == b.Expect && a.Settings == b.Settings && a.Zone == b.Zone
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

// LocalState implements memberlist.Delegate; Sluice adds no state of its
// own to push-pull.
func (hooks) LocalState(bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (hooks) MergeRemoteState([]byte, bool) {}

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
