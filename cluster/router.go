package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/cluster/control"
)

// ErrUnreachable means the member that acts for a key could not be asked
// in time. The caller (an edge proxy) decides whether to fail open or
// closed.
var ErrUnreachable = errors.New("cluster: owner unreachable")

// UnreachableError is ErrUnreachable for a named member: it matches
// ErrUnreachable with errors.Is, and Status names the member in the
// status's details (see ReasonOwnerUnreachable), so that a client can say
// which node it could not reach through the node it asked.
type UnreachableError struct {
	Member string // the member that could not be asked
	Reason string // why, for people
}

func (e *UnreachableError) Error() string {
	return ErrUnreachable.Error() + ": " + e.Member + ": " + e.Reason
}

// Unwrap returns ErrUnreachable.
func (e *UnreachableError) Unwrap() error { return ErrUnreachable }

// errMisrouted is a Forward refused by a node that does not act for the
// keys in its configuration (it never forwards them again); the sender
// waits for its own configuration to change and routes them once more.
var errMisrouted = errors.New("cluster: forwarded to a node that does not act for the key")

// misrouteWait bounds how long a sender waits for its configuration to
// change after a misrouted Forward.
const misrouteWait = time.Second

// routeAttempts bounds how many times one call is routed: a first time,
// and again after each change of ownership that sent part of it back.
const routeAttempts = 3

// RouterConfig configures a Router.
type RouterConfig struct {
	// Clustered says the node joins a cluster (Join): until it has, checks
	// are refused (ErrNoQuorum), never decided by the engine alone. False
	// runs a single node: every key is decided here, without leases.
	Clustered bool
	// Engine decides the checks this node acts for. A node whose engine
	// asks the router about ownership and copies (actor.Config.Owner and
	// Replicator) leaves it nil and calls SetEngine once it built the
	// engine, before any other method.
	Engine *actor.Engine
	// Self is this node's name.
	Self string
	// Policy says who decides the keys of a member whose epoch ended
	// without complete copies. Default PolicyExact: nobody, until it is
	// back.
	Policy Policy
	// Replicas is how many members keep each key's state: 2 gives every
	// key a standby, which holds a copy of every acknowledged hit and takes
	// the key over when its owner's epoch ends. Default 1; the node's
	// composition sets 2 for a cluster with a data file (see --replicas).
	Replicas int
	// ReplicaTimeout bounds the wait for a standby to confirm a write;
	// past it the decision is refused (UNAVAILABLE), its hits recorded but
	// not acknowledged. Default 500ms.
	ReplicaTimeout time.Duration
	// ReplicaStreamAge is how long a lane sends its copies on one Replicate
	// stream before it opens another, after the old one's calls are
	// answered; it stays below the listeners' --max-connection-age-grace,
	// so that a connection sent away never cuts a stream. Default 10s.
	ReplicaStreamAge time.Duration
	// Clock measures waits; nil is the wall clock.
	Clock clock.Clock
	// DialOptions are used to reach peers (TLS credentials); default
	// plaintext.
	DialOptions []grpc.DialOption
	// MaxForwardBatch is the most checks one Forward call carries. Default
	// 500.
	MaxForwardBatch int
	// ForwardWait is how long a peer's sender waits for more checks to join
	// a batch before sending it. Default 0: a batch is what queued while
	// the previous call to that peer was in flight.
	ForwardWait time.Duration
	// MaxInFlight is the most Forward calls in flight to one peer. Default 4.
	MaxInFlight int
	// HandoffWait bounds how long a check on a key this node gained waits
	// for the key's state before it is refused (UNAVAILABLE). Default 2s.
	HandoffWait time.Duration
	// HandoffTimeout bounds one handoff call to a peer. Default 10s.
	HandoffTimeout time.Duration
	// Logger receives the router's logs; nil discards them.
	Logger *slog.Logger
	// Observer receives measurements; nil discards them.
	Observer RouterObserver
}

// RouterObserver receives measurements for metrics. Its methods must not
// block.
type RouterObserver interface {
	// Forwarded is called after a Forward call to peer: how many checks it
	// carried, how long it took, and its error.
	Forwarded(peer string, checks int, d time.Duration, err error)
	// HandedOff is called after a handoff call to peer: how many keys it
	// carried, and its error.
	HandedOff(peer string, keys int, err error)
	// Refused is called with checks this node acts for but refused, and
	// why: "no_quorum", "moving", "owner_down", or "standby" (decided and
	// recorded, but the standby did not confirm).
	Refused(reason string, checks int)
	// Renewed is called after each lease renewal: whether it was granted.
	Renewed(granted bool)
	// Unserved is called about every half second with the time since the
	// last call and what this node could not serve during it: without a
	// lease (noLease), or with gained keys waiting for their state
	// (waiting).
	Unserved(d time.Duration, noLease, waiting bool)
	// Served is called with the number of forwarded checks this node
	// decided for another.
	Served(checks int)
	// HandoffReceived is called with the number of keys a peer handed
	// over to this node.
	HandoffReceived(from string, keys int)
	// Replicated is called after each Replicate call to a standby: how
	// many records it carried, and its error.
	Replicated(standby string, records int, err error)
}

