package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
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

// RouterConfig configures a Router.
type RouterConfig struct {
	// Membership tells who is in the cluster. Nil runs a single node: every
	// key is decided here, without leases.
	Membership *Membership
	// Engine decides the checks this node acts for.
	Engine *actor.Engine
	// Self is this node's name.
	Self string
	// Policy says who decides the keys of an owner that is down. Default
	// PolicyExact: nobody, until it is back (but see Replicas).
	Policy Policy
	// Replicas is how many members keep each key's state: 2 gives every
	// key a standby, which holds a copy of every acknowledged hit and takes
	// the key over when its owner is down (under either policy). 1 keeps
	// the state on the owner only. Default 1; the node's composition sets
	// 2 for a cluster with a data file (see --replicas).
	Replicas int
	// ReplicaTimeout bounds the wait for a standby to confirm a write;
	// past it the decision is refused (UNAVAILABLE), its hits recorded but
	// not acknowledged. Default 500ms.
	ReplicaTimeout time.Duration
	// Lease is how long a lease runs after the renewal a majority granted
	// was sent (L). Above the longest pause a node should ride out without
	// losing its keys, below the failure detection time (about 2.4s), so
	// that a takeover waits on detection rather than on the lease. Renewals
	// go every Lease/3. Default 1s.
	Lease time.Duration
	// ClockDrift (ρ) bounds how much faster one node's monotonic clock may
	// run than another's: a node that fenced a member waits Lease·(1+ρ)
	// before it acts for the member's keys. Default 0.1.
	ClockDrift float64
	// Clock measures leases and waits; nil is the wall clock (its monotonic
	// reading).
	Clock clock.Clock
	// Store keeps the promises made to fence other members across
	// restarts (usually the same store as the membership's). Nil keeps them
	// in memory.
	Store MetaStore
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
	// Renewed is called after each lease renewal: whether a majority
	// granted it.
	Renewed(granted bool)
	// Unserved is called about every Lease/3 with the time since the last
	// call and what this node could not serve during it: without a lease
	// (noLease), or with gained keys waiting for their state (waiting).
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
// PeerService, batched per peer. It keeps this node's lease, grants its
// peers theirs, and moves key state to where it belongs (see
// docs/cluster.md, "Fenced ownership").
type Router struct {
	cfg   RouterConfig
	log   *slog.Logger
	clk   clock.Clock
	lease *lease

	own   atomic.Pointer[ownership]
	ownMu sync.Mutex // serialises updates of own
	seq   uint64     // sequence of the current configuration; under ownMu
	epoch uint64     // epoch of the last view applied; under ownMu
	// seenAlive is, by member, the last incarnation this node saw alive
	// since it started; under ownMu. fenceDown fences no other.
	seenAlive map[string]uint64

	handoffKick chan struct{} // capacity 1: wakes the handoff loop
	imports     sync.RWMutex  // held for reading by each import; see handoffRound
	fenceKick   chan struct{} // capacity 1: wakes the fence loop
	handoffMu   sync.Mutex
	handedTo    map[string]handedTo // last complete sent to each member
	scanned     handoffScan         // the last round that delivered all it collected
	lastRound   *config             // the configuration of that round

	replMu      sync.Mutex
	standbys    map[string]*standbySender // by name
	handoffIdle chan struct{}             // closed when a round left nothing to send

	mu     sync.Mutex
	peers  map[string]*peer      // by name
	admins map[string]*adminConn // by name, for members whose admin service has an address of its own
	closed bool
	wg     sync.WaitGroup
}

// handedTo records a complete sent: to which incarnation, for which
// configuration.
type handedTo struct {
	inc, config, seq uint64
}

// NewRouter returns a router. Run starts its work in a cluster; Close
// releases its connections.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if cfg.MaxForwardBatch <= 0 {
		cfg.MaxForwardBatch = 500
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 4
	}
	if cfg.Lease <= 0 {
		cfg.Lease = time.Second
	}
	if cfg.ClockDrift <= 0 {
		cfg.ClockDrift = 0.1
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.ReplicaTimeout <= 0 {
		cfg.ReplicaTimeout = 500 * time.Millisecond
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
	r := &Router{
		cfg:         cfg,
		log:         cfg.Logger.With("component", "router"),
		clk:         cfg.Clock,
		peers:       make(map[string]*peer),
		admins:      make(map[string]*adminConn),
		handoffKick: make(chan struct{}, 1),
		fenceKick:   make(chan struct{}, 1),
		handedTo:    make(map[string]handedTo),
		standbys:    make(map[string]*standbySender),
		handoffIdle: make(chan struct{}),
	}
	if cfg.Membership != nil {
		l, err := newLease(cfg.Clock, cfg.Lease, cfg.ClockDrift, cfg.Membership.cfg.Expect, cfg.Store)
		if err != nil {
			return nil, err
		}
		r.lease = l
		r.update(cfg.Membership.View(), cfg.Membership.Incarnation())
	}
	return r, nil
}

// Run follows the membership until ctx ends: it keeps the ownership
// current, renews this node's lease, fences members that are down (policy
// available) and hands keys over. It returns when ctx ends. A single node
// has nothing to run.
func (r *Router) Run(ctx context.Context) {
	if r.cfg.Membership == nil {
		return
	}
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){r.follow, r.renewLoop, r.fenceLoop, r.handoffLoop} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(ctx)
		}()
	}
	wg.Wait()
}

