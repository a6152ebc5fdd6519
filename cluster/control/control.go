package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Errors of the control plane.
var (
	// ErrNoLeader means no Raft leader is known now: no quorum of voters
	// can be reached, or an election is under way.
	ErrNoLeader = errors.New("control: no leader")
	// ErrMismatch means this node's cluster-wide settings differ from the
	// cluster's: it refuses to join.
	ErrMismatch = errors.New("control: settings differ from the cluster's")
	// ErrTwoClusters means gossip shows members of another cluster.
	ErrTwoClusters = errors.New("control: two clusters")
	// ErrAlive means a member cannot be forgotten because gossip sees it
	// alive.
	ErrAlive = errors.New("control: the member is alive")
	// ErrNoMember means the map has no member of that name.
	ErrNoMember = errors.New("control: no such member")
	// ErrClosed means the control plane was shut down.
	ErrClosed = errors.New("control: shut down")
	// ErrRefused means the state machine applied a proposal and refused
	// it: the map did not change. The error says why (a stale version or
	// leader epoch, an epoch that ended, a broken invariant).
	ErrRefused = errors.New("control: refused")
)

// Clock reads a clock that keeps counting while the machine is suspended
// (CLOCK_BOOTTIME on Linux), as a duration since an arbitrary origin. Only
// its rate is assumed to match other nodes' clocks, within ClockDrift.
type Clock interface {
	Now() time.Duration
}

// Peer is a node as gossip announces it.
type Peer struct {
	Name      string
	ID        string // Raft server ID; "" for a node without one
	ClusterID string // "" before it joined a cluster
	Raft      bool   // it has Raft state: a log entry or a vote
	Boot      string // the digest of its bootstrap set, "" before it has one
	Zone      string
	Expect    int
	Settings  string // Settings.String()
	Addrs     Addrs
}

// Gossip is what the control plane needs from failure detection and
// discovery (memberlist): it never decides anything from it but when to
// end an epoch, whom to add, and whom to bootstrap with.
type Gossip interface {
	// Peers returns the nodes gossip sees alive now, this one included.
	Peers() []Peer
	// Alive reports whether gossip sees the named node alive now.
	Alive(name string) bool
	// JoinsOthers reports whether this node's join list names nodes other
	// than itself.
	JoinsOthers() bool
	// SetClusterID announces the cluster this node belongs to.
	SetClusterID(id string)
	// SetBootstrap announces the digest of this node's bootstrap set and
	// whether it has Raft state (see bootstrap.go).
	SetBootstrap(boot string, raft bool)
}

// Observer receives measurements for metrics. Its methods must not block.
type Observer interface {
	// Renewed is called after each lease renewal: whether it was granted.
	Renewed(granted bool)
}

type nopObserver struct{}

func (nopObserver) Renewed(bool) {}

// Config configures a Control. Zero durations mean their defaults.
type Config struct {
	// NodeName is this node's name.
	NodeName string
	// DataDir holds raft.db (the log, the vote, the server ID) and
	// raft-snapshots/. Required.
	DataDir string
	// Expect is how many nodes bootstrap the cluster together: a node
	// with no Raft state bootstraps only with at least that many nodes
	// without a cluster that run its Settings, all of which announce the
	// same bootstrap set (see bootstrap.go). It means nothing once the
	// cluster exists. Default 1.
	Expect int
	// Settings are this node's cluster-wide settings; the cluster's must
	// match. Zero fields take their defaults (replicas 1, policy exact, a
	// lease of 2s, min-insync 1 with partitions); New refuses settings
	// that are not valid (Settings.Validate).
	Settings Settings
	// Zone is this node's failure domain, for placing voters. Optional.
	Zone string
	// Addrs are this node's addresses; Addrs.Peer is its Raft address.
	Addrs Addrs
	// Gossip is failure detection and discovery. Required.
	Gossip Gossip
	// Transport carries Raft (its Advertise is set from Addrs.Peer when
	// empty). Required: its Listener.
	Transport TransportConfig
	// DialOptions reach the leader's peer service (renewals, proposals);
	// the node's add keepalive pings.
	DialOptions []grpc.DialOption
	// CallTimeout bounds each call to the leader: a proposal (this node's
	// epoch, its synced mark, its leaving) or a renewal, which is given up
	// then and tried again against whoever leads by then. Default: the
	// lease, and at least four RaftTimeouts.
	CallTimeout time.Duration
	// ClockDrift (ρ) bounds how much faster one node's clock may run than
	// another's. Default 0.1.
	ClockDrift float64
	// MayHaveLost says that the data directory's last process may have
	// lost writes it acknowledged (it did not stop cleanly and the machine
	// rebooted since: persist.Store.MayHaveLost). The first epoch this
	// process starts says so in the map, where no partition waits for this
	// node's copy under policy exact (see startPartitions).
	MayHaveLost bool
	// Clock is CLOCK_BOOTTIME; tests may inject another.
	Clock Clock
	// RaftTimeout is Raft's heartbeat and election timeout. Default 500ms.
	RaftTimeout time.Duration
	// Logger receives the control plane's logs and Raft's; nil discards.
	Logger *slog.Logger
	// Observer receives measurements; nil discards.
	Observer Observer
}