type nopRouterObserver struct{}

func (nopRouterObserver) Forwarded(string, int, time.Duration, error) {}
func (nopRouterObserver) HandedOff(string, int, error)                {}
func (nopRouterObserver) Refused(string, int)                         {}
func (nopRouterObserver) Renewed(bool)                                {}
func (nopRouterObserver) Unserved(time.Duration, bool, bool)          {}
func (nopRouterObserver) Served(int)                                  {}
func (nopRouterObserver) HandoffReceived(string, int)                 {}
func (nopRouterObserver) Replicated(string, int, error)               {}

// Router decides checks on the members that act for their keys: the ones
// this node acts for through its engine, the others through their
// PeerService, batched per peer. It follows the cluster map, moves key
// state to where the map says it belongs, and keeps standby copies.
//
// Its parts and their locks, in the order they may be taken (a part never
// takes an earlier one while holding a later one):
//
//  1. resyncs: read-held by each handoff import, write-held by a handoff
//     round while it collects states and queues them for the standbys
//     (see handoffRound), so that no stale state is queued after a newer
//     one. An import waits for it before it takes imports: a round that
//     holds it (and waits for standbys) never holds up a new ownership.
//  2. imports: read-held by each handoff import, write-held while a new
//     ownership is published (see update) and, for a moment, at the start
//     of a handoff round, so that no import straddles a change.
//  3. copies: read-held by each standby write received, write-held while
//     a new ownership is published and before a promotion, so that no
//     write from an epoch that ended is taken in after it.
//  4. ownMu: the ownership (own) and what was applied last (applied);
//     the applied version is also kept in an atomic, which the senders of
//     copies and forwarded checks read without it.
//  5. handoffs.mu: what the handoff rounds delivered (handoff.go).
//  6. repl.mu and each receiving lane's lock (replica.go).
//  7. peers.mu: the peer connections (forward.go).
type Router struct {
	cfg RouterConfig
	log *slog.Logger
	clk clock.Clock
	// ctlp and membership are the control plane (the cluster map this node
	// applied, its epoch and its lease) and gossip (the members and their
	// current addresses), set once by Join; nil for a single node. Join
	// sets them before it publishes the first ownership (own), so that
	// whoever finds own set finds them too (see joined).
	ctlp       atomic.Pointer[control.Control]
	membership atomic.Pointer[Membership]

	own     atomic.Pointer[ownership]
	ownMu   sync.Mutex
	applied struct {
		version uint64 // map version of the last ownership built
		epoch   uint64
		seq     uint64 // sequence of the current configuration
	}
	// version is applied.version, read without ownMu: the senders of
	// copies and forwarded checks read it while update may hold ownMu and
	// wait for a handoff import that waits for them.
	version atomic.Uint64
	// tombstones records when this node first saw each tombstone of the
	// map; under ownMu, read through own.
	tombstones map[control.TombstoneKey]time.Time

	imports sync.RWMutex
	copies  sync.RWMutex
	resyncs sync.RWMutex

	handoffs handoffs
	repl     replication
	peers    peerPool
	parts    partitions

	wg sync.WaitGroup
}

// NewRouter returns a router. A single node's decides at once; in a
// cluster Join attaches the membership and the control plane, then Run
// starts its work. Close releases its connections.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if cfg.MaxForwardBatch <= 0 {
		cfg.MaxForwardBatch = 500
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 4
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.ReplicaTimeout <= 0 {
		cfg.ReplicaTimeout = 500 * time.Millisecond
	}
	if cfg.ReplicaStreamAge <= 0 {
		cfg.ReplicaStreamAge = 10 * time.Second
	}
	if cfg.HandoffWait <= 0 {
		cfg.HandoffWait = 2 * time.Second
	}
	if cfg.HandoffTimeout <= 0 {
		cfg.HandoffTimeout = 10 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.DialOptions == nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = nopRouterObserver{}
	}
	r := &Router{cfg: cfg, log: cfg.Logger.With("component", "router"), clk: cfg.Clock,
		tombstones: make(map[control.TombstoneKey]time.Time)}
	if cfg.Clustered {
		// Every peer call names this node's cluster (see checkClusterID).
		r.cfg.DialOptions = append(slices.Clip(cfg.DialOptions), grpc.WithChainUnaryInterceptor(r.clusterInterceptor),
			grpc.WithChainStreamInterceptor(r.clusterStreamInterceptor))
	}
	r.handoffs.init()
	r.repl.init(r)
	r.peers.init(r)
	r.parts.init()
	return r, nil
}

// SetEngine sets the engine that decides the checks this node acts for,
// when RouterConfig.Engine was nil: the engine and the router need each
// other (see RouterConfig.Engine). Call it once, before any other method.
func (r *Router) SetEngine(e *actor.Engine) { r.cfg.Engine = e }