// follow rebuilds the ownership on every view.
func (r *Router) follow(ctx context.Context) {
	views, stop := r.cfg.Membership.Subscribe()
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case v, ok := <-views:
			if !ok {
				return
			}
			r.update(v, r.cfg.Membership.Incarnation())
		}
	}
}

// update builds the ownership of view v for incarnation inc. When the
// configuration or the incarnation changed, it fences the engine, so that
// no check routed under the old ownership is decided on a key this node
// no longer may decide, and wakes the handoff and fence loops.
func (r *Router) update(v *View, inc uint64) {
	r.ownMu.Lock()
	defer r.ownMu.Unlock()
	old := r.own.Load()
	if old != nil && v.Epoch < r.epoch {
		return // an older view than one applied already (HandOver, fenced)
	}
	r.epoch = v.Epoch
	if v.Roster == nil {
		v.Roster = &Roster{}
	}
	c := newConfig(r.cfg.Self, r.cfg.Policy, r.cfg.Replicas, v)
	if r.seenAlive == nil {
		r.seenAlive = make(map[string]uint64)
	}
	for name, m := range c.alive {
		r.seenAlive[name] = max(r.seenAlive[name], m.Incarnation)
	}
	var next *ownership
	if old == nil {
		next = (&ownership{}).next(c, inc, r.clk.Now())
	} else {
		next = old.next(c, inc, r.clk.Now())
	}
	moved := old == nil || old.cur.id != c.id || old.inc != inc || c.replicas >= 2 && restarted(old.cur, c)
	if moved {
		r.seq = max(r.seq+1, uint64(time.Now().UnixNano()))
		// What this node holds may belong elsewhere now: the next round
		// collects again (see handoffRound).
		r.handoffMu.Lock()
		r.scanned = handoffScan{}
		r.handoffMu.Unlock()
	}
	r.publish(old, next)
	r.log.Debug("ownership", "epoch", v.Epoch, "config", c.id, "owners", len(c.owners.Members), "alive", len(c.alive), "incarnation", inc, "moved", moved)
	if moved {
		r.cfg.Engine.Fence()
		r.log.Info("ownership changed", "owners", c.owners.Len(), "alive", len(c.alive), "incarnation", inc,
			"settled", next.settled, "waiting_for", next.waitingFor)
	}
	kick(r.handoffKick)
	kick(r.fenceKick)
}

// restarted reports whether a member alive in both configurations took a
// new incarnation (it restarted, or was fenced): as a standby it holds
// nothing this node can count on any more.
func restarted(old, cur *config) bool {
	for name, m := range cur.alive {
		if o, ok := old.alive[name]; ok && o.Incarnation != m.Incarnation {
			return true
		}
	}
	return false
}

// publish stores next and wakes whoever waits on old.
func (r *Router) publish(old, next *ownership) {
	r.own.Store(next)
	if old != nil {
		close(old.changed)
	}
}

// amend applies f to the current ownership (a complete arrived, a fence
// was made, time passed).
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
	if r.cfg.Membership == nil {
		return ""
	}
	if !r.lease.valid() {
		return fmt.Sprintf("no lease from a majority (%d) of the %d expected members", r.lease.quorum, r.cfg.Membership.cfg.Expect)
	}
	if o := r.own.Load(); o.waitingLive {
		return fmt.Sprintf("waiting for the handoffs of %v", o.waitingFor)
	}
	return ""
}