func (c Config) withDefaults() Config {
	if c.Expect <= 0 {
		c.Expect = 1
	}
	if c.ClockDrift <= 0 {
		c.ClockDrift = 0.1
	}
	if c.Clock == nil {
		c.Clock = bootClock{}
	}
	if c.RaftTimeout <= 0 {
		c.RaftTimeout = 500 * time.Millisecond
	}
	if c.Settings.Lease <= 0 {
		c.Settings.Lease = 2 * time.Second
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = max(c.Settings.Lease, 4*c.RaftTimeout)
	}
	if c.Settings.Replicas <= 0 {
		c.Settings.Replicas = 1
	}
	if c.Settings.Policy == "" {
		c.Settings.Policy = "exact"
	}
	if c.Settings.Partitions > 0 && c.Settings.MinInsync == 0 {
		c.Settings.MinInsync = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Transport.Advertise == "" {
		c.Transport.Advertise = c.Addrs.Peer
	}
	if c.DialOptions == nil {
		c.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return c
}

// Control is this node's part of the control plane: a Raft server holding
// the cluster map, this node's epoch and lease, and, on the leader, the
// granting of leases, the ending of epochs and the placing of voters.
type Control struct {
	cfg    Config
	log    *slog.Logger
	clock  Clock
	store  *store
	stream *stream
	trans  *raft.NetworkTransport
	snaps  raft.SnapshotStore
	raft   *raft.Raft
	fsm    *fsm

	// boot is this node's bootstrap set and bootDigest its digest; only
	// bootstrapLoop touches them after New.
	boot       bootSet
	bootDigest string
	bootGrown  time.Time // when boot last grew

	// epoch is this process's live epoch, 0 while it has none; epochAt is
	// the map version that started it.
	epoch   atomic.Uint64
	epochAt atomic.Uint64
	// stopping is set once the node leaves: it renews nothing and starts
	// no epoch again.
	stopping atomic.Bool
	// mayHaveLost is Config.MayHaveLost until an epoch started.
	mayHaveLost atomic.Bool

	lease holder

	granter atomic.Pointer[granter] // set while this node leads

	leader leaderConn

	renewKick chan struct{} // capacity 1: renew now (a new epoch)

	unseenMu sync.Mutex
	unseen   map[string]time.Time // voters' IDs, since when they are not healthy

	fatal     chan error // capacity 1
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New opens the Raft store in cfg.DataDir and starts the Raft server. The
// node bootstraps or joins a cluster once Start runs.
func New(cfg Config) (*Control, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.NodeName == "":
		return nil, fmt.Errorf("control: config: node name is empty")
	case cfg.DataDir == "":
		return nil, fmt.Errorf("control: config: a cluster node needs a data directory for its Raft log, even with --durability memory")
	case cfg.Gossip == nil:
		return nil, fmt.Errorf("control: config: no gossip")
	case cfg.Transport.Listener == nil:
		return nil, fmt.Errorf("control: config: no listener for Raft")
	case cfg.Transport.Advertise == "":
		return nil, fmt.Errorf("control: config: no peer address to advertise for Raft")
	}
	if err := cfg.Settings.Validate(); err != nil {
		return nil, err
	}
	if cfg.Transport.ClusterID == nil {
		cfg.Transport.ClusterID = func() string { return "" }
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	st, err := openStore(filepath.Join(cfg.DataDir, "raft.db"))
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "control")
	c := &Control{cfg: cfg, log: log, clock: cfg.Clock, store: st, fsm: newFSM(log),
		fatal: make(chan error, 1), renewKick: make(chan struct{}, 1), leader: leaderConn{dial: cfg.DialOptions}}
	c.lease.clock, c.lease.length = cfg.Clock, cfg.Settings.Lease
	c.mayHaveLost.Store(cfg.MayHaveLost)
	ok := false
	defer func() {
		if !ok {
			st.Close()
		}
	}()
	if c.boot, err = st.loadBootSet(); err != nil {
		return nil, err
	}
	if len(c.boot) > 0 {
		c.bootDigest = c.boot.digest(cfg.Settings.String())
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, "raft-snapshots"), 2, newHCLogger(c.log))
	if err != nil {
		return nil, fmt.Errorf("control: snapshots: %w", err)
	}
	c.snaps = snaps
	tcfg := cfg.Transport
	tcfg.ClusterID = c.ClusterID
	c.stream, err = newStream(tcfg)
	if err != nil {
		return nil, err
	}
	c.trans = newRaftTransport(c.stream, newHCLogger(c.log))
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(st.id)
	rc.HeartbeatTimeout = cfg.RaftTimeout
	rc.ElectionTimeout = cfg.RaftTimeout
	rc.LeaderLeaseTimeout = cfg.RaftTimeout / 2
	rc.CommitTimeout = 20 * time.Millisecond
	rc.SnapshotInterval = 30 * time.Second
	rc.SnapshotThreshold = 2048
	rc.TrailingLogs = 1024
	rc.ShutdownOnRemove = false
	rc.Logger = newHCLogger(c.log)
	c.raft, err = raft.NewRaft(rc, c.fsm, st, st, snaps, c.trans)
	if err != nil {
		c.trans.Close()
		c.stream.wait()
		return nil, fmt.Errorf("control: start raft: %w", err)
	}
	ok = true
	return c, nil
}

// Self returns this node's name.
func (c *Control) Self() string { return c.cfg.NodeName }

// ID returns this node's Raft server ID.
func (c *Control) ID() string { return c.store.id }

// ClusterID returns the cluster's ID, "" before this node joined one.
func (c *Control) ClusterID() string { return c.fsm.cur.Load().ClusterID }

// Map returns the latest applied cluster map.
func (c *Control) Map() *Map { return c.fsm.cur.Load() }

// Watch returns the latest applied map and a channel closed when a newer
// one is applied.
func (c *Control) Watch() (*Map, <-chan struct{}) { return c.fsm.current() }

// Epoch returns this process's live epoch, 0 while it has none.
func (c *Control) Epoch() uint64 { return c.epoch.Load() }

// Fatal delivers an error that stops the node (settings that differ from
// the cluster's).
func (c *Control) Fatal() <-chan error { return c.fatal }

// Leader returns the name of the Raft leader, "" when none is known.
func (c *Control) Leader() string {
	_, id := c.raft.LeaderWithID()
	if id == "" {
		return ""
	}
	if x, ok := c.Map().MemberByID(string(id)); ok {
		return x.Name
	}
	return ""
}

// Servers returns the Raft configuration: each server's ID and whether it
// votes.
func (c *Control) Servers() map[string]bool {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	out := make(map[string]bool)
	for _, s := range f.Configuration().Servers {
		out[string(s.ID)] = s.Suffrage == raft.Voter
	}
	return out
}

// Start checks what gossip shows against this node's settings (a node
// without a cluster of its own is refused at once, with one line naming
// the setting, if the cluster it would join runs other settings), then
// bootstraps or joins in the background and keeps this node's epoch and
// lease. It returns without waiting for the cluster.
func (c *Control) Start() error {
	if _, err := c.checkPeers(); err != nil {
		return err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if c.raft.LastIndex() > 0 {
		c.log.Info("raft state found: rejoining the cluster", "id", c.ID())
	} else {
		c.log.Info("no raft state: joining a cluster, or bootstrapping one with the others", "id", c.ID(), "expect", c.cfg.Expect)
	}
	for _, loop := range []func(context.Context){c.bootstrapLoop, c.leaderLoop, c.epochLoop, c.renewLoop, c.followLeader} {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			loop(c.ctx)
		}()
	}
	return nil
}

// checkPeers holds the nodes gossip shows that announce a cluster against
// this node. A node without a cluster of its own (no Raft state, no
// cluster ID) is about to join the one gossip shows: it gets ErrMismatch
// if a node of that cluster runs other settings, and ErrTwoClusters if
// gossip shows several (it cannot tell which to join). A node of a
// cluster gets no error: the nodes of other clusters, which it returns as
// strangers, are not its concern but to be named in a warning. A node
// with Raft state that has not applied its map yet cannot tell strangers
// from its own cluster: it returns none.
func (c *Control) checkPeers() (strangers []Peer, err error) {
	own := c.ClusterID()
	if own != "" || c.raft.LastIndex() > 0 {
		if own == "" {
			return nil, nil
		}
		for _, p := range c.cfg.Gossip.Peers() {
			if p.ClusterID != "" && p.ClusterID != own && p.Name != c.cfg.NodeName {
				strangers = append(strangers, p)
			}
		}
		return strangers, nil
	}
	mine := c.cfg.Settings
	seen := make(map[string]string)
	var mismatch error
	for _, p := range c.cfg.Gossip.Peers() {
		if p.ClusterID == "" || p.Name == c.cfg.NodeName {
			continue
		}
		seen[p.ClusterID] = p.Name
		s, err := ParseSettings(p.Settings)
		if err != nil {
			continue
		}
		if why := s.Mismatch(mine); why != "" && mismatch == nil {
			mismatch = fmt.Errorf("%w: this node runs with %s (seen on %s); stop it, fix its flags, start it again", ErrMismatch, why, p.Name)
		}
	}
	if len(seen) > 1 {
		var parts []string
		for id, name := range seen {
			parts = append(parts, fmt.Sprintf("%s (%s)", id, name))
		}
		slices.Sort(parts)
		return nil, fmt.Errorf("%w: gossip shows clusters %s; they never merge: stop one and start its nodes with empty data directories to join the other", ErrTwoClusters, strings.Join(parts, " and "))
	}
	return nil, mismatch
}

// fail delivers a fatal error once.
func (c *Control) fail(err error) {
	select {
	case c.fatal <- err:
	default:
	}
}

// bootstrapLoop bootstraps the cluster with the others (see docs/cluster.md,
// "Bootstrap"), or waits to be added, until this node's map has a cluster.
func (c *Control) bootstrapLoop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var lastLoud time.Time
	loud := func(msg string, args ...any) {
		if time.Since(lastLoud) > 5*time.Second {
			c.log.Warn(msg, args...)
			lastLoud = time.Now()
		}
	}
	announced := ""
	warned := make(map[string]time.Time) // strangers, by name: when last named
	var bootSaid struct {
		digest string
		raft   bool
	}
	for {
		// The cluster ID is announced only once this node's settings
		// match its cluster's: a node restarted with a changed flag stops
		// without having shown itself as a member of the cluster.
		if id := c.ClusterID(); id != "" && id != announced {
			if why := c.Map().Settings.Mismatch(c.cfg.Settings); why != "" {
				c.fail(fmt.Errorf("%w: this node runs with %s; stop it, fix its flags, start it again", ErrMismatch, why))
			} else {
				c.cfg.Gossip.SetClusterID(id)
				announced = id
			}
		}
		strangers, err := c.checkPeers()
		switch {
		case errors.Is(err, ErrMismatch):
			c.fail(err)
		case err != nil:
			loud(err.Error())
		}
		for _, p := range strangers {
			if time.Since(warned[p.Name]) < 5*time.Second {
				continue
			}
			warned[p.Name] = time.Now()
			c.log.Warn("gossip shows a node of another cluster: it is not admitted; stop it, or take it out of this cluster's join list and network",
				"stranger", p.Name, "its_cluster", p.ClusterID, "cluster", c.ClusterID(), "its_settings", p.Settings, "gossip", p.Addrs.Gossip)
		}
		state := c.hasState()
		if announced == "" && !state {
			c.tryBootstrap(loud)
			state = c.hasState()
		}
		if bootSaid.digest != c.bootDigest || bootSaid.raft != state {
			c.cfg.Gossip.SetBootstrap(c.bootDigest, state)
			bootSaid.digest, bootSaid.raft = c.bootDigest, state
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// voterTarget is how many of n servers vote: one of 1 or 2 (a second
// voter would only add a way to lose the quorum: two voters need both),
// 3 below five, 5 from five. An even count never gains a failure it
// survives over the odd one below it.
func voterTarget(n int) int {
	switch {
	case n <= 2:
		return min(n, 1)
	case n < 5:
		return 3
	}
	return 5
}

// epochLoop starts an epoch for this process once the map lists it, and a
// new one whenever the leader ended it (the node was cut off or paused).
func (c *Control) epochLoop(ctx context.Context) {
	for {
		m, changed := c.Watch()
		c.ensureEpoch(ctx, m)
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

func (c *Control) ensureEpoch(ctx context.Context, m *Map) {
	if c.stopping.Load() {
		return
	}
	if c.epoch.Load() != 0 && m.Version < c.epochAt.Load() {
		return // this node has not applied its own start yet
	}
	x, ok := m.Member(c.cfg.NodeName)
	if !ok || x.ID != c.ID() || x.Phase == PhaseLeft {
		if e := c.epoch.Load(); e != 0 {
			c.log.Warn("this node is no longer a member of the map: it decides nothing until it is added again", "epoch", e)
			c.setEpoch(0)
		}
		return
	}
	if e := c.epoch.Load(); e != 0 && x.Live && x.Epoch == e {
		return
	} else if e != 0 {
		c.log.Warn("this node's epoch ended (it was cut off, paused or forgotten): starting a new one; it holds no key until the others hand them back", "epoch", e)
		c.setEpoch(0)
	}
	res, err := c.propose(ctx, command{Op: opStart, Name: c.cfg.NodeName, ID: c.ID(), MayHaveLost: c.mayHaveLost.Load()})
	if err != nil {
		c.log.Debug("start an epoch", "err", err)
		return
	}
	c.mayHaveLost.Store(false) // later epochs of this process lost nothing
	c.epochAt.Store(res.Version)
	c.setEpoch(res.Epoch)
	c.log.Info("epoch started", "epoch", res.Epoch)
	select {
	case c.renewKick <- struct{}{}:
	default:
	}
}

func (c *Control) setEpoch(e uint64) {
	c.lease.reset(e)
	c.epoch.Store(e)
}

// Leaving reports whether this node has begun to leave (Leave): it decides
// nothing more, and starts no epoch again.
func (c *Control) Leaving() bool { return c.stopping.Load() }

// LeaseValid reports whether this node holds a lease now for its live
// epoch: it may decide the keys the map gives it.
func (c *Control) LeaseValid() bool { return c.LeaseValidFor(c.epoch.Load()) }

// LeaseValidFor reports whether this node holds a lease now for epoch e,
// and e is still its live epoch: a decision admitted under e may be
// acknowledged. A lease of a later epoch does not count: e's keys may
// have gone on elsewhere when it ended.
func (c *Control) LeaseValidFor(e uint64) bool {
	if e == 0 || c.stopping.Load() || c.epoch.Load() != e {
		return false
	}
	if x, ok := c.Map().Member(c.cfg.NodeName); !ok || !x.Live || x.Epoch != e {
		return false
	}
	return c.lease.valid(e)
}

// LeaseRemaining returns how long the lease still runs (0 or less: none).
func (c *Control) LeaseRemaining() time.Duration { return c.lease.remaining(c.epoch.Load()) }

// renewLoop renews this node's lease every L/4. Each renewal runs on its
// own and may take L/2, so that a leader slow to answer one (a loaded
// machine, a slow quorum) does not hold the next back; at most two are in
// flight, but a new epoch's first renewal never waits.
func (c *Control) renewLoop(ctx context.Context) {
	every := c.cfg.Settings.Lease / 4
	t := time.NewTicker(every)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	inflight := make(chan struct{}, 2)
	for {
		kicked := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.renewKick:
			kicked = true
		}
		e := c.epoch.Load()
		if e == 0 || c.stopping.Load() {
			continue
		}
		if !kicked {
			select {
			case inflight <- struct{}{}:
			default:
				continue // two renewals still wait for the leader
			}
		}
		sent := c.clock.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !kicked {
				defer func() { <-inflight }()
			}
			rctx, cancel := context.WithTimeout(ctx, 2*every)
			granted, _, err := c.renew(rctx, e)
			cancel()
			if err == nil && granted {
				c.lease.extend(e, sent)
			}
			c.cfg.Observer.Renewed(err == nil && granted)
		}()
	}
}

// renew asks the leader (this node's own granter when it leads) to renew
// the lease of epoch e.
func (c *Control) renew(ctx context.Context, e uint64) (bool, string, error) {
	if g := c.granter.Load(); g != nil {
		return g.ask(ctx, c.cfg.NodeName, e)
	}
	client, err := c.leaderClient()
	if err != nil {
		return false, "", err
	}
	return client.renew(ctx, c.cfg.NodeName, e)
}

// propose applies cmd through the leader and returns its result.
func (c *Control) propose(ctx context.Context, cmd command) (Result, error) {
	if c.raft.State() == raft.Leader {
		return c.apply(cmd, defaultApplyTimeout)
	}
	client, err := c.leaderClient()
	if err != nil {
		return Result{}, err
	}
	return client.propose(ctx, c.cfg.NodeName, cmd)
}

// apply applies cmd on this node, which must lead.
func (c *Control) apply(cmd command, timeout time.Duration) (Result, error) {
	f := c.raft.Apply(cmd.encode(), timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return Result{}, fmt.Errorf("%w: %v", ErrNoLeader, err)
		}
		return Result{}, fmt.Errorf("control: apply %s: %w", cmd.Op, err)
	}
	res, _ := f.Response().(Result)
	return res, res.err()
}

// ReportSynced records in the map that this node brought every standby
// of its keys up to date at map version v (a Changed value). It is a Raft
// write, made once per change of the map.
func (c *Control) ReportSynced(ctx context.Context, v uint64) error {
	e := c.epoch.Load()
	if e == 0 {
		return fmt.Errorf("control: no epoch")
	}
	_, err := c.propose(ctx, command{Op: opSynced, Name: c.cfg.NodeName, Epoch: e, Version: v})
	return err
}

// SetLeaving moves this node to phase leaving: it owns no key any more,
// and hands its keys over (with one replica, where they have no copy).
func (c *Control) SetLeaving(ctx context.Context) error {
	e := c.epoch.Load()
	if e == 0 {
		return fmt.Errorf("control: no epoch")
	}
	_, err := c.propose(ctx, command{Op: opLeaving, Name: c.cfg.NodeName, Epoch: e})
	return err
}

// Transfer hands partitions this node leads to in-sync replicas: each
// change names a partition, the leader epoch this node leads it at and
// the target (To). It commits whole or not at all. Call it only once
// this node stopped deciding those partitions. An error that is not
// ErrRefused leaves the outcome unknown: the transfer may have committed,
// so this node does not decide those partitions at that leader epoch
// again; it leads them again only by a Reclaim.
func (c *Control) Transfer(ctx context.Context, changes []PartitionChange) error {
	return c.proposeLeader(ctx, opTransfer, changes)
}

// Reclaim moves partitions this node leads to the next leader epoch,
// still led by it: each change names a partition and the leader epoch
// this node leads it at. After a Transfer whose outcome is unknown,
// exactly one of the two commits; a refusal (ErrRefused) means this node
// no longer leads at that epoch.
func (c *Control) Reclaim(ctx context.Context, changes []PartitionChange) error {
	return c.proposeLeader(ctx, opReclaim, changes)
}

// ChangeISR sets the in-sync sets of partitions this node leads: each
// change names a partition, the version and the leader epoch it read and
// the new set (ISR), which keeps this node and admits a member in its
// live epoch only.
func (c *Control) ChangeISR(ctx context.Context, changes []PartitionChange) error {
	return c.proposeLeader(ctx, opISR, changes)
}

// proposeLeader proposes a leader's partition command on this node's own
// behalf, in its live epoch.
func (c *Control) proposeLeader(ctx context.Context, op string, changes []PartitionChange) error {
	e := c.epoch.Load()
	if e == 0 {
		return fmt.Errorf("control: %s: no epoch", op)
	}
	_, err := c.propose(ctx, command{Op: op, Name: c.cfg.NodeName, ID: c.ID(), Epoch: e, Partitions: changes})
	return err
}

// Leave is LeaveWith without targets.
func (c *Control) Leave(ctx context.Context) error { return c.LeaveWith(ctx, nil) }

// LeaveWith stops this node's part: it stops renewing (its lease is void
// from now on), gives up leadership if it leads, and ends its epoch. Each
// partition it led goes to its target in targets (a change's P and To:
// an in-sync replica that has everything this node acknowledged), else
// to the first live in-sync replica, else it waits for this node. Its
// keys go to their standbys if their copies are complete (see the map's
// Releasable), else they wait for this node to come back. It stays in the
// Raft configuration: a rolling restart does not change it.
func (c *Control) LeaveWith(ctx context.Context, targets []PartitionChange) error {
	c.stopping.Store(true)
	e := c.epoch.Load()
	end := command{Op: opEnd, Name: c.cfg.NodeName, Epoch: e, Graceful: true, Partitions: targets}
	if c.raft.State() == raft.Leader {
		// The end first, while this node leads: once it handed leadership
		// over, it learns the new leader only from its heartbeats, which
		// a node whose listeners are closing may never get, and its
		// partitions would wait for its lease to run out instead.
		var err error
		ended := false
		if e != 0 {
			_, err = c.apply(end, defaultApplyTimeout)
			ended = err == nil || errors.Is(err, ErrRefused)
			if err == nil {
				c.log.Info("ended this node's epoch", "epoch", e)
			}
		}
		if terr := c.raft.LeadershipTransfer().Error(); terr != nil {
			c.log.Warn("hand leadership over", "err", terr)
		}
		if ended {
			return err
		}
	}
	if e == 0 {
		return nil
	}
	for {
		_, err := c.propose(ctx, end)
		if err == nil || errors.Is(err, ErrRefused) {
			if err == nil {
				c.log.Info("ended this node's epoch", "epoch", e)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("control: end this node's epoch: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Forget removes the member named name, which gossip must not see alive:
// the leader ends its epoch once its lease is over for sure, then marks it
// left and removes it from Raft. Keys without a complete copy get a
// tombstone (see Tombstone).
func (c *Control) Forget(ctx context.Context, name string) error {
	if g := c.granter.Load(); g != nil {
		return c.forget(ctx, g, name)
	}
	client, err := c.leaderClient()
	if err != nil {
		return err
	}
	// The leader answers once the member's lease is over for sure, L·(1+ρ)
	// after its last grant at most, and it left Raft's configuration.
	client.timeout += 2*time.Duration(float64(c.cfg.Settings.Lease)*(1+c.cfg.ClockDrift)) + 5*time.Second
	_, err = client.propose(ctx, c.cfg.NodeName, command{Op: opForget, Name: name})
	return err
}

// Shutdown stops Raft and the loops; it does not leave (see Leave).
func (c *Control) Shutdown() error {
	c.closeOnce.Do(func() {
		c.stopping.Store(true)
		if c.cancel != nil {
			c.cancel()
		}
		c.wg.Wait()
		c.stream.stopDials() // Raft's Shutdown waits for its calls
		err := c.raft.Shutdown().Error()
		c.trans.Close()
		// Close drops only the listener: the pooled connections to the
		// other nodes stay open (and their handlers with them) unless
		// released.
		c.trans.CloseStreams()
		c.stream.wait()
		c.leader.close()
		c.closeErr = errors.Join(err, c.store.Close())
	})
	return c.closeErr
}

// defaultApplyTimeout bounds the wait to enqueue a command on the leader.
const defaultApplyTimeout = 5 * time.Second