// Join attaches the cluster to a router built with
// RouterConfig.Clustered: m, the members and their addresses (gossip),
// and c, the control plane (the cluster map this node applied, its epoch
// and its lease). It builds the first ownership, after which the router
// routes checks in the cluster; Run then follows the map. Call it once.
func (r *Router) Join(m *Membership, c *control.Control) error {
	if !r.cfg.Clustered {
		return errors.New("cluster: router: join: the router was built for a single node (RouterConfig.Clustered)")
	}
	if m == nil || c == nil {
		return errors.New("cluster: router: join: a cluster needs both a membership and a control plane")
	}
	if !r.ctlp.CompareAndSwap(nil, c) {
		return errors.New("cluster: router: join: joined already")
	}
	r.membership.Store(m)
	r.update()
	return nil
}

// ctl is the control plane, nil before Join (and for a single node).
func (r *Router) ctl() *control.Control { return r.ctlp.Load() }

// members is gossip's membership, nil before Join (and for a single
// node).
func (r *Router) members() *Membership { return r.membership.Load() }

// joined reports whether the router routes in a cluster: Join built the
// first ownership. Before, ctl and members may be set already, but
// nothing outside Join reads them.
func (r *Router) joined() bool { return r.own.Load() != nil }

// errJoining is the error of checks a clustered node cannot decide before
// it joined.
func (r *Router) errJoining() error {
	return fmt.Errorf("%w: %s is still joining the cluster", ErrNoQuorum, r.cfg.Self)
}

// Joining is the error of a call that a node that joins a cluster cannot
// serve before it joined (checks, the routes, admin calls on a key): nil
// once it has, and for a single node.
func (r *Router) Joining() error {
	if r.cfg.Clustered && !r.joined() {
		return r.errJoining()
	}
	return nil
}

// Joined reports whether this node is a member of a cluster it has
// joined: false for a single node, and before Join.
func (r *Router) Joined() bool { return r.joined() }

// clusterStreamInterceptor and clusterInterceptor name this node's cluster
// on every peer call it makes, once it has one (see checkClusterID).
func (r *Router) clusterStreamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if id := r.clusterID(); id != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, control.ClusterHeader, id)
	}
	return streamer(ctx, desc, cc, method, opts...)
}

func (r *Router) clusterInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if id := r.clusterID(); id != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, control.ClusterHeader, id)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// clusterID is the ID of this node's cluster, "" before it has one.
func (r *Router) clusterID() string {
	if c := r.ctl(); c != nil {
		return c.ClusterID()
	}
	return ""
}

// Run follows the cluster map until ctx ends: it keeps the ownership
// current, hands keys over and reports what this node could not serve. It
// returns when ctx ends. A single node has nothing to run.
func (r *Router) Run(ctx context.Context) {
	if !r.joined() {
		return
	}
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){r.follow, r.handoffLoop, r.unservedLoop, r.partitionLoop} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(ctx)
		}()
	}
	wg.Wait()
}

// follow rebuilds the ownership on every map this node applies, and
// tells gossip where the map's members are.
func (r *Router) follow(ctx context.Context) {
	views, stop := r.members().Subscribe()
	defer stop()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		m, changed := r.ctl().Watch()
		r.update()
		var known []string
		for _, x := range m.Members {
			if x.Phase != control.PhaseLeft && x.Name != r.cfg.Self && x.Addrs.Gossip != "" {
				known = append(known, x.Addrs.Gossip)
			}
		}
		r.members().SetKnown(known)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case _, ok := <-views:
			if !ok {
				return
			}
		case <-t.C: // this node's epoch may have changed without a new map
		}
	}
}

// unservedLoop reports to the observer, every half second, what this node
// could not serve meanwhile.
func (r *Router) unservedLoop(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.cfg.Observer.Unserved(now.Sub(last), !r.ctl().LeaseValid(), !r.own.Load().settled)
			last = now
		}
	}
}

// update builds the ownership of the latest map for this node's epoch.
// When the configuration or the epoch changed, it fences the engine, so
// that no check routed under the old ownership is decided on a key this
// node no longer may decide, and wakes the handoff loop. Handoff imports
// and standby writes finish before the new ownership is published, and
// later ones see it.
func (r *Router) update() {
	m := r.ctl().Map()
	epoch := r.ctl().Epoch()
	// Nothing new: no lock beyond a glance.
	r.ownMu.Lock()
	old := r.own.Load()
	same := old != nil && (m.Version == r.applied.version && epoch == r.applied.epoch || m.Version < r.applied.version)
	r.ownMu.Unlock()
	if same {
		return
	}
	// Handoff imports and standby writes in flight finish first; later
	// ones see the new ownership. These locks come before ownMu (see
	// Router): an import that records a complete takes ownMu.
	r.imports.Lock()
	r.copies.Lock()
	r.ownMu.Lock()
	old = r.own.Load()
	if old != nil && (m.Version == r.applied.version && epoch == r.applied.epoch || m.Version < r.applied.version) {
		r.ownMu.Unlock()
		r.copies.Unlock()
		r.imports.Unlock()
		return
	}
	r.applied.version, r.applied.epoch = m.Version, epoch
	r.version.Store(m.Version)
	now := time.Now()
	for _, t := range m.Tombstones {
		if _, ok := r.tombstones[t.Key()]; !ok {
			r.tombstones[t.Key()] = now
		}
	}
	c := newConfig(r.cfg.Self, r.cfg.Policy, r.cfg.Replicas, m)
	var next *ownership
	if old == nil {
		next = (&ownership{}).next(c, epoch)
	} else {
		next = old.next(c, epoch)
	}
	if c.parts != nil {
		r.parts.size(len(c.parts))
	}
	moved := old == nil || old.cur.id != c.id || old.epoch != epoch
	if moved {
		r.applied.seq = max(r.applied.seq+1, uint64(time.Now().UnixNano()))
		r.handoffs.rescan()
	}
	r.publish(old, next)
	r.ownMu.Unlock()
	r.copies.Unlock()
	r.imports.Unlock()
	r.partsUpdated(next)
	if moved {
		r.cfg.Engine.Fence()
		r.log.Info("ownership changed", "map_version", m.Version, "config", c.id, "epoch", epoch, "owners", len(c.ring),
			"live", len(c.epochs), "settled", next.settled, "waiting_for", next.waitingFor)
	}
	kick(r.handoffs.kick)
}