// Check decides checks on the members that act for their keys and writes
// one decision per check into out and the deciding node's name into
// nodes. With allOrNothing, the hits are recorded only if every check, on
// every member, is allowed: each member reserves, and if one check is
// denied the reserved hits are released where they were recorded.
func (r *Router) Check(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, allOrNothing bool) error {
	if r.cfg.Membership == nil {
		for i := range nodes {
			nodes[i] = r.cfg.Self
		}
		return r.cfg.Engine.Do(ctx, checks, out, actor.CallOptions{AllOrNothing: allOrNothing})
	}
	gen := r.cfg.Engine.Generation()
	own := r.own.Load()
	groups, err := r.route(own, checks, nodes)
	if err != nil {
		return err
	}
	if len(groups) == 1 && groups[0].member == r.cfg.Self {
		// Fast path: every key is decided here.
		err = r.decideHere(ctx, own, gen, checks, out, nil, allOrNothing)
		if stale(err) {
			// Nothing was recorded: route once more under the new ownership.
			return r.rerouteNow(ctx, checks, out, nodes, nil, allOrNothing)
		}
		return err
	}
	return r.fanOut(ctx, own, gen, groups, checks, out, nodes, allOrNothing, true)
}

// stale reports an engine refusal that recorded nothing: the ownership
// changed after the call was routed.
func stale(err error) bool {
	return errors.Is(err, actor.ErrStale) && !errors.Is(err, actor.ErrStalePartial)
}

// group is the checks of a call that one member decides.
type group struct {
	member string
	idx    []int // indexes into the call's checks
}

// route splits checks by the member that acts for each key, and writes
// that member's name into nodes. A key nobody may decide now fails the
// call.
func (r *Router) route(own *ownership, checks []actor.Check, nodes []string) ([]group, error) {
	var groups []group
	for i := range checks {
		name, _, err := own.cur.acting(checks[i].Key)
		if err != nil {
			r.cfg.Observer.Refused(reason(err), len(checks))
			return nil, err
		}
		nodes[i] = name
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

// fanOut decides each group on its member, in parallel (the last group on
// this goroutine), and for allOrNothing releases what was reserved if any
// check was denied or any member failed.
//
// A group refused because ownership moved after it was routed is routed
// once more when again is set.
func (r *Router) fanOut(ctx context.Context, own *ownership, gen uint64, groups []group, checks []actor.Check, out []actor.Decision, nodes []string, allOrNothing, again bool) error {
	var marks []int64
	if allOrNothing {
		marks = make([]int64, len(checks))
	}
	// decided[i] reports that check i was decided (and, reserving, recorded
	// where its marks say).
	decided := make([]bool, len(checks))
	errs := make(chan error, len(groups))
	for gi, g := range groups {
		decide := func() {
			sub := make([]actor.Check, len(g.idx))
			for j, i := range g.idx {
				sub[j] = checks[i]
			}
			subOut := make([]actor.Decision, len(g.idx))
			subNodes := make([]string, len(g.idx))
			var subMarks []int64
			if allOrNothing {
				subMarks = make([]int64, len(g.idx))
			}
			err := r.decideOn(ctx, own, gen, g.member, sub, subOut, subNodes, subMarks, allOrNothing, again)
			if err == nil {
				for j, i := range g.idx {
					out[i], nodes[i], decided[i] = subOut[j], subNodes[j], true
					if allOrNothing {
						marks[i] = subMarks[j]
					}
				}
			}
			errs <- err
		}
		if gi == len(groups)-1 {
			decide() // a call whose checks all go to one member starts no goroutine
		} else {
			go decide()
		}
	}
	var first error
	for range groups {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil && slices.Contains(decided, true) {
		// Other groups were decided, and their hits recorded: the call
		// fails after a record (all or nothing, unwind releases them, but a
		// release may not arrive).
		first = maybeRecorded(first)
	}
	if !allOrNothing {
		return first
	}
	return r.unwind(ctx, own, checks, out, marks, decided, first)
}

// decideOn decides one group on member, here or forwarded, and writes the
// deciding node into nodes. Reserving, it records in marks where each hit
// went, for unwind. A group refused because ownership moved is routed once
// more if again is set.
func (r *Router) decideOn(ctx context.Context, own *ownership, gen uint64, member string, checks []actor.Check, out []actor.Decision, nodes []string, marks []int64, reserve, again bool) error {
	for i := range nodes {
		nodes[i] = member
	}
	var err error
	if member == r.cfg.Self {
		err = r.decideHere(ctx, own, gen, checks, out, marks, false)
		if stale(err) && again {
			return r.rerouteNow(ctx, checks, out, nodes, marks, false)
		}
	} else {
		err = r.forward(ctx, own, member, checks, out, marks, reserve)
		if errors.Is(err, errMisrouted) && again {
			return r.reroute(ctx, own, checks, out, nodes, marks)
		}
	}
	if stale(err) || errors.Is(err, errMisrouted) {
		return fmt.Errorf("%w: ownership changed twice during the call; retry", ErrMoving)
	}
	return err
}

// unwind completes an all-or-nothing call from the reservations of its
// groups: if every group was decided and every check allowed, the call
// stands; otherwise every hit that was reserved is released on the member
// that recorded it, and the decisions say denied (or the call fails with
// the first error).
func (r *Router) unwind(ctx context.Context, own *ownership, checks []actor.Check, out []actor.Decision, marks []int64, decided []bool, first error) error {
	denied := first != nil
	for i := range out {
		denied = denied || decided[i] && !out[i].Allowed && !checks[i].Refund
	}
	if !denied {
		return nil
	}
	// What was recorded: decided, allowed, taking hits. Read before Unwind
	// rewrites the decisions.
	var rel []actor.Check
	var relMarks []int64
	var relOn []string
	for i := range checks {
		if decided[i] && out[i].Allowed && !checks[i].Refund && checks[i].Cost > 0 {
			rel, relMarks = append(rel, checks[i]), append(relMarks, marks[i])
			relOn = append(relOn, own.cur.actingName(checks[i].Key))
		}
	}
	if first == nil {
		actor.Unwind(checks, out, marks)
	}
	byMember := make(map[string][]int)
	for i, m := range relOn {
		byMember[m] = append(byMember[m], i)
	}
	rctx := context.WithoutCancel(ctx)
	for m, idx := range byMember {
		cs, ms := make([]actor.Check, len(idx)), make([]int64, len(idx))
		for j, i := range idx {
			cs[j], ms[j] = rel[i], relMarks[i]
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

// reroute waits until this node's ownership changes (bounded by
// misrouteWait) after another member refused checks it does not act for,
// and routes them once more.
func (r *Router) reroute(ctx context.Context, own *ownership, checks []actor.Check, out []actor.Decision, nodes []string, marks []int64) error {
	t := time.NewTimer(misrouteWait)
	defer t.Stop()
	select {
	case <-own.changed:
	case <-t.C:
		return fmt.Errorf("%w: the members disagree on who acts for the key; retry", ErrMoving)
	case <-ctx.Done():
		return ctx.Err()
	}
	return r.rerouteNow(ctx, checks, out, nodes, marks, false)
}

// rerouteNow routes checks once more under the current ownership; nothing
// of them was recorded. Reserving (marks not nil), they must all go to one
// member, which reserves them; otherwise, with allOrNothing, they are one
// all-or-nothing call of their own.
func (r *Router) rerouteNow(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, marks []int64, allOrNothing bool) error {
	gen := r.cfg.Engine.Generation()
	own := r.own.Load()
	groups, err := r.route(own, checks, nodes)
	if err != nil {
		return err
	}
	if marks == nil {
		if len(groups) == 1 && groups[0].member == r.cfg.Self {
			err := r.decideHere(ctx, own, gen, checks, out, nil, allOrNothing)
			if stale(err) {
				return fmt.Errorf("%w: ownership changed twice during the call; retry", ErrMoving)
			}
			return err
		}
		return r.fanOut(ctx, own, gen, groups, checks, out, nodes, allOrNothing, false)
	}
	if len(groups) != 1 {
		return fmt.Errorf("%w: the keys of a reservation moved to several members; retry", ErrMoving)
	}
	return r.decideOn(ctx, own, gen, groups[0].member, checks, out, nodes, marks, true, false)
}

// decideHere decides checks this node acts for under own: only under a
// lease, once their state is here, fenced against a change of ownership,
// and only acknowledged if the lease still runs after the commit. With
// marks, it reserves (see actor.CallOptions).
func (r *Router) decideHere(ctx context.Context, own *ownership, gen uint64, checks []actor.Check, out []actor.Decision, marks []int64, allOrNothing bool) error {
	if err := r.admit(ctx, own, checks); err != nil {
		r.cfg.Observer.Refused(reason(err), len(checks))
		return err
	}
	if err := r.cfg.Engine.Do(ctx, checks, out, actor.CallOptions{Generation: gen, Marks: marks, AllOrNothing: allOrNothing}); err != nil {
		if errors.Is(err, actor.ErrReplication) {
			r.cfg.Observer.Refused("standby", len(checks))
		}
		return err
	}
	if !r.lease.valid() {
		// The lease ran out while the actors decided (a pause, say): some
		// other node may act for these keys by now. The hits stay
		// recorded, unacknowledged: conservative.
		r.cfg.Observer.Refused("no_quorum", len(checks))
		return maybeRecorded(fmt.Errorf("%w: the lease of %s ran out while it decided; its hits are recorded, none acknowledged", ErrNoQuorum, r.cfg.Self))
	}
	return nil
}

// admit waits until this node may decide checks under its lease: every
// key's state is here. It waits for gained keys up to HandoffWait (and
// ctx), and fails at once without a lease.
func (r *Router) admit(ctx context.Context, own *ownership, checks []actor.Check) error {
	if !r.lease.valid() {
		return fmt.Errorf("%w: %s holds no lease from a majority of the %d expected members", ErrNoQuorum, r.cfg.Self, r.cfg.Membership.cfg.Expect)
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
		now := r.clk.Now()
		for i := range checks {
			if err = own.gate(checks[i].Key, now); err != nil {
				break
			}
		}
		if err == nil {
			return nil
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

// Decidable reports whether this node may decide key now as far as
// ownership goes (it acts for the key and holds its state); the lease is
// checked apart. The engine asks it for calls that were routed before
// the ownership changed (actor.Config.Owns).
func (r *Router) Decidable(key string) bool {
	own := r.own.Load()
	if own == nil {
		return true
	}
	if own.cur.actingName(key) != r.cfg.Self {
		return false
	}
	return own.gate(key, r.clk.Now()) == nil
}

// DecideForwarded decides checks another node forwarded here: the checks
// this node does not act for make the call fail with errMisrouted (the
// sender routes them again, never through here); the others are decided as
// decideHere does.
func (r *Router) DecideForwarded(ctx context.Context, checks []actor.Check, out []actor.Decision, marks []int64) error {
	if r.cfg.Membership == nil {
		return r.cfg.Engine.Do(ctx, checks, out, actor.CallOptions{Marks: marks})
	}
	gen := r.cfg.Engine.Generation()
	own := r.own.Load()
	for i := range checks {
		if a, _, _ := own.cur.acting(checks[i].Key); a != r.cfg.Self {
			return fmt.Errorf("%w: %s does not act for key %s in its configuration", errMisrouted, r.cfg.Self, actor.QuoteKey(checks[i].Key))
		}
	}
	err := r.decideHere(ctx, own, gen, checks, out, marks, false)
	if errors.Is(err, actor.ErrStale) && !errors.Is(err, actor.ErrStalePartial) {
		return fmt.Errorf("%w: %v", errMisrouted, err)
	}
	return err
}

// Owner returns the name of the member that decides key now, and whether
// it is another node. When nobody may decide it (its owner is down), it
// names the owner.
func (r *Router) Owner(key string) (string, bool) {
	own := r.own.Load()
	if own == nil {
		return r.cfg.Self, false
	}
	name, _, _ := own.cur.acting(key)
	if name == "" {
		name = own.cur.owner(key)
	}
	return name, name != "" && name != r.cfg.Self
}

// AdminConn returns a connection to the admin service of the live member
// named name, for the admin calls a node fans out (a key's state from its
// owner, listings, overrides): the peer connection when the member serves
// both on one address, one of its own otherwise.
func (r *Router) AdminConn(name string) (*grpc.ClientConn, error) {
	m, ok := r.liveMember(name)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a live member", ErrUnreachable, name)
	}
	addr := cmp.Or(m.AdminAddr, m.GRPCAddr)
	if addr == cmp.Or(m.PeerAddr, m.GRPCAddr) {
		p, err := r.peer(name)
		if err != nil {
			return nil, err
		}
		return p.conn, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("%w: router closed", ErrUnreachable)
	}
	if c := r.admins[name]; c != nil && c.addr == addr {
		return c.conn, nil
	} else if c != nil {
		c.conn.Close()
	}
	conn, err := grpc.NewClient(addr, r.cfg.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s's admin service at %s: %v", ErrUnreachable, name, addr, err)
	}
	r.admins[name] = &adminConn{addr: addr, conn: conn}
	return conn, nil
}

// adminConn is a connection to a member's admin service at addr.
type adminConn struct {
	addr string
	conn *grpc.ClientConn
}

// Close stops the senders and closes the peer connections. Run must have
// returned.
func (r *Router) Close() {
	r.replMu.Lock()
	for _, s := range r.standbys {
		s.close()
	}
	r.replMu.Unlock()
	r.mu.Lock()
	r.closed = true
	for _, p := range r.peers {
		p.close()
	}
	for _, c := range r.admins {
		c.conn.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