// publish stores next and wakes whoever waits on old.
func (r *Router) publish(old, next *ownership) {
	r.own.Store(next)
	if old != nil {
		close(old.changed)
	}
}

// amend applies f to the current ownership (a complete arrived, a standby
// was brought up to date).
func (r *Router) amend(f func(*ownership) *ownership) {
	r.ownMu.Lock()
	defer r.ownMu.Unlock()
	old := r.own.Load()
	if old == nil {
		return
	}
	next := f(old)
	if next == old {
		return
	}
	r.publish(old, next)
	if old.settled != next.settled {
		r.log.Info("ownership settled", "settled", next.settled, "waiting_for", next.waitingFor)
	}
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Ready reports whether this node should get traffic: it holds a lease,
// and no key it gained waits for the state a live member is sending. Keys
// that wait for a member that is down do not make it unready: only they
// are refused, and taking the node out would refuse every key. A single
// node is always ready.
func (r *Router) Ready() bool { return r.Status() == "" }

// Status describes why this node is not ready, "" when it is.
func (r *Router) Status() string {
	if !r.joined() {
		return ""
	}
	if err := r.leaseErr(); err != nil {
		return err.Error()
	}
	o := r.own.Load()
	if o.waitingLive {
		return fmt.Sprintf("waiting for the handoffs of %v", o.waitingFor)
	}
	if o.cur.unassigned {
		return "the cluster's partitions are not assigned yet (its first members are still starting)"
	}
	return ""
}

// leaseErr says why this node holds no lease now, nil when it holds one.
func (r *Router) leaseErr() error {
	if r.ctl().LeaseValid() {
		return nil
	}
	switch {
	case r.ctl().ClusterID() == "":
		return fmt.Errorf("%w: %s has not joined a cluster yet (bootstrapping, or waiting for the leader to add it)", ErrNoQuorum, r.cfg.Self)
	case r.ctl().Epoch() == 0:
		return fmt.Errorf("%w: %s has no epoch yet", ErrNoQuorum, r.cfg.Self)
	}
	leader := r.ctl().Leader()
	if leader == "" {
		return fmt.Errorf("%w: %s holds no lease: no Raft leader is known (a quorum of voters is out of reach)", ErrNoQuorum, r.cfg.Self)
	}
	return fmt.Errorf("%w: %s holds no lease from the leader %s", ErrNoQuorum, r.cfg.Self, leader)
}

// Check decides checks on the members that act for their keys and writes
// one decision per check into out and the deciding node's name into
// nodes. With allOrNothing, the hits are recorded only if every check, on
// every member, is allowed: each member reserves, and if one check is
// denied the reserved hits are released where they were recorded.
func (r *Router) Check(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, allOrNothing bool) error {
	if !r.joined() {
		if r.cfg.Clustered {
			return r.errJoining()
		}
		for i := range nodes {
			nodes[i] = r.cfg.Self
		}
		return r.cfg.Engine.Do(ctx, checks, out, actor.CallOptions{AllOrNothing: allOrNothing})
	}
	c := &call{r: r, checks: checks, out: out, nodes: nodes, allOrNothing: allOrNothing, decided: make([]bool, len(checks))}
	return c.run(ctx)
}

// call is one Check being routed: which of its checks were decided, and
// where reserved hits went.
type call struct {
	r            *Router
	checks       []actor.Check
	out          []actor.Decision
	nodes        []string
	allOrNothing bool
	decided      []bool
	marks        []int64 // reserving: where each check's hits went
	reserved     bool    // some group reserved: unwind at the end
	on           []string
}

// group is the checks of a call that one member decides.
type group struct {
	member string
	idx    []int // indexes into the call's checks
}

// run routes the call's undecided checks, decides each group on its
// member, and routes again what came back because ownership moved
// meanwhile (nothing of it was recorded), up to routeAttempts times.
func (c *call) run(ctx context.Context) error {
	r := c.r
	var first error
	for attempt := 0; ; attempt++ {
		own := r.own.Load()
		gen := r.cfg.Engine.Generation()
		groups, err := c.route(own)
		if err != nil {
			first = err
			break
		}
		if len(groups) == 0 {
			break
		}
		if c.allOrNothing && !c.reserved && len(groups) == 1 && groups[0].member == r.cfg.Self && !c.anyDecided() {
			// Every key is decided here: the engine's own all-or-nothing.
			err := r.decideHere(ctx, own, gen, c.checks, c.out, nil, true)
			if stale(err) && attempt+1 < routeAttempts {
				continue
			}
			if stale(err) {
				err = fmt.Errorf("%w: ownership changed during the call, %d times; retry", ErrMoving, routeAttempts)
			}
			if err == nil {
				for i := range c.decided {
					c.decided[i] = true
				}
			}
			return err
		}
		if c.allOrNothing && c.marks == nil {
			c.marks = make([]int64, len(c.checks))
			c.on = make([]string, len(c.checks))
		}
		retry, misrouted, err := c.decideGroups(ctx, own, gen, groups)
		if err != nil {
			first = err
			break
		}
		if !retry {
			break
		}
		if attempt+1 == routeAttempts {
			first = fmt.Errorf("%w: ownership changed during the call, %d times; retry", ErrMoving, routeAttempts)
			break
		}
		if misrouted {
			// Another member refused checks it does not act for in its
			// configuration: wait for this node's to change.
			t := time.NewTimer(misrouteWait)
			select {
			case <-own.changed:
				t.Stop()
			case <-t.C:
				first = fmt.Errorf("%w: the members disagree on who acts for the key; retry", ErrMoving)
			case <-ctx.Done():
				t.Stop()
				first = ctx.Err()
			}
			if first != nil {
				break
			}
		}
	}
	if first != nil && c.anyDecided() {
		// Other groups were decided, and their hits recorded: the call
		// fails after a record (all or nothing, unwind releases them, but
		// a release may not arrive).
		first = maybeRecorded(first)
	}
	if !c.reserved {
		return first
	}
	return c.unwind(ctx, first)
}

func (c *call) anyDecided() bool {
	for _, d := range c.decided {
		if d {
			return true
		}
	}
	return false
}

// route splits the undecided checks by the member that acts for each key,
// and writes that member's name into nodes. A key nobody may decide now
// fails the call.
func (c *call) route(own *ownership) ([]group, error) {
	var groups []group
	for i := range c.checks {
		if c.decided[i] {
			continue
		}
		name, _, err := own.cur.acting(c.checks[i].Key)
		if err != nil && len(own.cur.ring) == 0 {
			// Nobody owns keys yet: if this node holds no lease either,
			// the cluster has not formed, which no retry gets past.
			if lerr := c.r.leaseErr(); lerr != nil {
				err = lerr
			}
		}
		if err != nil {
			c.r.cfg.Observer.Refused(reason(err), len(c.checks))
			return nil, err
		}
		c.nodes[i] = name
		j := 0
		for j < len(groups) && groups[j].member != name {
			j++
		}
		if j == len(groups) {
			groups = append(groups, group{member: name})
		}
		groups[j].idx = append(groups[j].idx, i)
	}
	return groups, nil
}

// decideGroups decides each group on its member, in parallel (the last
// group on this goroutine). retry reports groups sent back because
// ownership moved (nothing of them recorded), misrouted that a member
// refused checks it does not act for.
func (c *call) decideGroups(ctx context.Context, own *ownership, gen uint64, groups []group) (retry, misrouted bool, err error) {
	r := c.r
	reserve := c.allOrNothing
	type result struct {
		g   group
		err error
	}
	results := make(chan result, len(groups))
	for gi, g := range groups {
		decide := func() {
			sub := make([]actor.Check, len(g.idx))
			for j, i := range g.idx {
				sub[j] = c.checks[i]
			}
			subOut := make([]actor.Decision, len(g.idx))
			var subMarks []int64
			if reserve {
				subMarks = make([]int64, len(g.idx))
			}
			var err error
			if g.member == r.cfg.Self {
				err = r.decideHere(ctx, own, gen, sub, subOut, subMarks, false)
			} else {
				err = r.forward(ctx, own, g.member, sub, subOut, subMarks, reserve)
			}
			if err == nil {
				for j, i := range g.idx {
					c.out[i], c.nodes[i], c.decided[i] = subOut[j], g.member, true
					if reserve {
						c.marks[i], c.on[i] = subMarks[j], g.member
					}
				}
			}
			results <- result{g, err}
		}
		if gi == len(groups)-1 {
			decide() // a call whose checks all go to one member starts no goroutine
		} else {
			go decide()
		}
	}
	for range groups {
		res := <-results
		switch {
		case res.err == nil:
			if reserve {
				c.reserved = true
			}
		case stale(res.err):
			retry = true
		case errors.Is(res.err, errMisrouted):
			retry, misrouted = true, true
		case err == nil:
			err = res.err
		}
	}
	return retry, misrouted, err
}

// stale reports an engine refusal that recorded nothing: the ownership
// changed after the call was routed.
func stale(err error) bool {
	return errors.Is(err, actor.ErrStale) && !errors.Is(err, actor.ErrStalePartial)
}

// reason names the kind of a refusal for metrics.
func reason(err error) string {
	switch {
	case errors.Is(err, ErrNoQuorum):
		return "no_quorum"
	case errors.Is(err, ErrOwnerDown):
		return "owner_down"
	}
	return "moving"
}

// unwind completes an all-or-nothing call from the reservations of its
// groups: if every check was decided and allowed, the call stands;
// otherwise every hit that was reserved is released on the member that
// recorded it, and the decisions say denied (or the call fails with
// first).
func (c *call) unwind(ctx context.Context, first error) error {
	r := c.r
	denied := first != nil
	for i := range c.out {
		denied = denied || !c.decided[i] || !c.out[i].Allowed && !c.checks[i].Refund
	}
	if !denied {
		return nil
	}
	// What was recorded: decided, allowed, taking hits. Read before Unwind
	// rewrites the decisions.
	byMember := make(map[string][]int)
	for i := range c.checks {
		if c.decided[i] && c.out[i].Allowed && !c.checks[i].Refund && c.checks[i].Cost > 0 {
			byMember[c.on[i]] = append(byMember[c.on[i]], i)
		}
	}
	if first == nil {
		actor.Unwind(c.checks, c.out, c.marks)
	}
	rctx := context.WithoutCancel(ctx)
	own := r.own.Load()
	for m, idx := range byMember {
		cs, ms := make([]actor.Check, len(idx)), make([]int64, len(idx))
		for j, i := range idx {
			cs[j], ms[j] = c.checks[i], c.marks[i]
		}
		var err error
		if m == r.cfg.Self {
			err = r.cfg.Engine.Release(rctx, cs, ms)
		} else {
			err = r.release(rctx, own, m, cs, ms)
		}
		if err != nil {
			// The hits stay counted until they leave the window:
			// conservative, never a free window.
			r.log.Warn("release reserved hits", "member", m, "checks", len(cs), "err", err)
		}
	}
	return first
}

// decideHere decides checks this node acts for under own: only under a
// lease, once their state is here, fenced against a change of ownership,
// and only acknowledged if the lease still runs after the commit. With
// marks, it reserves (see actor.CallOptions).
func (r *Router) decideHere(ctx context.Context, own *ownership, gen uint64, checks []actor.Check, out []actor.Decision, marks []int64, allOrNothing bool) error {
	if own.cur.parts != nil {
		if err := r.admitLease(own); err != nil {
			r.cfg.Observer.Refused(reason(err), len(checks))
			return err
		}
		done, err := r.admitParts(ctx, own, checks)
		if err != nil {
			if !stale(err) {
				r.cfg.Observer.Refused(reason(err), len(checks))
			}
			return err
		}
		defer done()
	} else if err := r.admit(ctx, own, checks); err != nil {
		r.cfg.Observer.Refused(reason(err), len(checks))
		return err
	}
	if denied := r.penalize(own, checks, out); denied != nil {
		if allOrNothing {
			return r.denyAll(ctx, gen, checks, out, denied)
		}
		rest, restIdx := make([]actor.Check, 0, len(checks)), make([]int, 0, len(checks))
		for i := range checks {
			if !denied[i] {
				rest, restIdx = append(rest, checks[i]), append(restIdx, i)
			}
		}
		if len(rest) == 0 {
			return nil
		}
		restOut := make([]actor.Decision, len(rest))
		var restMarks []int64
		if marks != nil {
			restMarks = make([]int64, len(rest))
		}
		if err := r.decideEngine(ctx, own.epoch, gen, rest, restOut, restMarks, false); err != nil {
			return err
		}
		for j, i := range restIdx {
			out[i] = restOut[j]
			if marks != nil {
				marks[i] = restMarks[j]
			}
		}
		return nil
	}
	return r.decideEngine(ctx, own.epoch, gen, checks, out, marks, allOrNothing)
}

// decideEngine has the engine decide checks admitted under epoch, and
// acknowledges them only if the lease of that epoch still runs after they
// were committed (and copied): a lease of a later epoch of this node does
// not vouch for them, since the keys of the epoch that admitted them may
// have gone on from their copies when it ended.
func (r *Router) decideEngine(ctx context.Context, epoch, gen uint64, checks []actor.Check, out []actor.Decision, marks []int64, allOrNothing bool) error {
	if err := r.cfg.Engine.Do(ctx, checks, out, actor.CallOptions{Generation: gen, Marks: marks, AllOrNothing: allOrNothing}); err != nil {
		if errors.Is(err, actor.ErrReplication) {
			r.cfg.Observer.Refused("standby", len(checks))
		}
		return err
	}
	if !r.ctl().LeaseValidFor(epoch) {
		// The lease ran out while the actors decided (a pause, say), or
		// the epoch that admitted them ended meanwhile: some other node
		// may act for these keys by now. The hits stay recorded,
		// unacknowledged: conservative.
		r.cfg.Observer.Refused("no_quorum", len(checks))
		return maybeRecorded(fmt.Errorf("%w: the lease of %s epoch %d ran out while it decided; its hits are recorded, none acknowledged", ErrNoQuorum, r.cfg.Self, epoch))
	}
	return nil
}

// penalize denies, without recording, the checks whose key a tombstone
// bears on (a forgotten member's keys with no complete copy: one window of
// each key's limit from when this node saw the tombstone; with partitions,
// a partition's, from its time: see partPenaltyEnd). It returns which
// checks it denied, nil for none.
func (r *Router) penalize(own *ownership, checks []actor.Check, out []actor.Decision) []bool {
	// end is when the penalties on a check's key end (zero: none).
	var end func(ck *actor.Check) time.Time
	switch {
	case own.cur.parts != nil:
		if !own.cur.tombstoned {
			return nil
		}
		end = func(ck *actor.Check) time.Time { return own.cur.partPenaltyEnd(ck.Key, ck.Window) }
	case len(own.cur.m.Tombstones) == 0:
		return nil
	default:
		r.ownMu.Lock()
		seen := cloneTombstones(r.tombstones)
		r.ownMu.Unlock()
		end = func(ck *actor.Check) time.Time {
			var until time.Time
			for _, p := range own.cur.penalties(ck.Key, seen) {
				if u := p.from.Add(ck.Window); u.After(until) {
					until = u
				}
			}
			return until
		}
	}
	now := time.Now()
	var denied []bool
	for i := range checks {
		ck := &checks[i]
		if ck.Cost <= 0 || ck.Refund {
			continue
		}
		until := end(ck)
		if !now.Before(until) {
			continue
		}
		if denied == nil {
			denied = make([]bool, len(checks))
		}
		denied[i] = true
		out[i] = actor.Decision{Allowed: false, Limit: ck.Limit, Remaining: 0, RetryAfter: until.Sub(now), ResetAfter: until.Sub(now) + ck.Window}
	}
	return denied
}

// denyAll answers an all-or-nothing call of which some checks a tombstone
// denied: nothing is recorded, every check is denied, and the others'
// remaining come from a peek.
func (r *Router) denyAll(ctx context.Context, gen uint64, checks []actor.Check, out []actor.Decision, denied []bool) error {
	peek := make([]actor.Check, 0, len(checks))
	idx := make([]int, 0, len(checks))
	for i := range checks {
		if !denied[i] {
			c := checks[i]
			c.Cost, c.Refund = 0, false
			peek, idx = append(peek, c), append(idx, i)
		}
	}
	if len(peek) > 0 {
		peekOut := make([]actor.Decision, len(peek))
		if err := r.cfg.Engine.Do(ctx, peek, peekOut, actor.CallOptions{Generation: gen}); err != nil {
			return err
		}
		for j, i := range idx {
			out[i] = peekOut[j]
		}
	}
	for i := range out {
		out[i].Allowed = false
	}
	return nil
}

func cloneTombstones(m map[control.TombstoneKey]time.Time) map[control.TombstoneKey]time.Time {
	out := make(map[control.TombstoneKey]time.Time, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// admit waits until this node may decide checks under its lease: every
// key's state is here. It waits for gained keys up to HandoffWait (and
// ctx), and fails at once without a lease.
func (r *Router) admit(ctx context.Context, own *ownership, checks []actor.Check) error {
	if err := r.admitLease(own); err != nil {
		return err
	}
	if own.settled {
		return nil
	}
	var t clock.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		var err error
		for i := range checks {
			if err = own.gate(checks[i].Key); err != nil {
				break
			}
		}
		if err == nil {
			return nil
		}
		var we *waitError
		if !errors.As(err, &we) || !r.members().Alive(we.member) {
			// Waiting for a member that is down (or for its return) is no
			// use within a call: refuse at once.
			return err
		}
		if t == nil {
			t = r.clk.NewTimer(r.cfg.HandoffWait)
		}
		select {
		case <-own.changed:
			next := r.own.Load()
			for i := range checks {
				if next.cur.actingName(checks[i].Key) != r.cfg.Self {
					return fmt.Errorf("%w: %s no longer acts for the key", actor.ErrStale, r.cfg.Self)
				}
			}
			own = next
		case <-t.C():
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// admitLease refuses a call without a lease, or routed under an ownership
// of an epoch this node left.
func (r *Router) admitLease(own *ownership) error {
	if err := r.leaseErr(); err != nil {
		return err
	}
	if own.epoch != r.ctl().Epoch() {
		return fmt.Errorf("%w: %s moved to a new epoch", actor.ErrStale, r.cfg.Self)
	}
	return nil
}

// Decidable reports whether this node may decide key now as far as
// ownership goes (it acts for the key and holds its state); the lease is
// checked apart. The engine asks it for calls that were routed before
// the ownership changed (actor.Config.Owns).
func (r *Router) Decidable(key string) bool {
	own := r.own.Load()
	if own == nil || !r.joined() {
		return true
	}
	if own.cur.parts != nil {
		return r.partDecidable(own, key)
	}
	if own.cur.actingName(key) != r.cfg.Self {
		return false
	}
	return own.gate(key) == nil
}

// DecideForwarded decides checks another node forwarded here, once this
// node applied at least the map version the sender routed under: the
// checks this node does not act for make the call fail with errMisrouted
// (the sender routes them again, never through here); the others are
// decided as decideHere does.
func (r *Router) DecideForwarded(ctx context.Context, version uint64, checks []actor.Check, out []actor.Decision, marks []int64) error {
	if !r.joined() {
		return r.cfg.Engine.Do(ctx, checks, out, actor.CallOptions{Marks: marks})
	}
	if err := r.catchUp(ctx, version); err != nil {
		return err
	}
	gen := r.cfg.Engine.Generation()
	own := r.own.Load()
	if own.cur.parts != nil && r.ctl().Leaving() {
		// It handed its partitions over (or is about to): the sender's
		// map says where they went, or will in a moment.
		return fmt.Errorf("%w: %s is leaving the cluster", errMisrouted, r.cfg.Self)
	}
	for i := range checks {
		if a, _, _ := own.cur.acting(checks[i].Key); a != r.cfg.Self {
			return fmt.Errorf("%w: %s does not act for key %s in its configuration", errMisrouted, r.cfg.Self, actor.QuoteKey(checks[i].Key))
		}
	}
	err := r.decideHere(ctx, own, gen, checks, out, marks, false)
	if stale(err) {
		return fmt.Errorf("%w: %v", errMisrouted, err)
	}
	return err
}

// catchUpWait bounds how long a receiver waits to apply the map version a
// sender acted under.
const catchUpWait = time.Second

// catchUp waits until this node's ownership is built from at least map
// version v: a message from a node that applied a newer map is looked at
// under that map, never under an older one.
func (r *Router) catchUp(ctx context.Context, v uint64) error {
	if v == 0 {
		return nil
	}
	deadline := time.NewTimer(catchUpWait)
	defer deadline.Stop()
	for {
		have := r.version.Load()
		if have >= v {
			return nil
		}
		m, changed := r.ctl().Watch()
		if m.Version >= v {
			r.update()
			continue
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("%w: %s has applied the cluster map up to version %d, the sender acted under %d", ErrMoving, r.cfg.Self, have, v)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// mapVersion is the version of the map the current ownership was built
// from.
func (r *Router) mapVersion() uint64 { return r.version.Load() }

// Owner returns the name of the member that decides key now, and whether
// it is another node. When nobody may decide it, it names the member the
// key waits for (or its owner).
func (r *Router) Owner(key string) (string, bool) {
	own := r.own.Load()
	if own == nil {
		return r.cfg.Self, false
	}
	name, wait, _ := own.cur.acting(key)
	if name == "" {
		name = cmp.Or(wait, own.cur.owner(key))
	}
	return name, name != "" && name != r.cfg.Self
}

// Shares returns, for each member, the fraction of keys it acts for in
// the current configuration, measured by hashing samples synthetic keys:
// the same configuration always gives the same shares.
func (r *Router) Shares(samples int) map[string]float64 {
	own := r.own.Load()
	if own == nil || !r.joined() {
		return map[string]float64{r.cfg.Self: 1}
	}
	counts := make(map[string]int)
	buf := []byte("sluice-share-probe:")
	n := len(buf)
	for i := range samples {
		buf = strconv.AppendInt(buf[:n], int64(i), 10)
		if a := own.cur.actingName(string(buf)); a != "" {
			counts[a]++
		}
	}
	out := make(map[string]float64, len(counts))
	for name, c := range counts {
		out[name] = float64(c) / float64(samples)
	}
	return out
}

// Leader returns the name of the Raft leader this node knows, "" if none.
func (r *Router) Leader() string {
	if !r.joined() {
		return r.cfg.Self
	}
	return r.ctl().Leader()
}

// Voters returns the Raft configuration: whether each member's ID votes.
func (r *Router) Voters() map[string]bool {
	if !r.joined() {
		return nil
	}
	return r.ctl().Servers()
}

// Forget removes a member that is down for good from the cluster map (see
// control.Control.Forget) and reports whether its keys go on from complete
// copies.
func (r *Router) Forget(ctx context.Context, name string) (bool, error) {
	if !r.joined() {
		return false, fmt.Errorf("%w: not a cluster", control.ErrNoMember)
	}
	if err := r.ctl().Forget(ctx, name); err != nil {
		return false, err
	}
	x, _ := r.ctl().Map().Member(name)
	return x.Releasable, nil
}

// Map returns the cluster map the router follows, nil for a single node.
func (r *Router) Map() *control.Map {
	if !r.joined() {
		return nil
	}
	return r.ctl().Map()
}

// AdminConn returns a connection to the admin service of the live member
// named name, for the admin calls a node fans out (a key's state from its
// owner, listings, overrides): the peer connection when the member serves
// both on one address, one of its own otherwise.
func (r *Router) AdminConn(name string) (*grpc.ClientConn, error) {
	return r.peers.adminConn(name)
}

// Close stops the senders and closes the peer connections. Run must have
// returned.
func (r *Router) Close() {
	r.repl.close()
	r.peers.close()
	r.wg.Wait()
}
