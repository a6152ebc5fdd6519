package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// ErrUnreachable means the owner of a key could not be asked in time. The
// caller (an edge proxy) decides whether to fail open or closed.
var ErrUnreachable = errors.New("cluster: owner unreachable")

// errMisrouted is a Forward refused by a node that does not own the keys in
// its view (it never forwards them again); the sender waits for its own
// view to change and routes them once more.
var errMisrouted = errors.New("cluster: forwarded to a node that does not own the key")

// misrouteWait bounds how long a sender waits for its view to change after
// a misrouted Forward.
const misrouteWait = time.Second

// RouterConfig configures a Router.
type RouterConfig struct {
	// Membership tells who owns which key. Nil runs a single node.
	Membership *Membership
	// Engine decides the checks this node owns.
	Engine *actor.Engine
	// Self is this node's name.
	Self string
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
	// HandoffWait bounds how long decisions on a key this node just gained
	// wait for its previous owner's handoff. Default 2s.
	HandoffWait time.Duration
	// HandoffTimeout bounds one handoff stream. Default 30s.
	HandoffTimeout time.Duration
	// Logger receives the router's logs; nil discards them.
	Logger *slog.Logger
	// Observer receives forwarding measurements; nil discards them.
	Observer RouterObserver
}

// RouterObserver receives measurements for metrics.
type RouterObserver interface {
	// Forwarded is called after a Forward call to peer: how many checks it
	// carried, how long it took, and its error.
	Forwarded(peer string, checks int, d time.Duration, err error)
	// HandedOff is called after a handoff stream to peer.
	HandedOff(peer string, keys int, err error)
	// WithoutHandoff is called with the number of checks decided on gained
	// keys whose previous owner's state had not arrived in time.
	WithoutHandoff(n int)
}

type nopRouterObserver struct{}

func (nopRouterObserver) Forwarded(string, int, time.Duration, error) {}
func (nopRouterObserver) HandedOff(string, int, error)                {}
func (nopRouterObserver) WithoutHandoff(int)                          {}

// Router decides checks on their owners: the ones this node owns through
// its engine, the others through the owners' PeerService, batched per peer.
// A check is forwarded at most once: the receiving node decides it whatever
// its own view says (see docs/cluster.md).
type Router struct {
	cfg RouterConfig
	log *slog.Logger

	mu     sync.Mutex
	peers  map[string]*peer // by name
	closed bool
	wg     sync.WaitGroup

	ovMu   sync.Mutex
	ovFrom *View // the membership view ov was computed from
	ov     *View // its members that own keys

	hmu     sync.Mutex
	barrier *barrier
	heard   map[string]uint64 // ownersHash of each peer's last handoff
}

// NewRouter returns a router. Close releases its connections.
func NewRouter(cfg RouterConfig) *Router {
	if cfg.MaxForwardBatch <= 0 {
		cfg.MaxForwardBatch = 500
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 4
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
	return &Router{cfg: cfg, log: cfg.Logger.With("component", "router"), peers: make(map[string]*peer)}
}

// Check decides checks on their owners and writes one decision per check
// into out and the deciding node's name into nodes. With allOrNothing, the
// hits are recorded only if every check, on every owner, is allowed:
// each owner reserves, and if one check is denied the reserved hits are
// released on their owners.
func (r *Router) Check(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, allOrNothing bool) error {
	view := r.ownersView()
	// Fast path: every key is ours.
	remote := false
	owners := make([]string, len(checks))
	for i := range checks {
		owners[i] = r.cfg.Self
		if view != nil && view.Len() > 0 {
			if m := view.Owner(checks[i].Key); m.Name != "" && m.Name != r.cfg.Self {
				owners[i] = m.Name
				remote = true
			}
		}
	}
	for i := range nodes {
		nodes[i] = owners[i]
	}
	if !remote {
		if n := r.awaitHandoff(ctx, checks); n > 0 {
			r.cfg.Observer.WithoutHandoff(n)
		}
		if allOrNothing {
			return r.cfg.Engine.CheckAll(ctx, checks, out)
		}
		return r.cfg.Engine.Check(ctx, checks, out)
	}

	groups := make(map[string][]int)
	for i, o := range owners {
		groups[o] = append(groups[o], i)
	}
	var marks []int64
	if allOrNothing {
		marks = make([]int64, len(checks))
	}
	errs := make(chan error, len(groups))
	last := len(groups)
	for owner, idx := range groups {
		sub := make([]actor.Check, len(idx))
		for j, i := range idx {
			sub[j] = checks[i]
		}
		decide := func() {
			subOut := make([]actor.Decision, len(idx))
			var subMarks []int64
			if allOrNothing {
				subMarks = make([]int64, len(idx))
			}
			var err error
			if owner == r.cfg.Self {
				if n := r.awaitHandoff(ctx, sub); n > 0 {
					r.cfg.Observer.WithoutHandoff(n)
				}
				if allOrNothing {
					err = r.cfg.Engine.CheckMarked(ctx, sub, subOut, subMarks)
				} else {
					err = r.cfg.Engine.Check(ctx, sub, subOut)
				}
			} else {
				err = r.forward(ctx, view, owner, sub, subOut, subMarks, allOrNothing)
				if errors.Is(err, errMisrouted) && !allOrNothing {
					err = r.reroute(ctx, view, sub, subOut)
				}
			}
			if err == nil {
				for j, i := range idx {
					out[i] = subOut[j]
					if allOrNothing {
						marks[i] = subMarks[j]
					}
				}
			}
			errs <- err
		}
		// The last owner is asked on this goroutine: a call whose checks
		// all belong to one owner (one check per call, say) starts none.
		if last--; last == 0 {
			decide()
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
	if !allOrNothing {
		return first
	}
	denied := first != nil
	for i := range out {
		denied = denied || !out[i].Allowed
	}
	if !denied {
		return nil
	}
	// Unwind: release what was reserved on each owner.
	rel, relMarks := actor.Unwind(checks, out, marks)
	if first != nil {
		// Some owners failed: their decisions are unknown, so release what
		// the others reserved and report the failure.
		rel, relMarks = nil, nil
		for i := range checks {
			if out[i].Allowed && !checks[i].Refund && checks[i].Cost > 0 {
				rel, relMarks = append(rel, checks[i]), append(relMarks, marks[i])
			}
		}
	}
	byOwner := make(map[string][]int)
	for i := range rel {
		o := r.cfg.Self
		if view != nil {
			if m := view.Owner(rel[i].Key); m.Name != "" {
				o = m.Name
			}
		}
		byOwner[o] = append(byOwner[o], i)
	}
	rctx := context.WithoutCancel(ctx)
	for o, idx := range byOwner {
		cs, ms := make([]actor.Check, len(idx)), make([]int64, len(idx))
		for j, i := range idx {
			cs[j], ms[j] = rel[i], relMarks[i]
		}
		var err error
		if o == r.cfg.Self {
			err = r.cfg.Engine.Release(rctx, cs, ms)
		} else {
			err = r.release(rctx, view, o, cs, ms)
		}
		if err != nil {
			r.log.Warn("release reserved hits", "owner", o, "err", err)
		}
	}
	return first
}

// ownersView returns the members that own keys: the live members except
// those leaving, which are handing their keys over (all live members if
// every one is leaving). Nil for a single node.
func (r *Router) ownersView() *View {
	if r.cfg.Membership == nil {
		return nil
	}
	v := r.cfg.Membership.View()
	r.ovMu.Lock()
	defer r.ovMu.Unlock()
	if r.ovFrom != v {
		r.ovFrom, r.ov = v, Owners(v)
	}
	return r.ov
}

// Owners returns the view of the members of v that own keys: the alive
// ones, or all of v if none is alive.
func Owners(v *View) *View {
	alive := make([]Member, 0, len(v.Members))
	for _, m := range v.Members {
		if m.State == StateAlive {
			alive = append(alive, m)
		}
	}
	if len(alive) == len(v.Members) || len(alive) == 0 {
		return v
	}
	return NewView(v.Epoch, alive)
}

// Owns reports whether this node owns key in its current view.
func (r *Router) Owns(key string) bool {
	v := r.ownersView()
	if v == nil || v.Len() == 0 {
		return true
	}
	o := v.Owner(key).Name
	return o == "" || o == r.cfg.Self
}

// forward sends checks to owner and fills out (and marks when reserving).
func (r *Router) forward(ctx context.Context, view *View, owner string, checks []actor.Check, out []actor.Decision, marks []int64, reserve bool) error {
	p, err := r.peer(view, owner)
	if err != nil {
		return err
	}
	if reserve {
		// Reservations are rare: they go on their own, unbatched.
		return p.call(ctx, checks, out, marks, true)
	}
	f := &pending{ctx: ctx, checks: checks, out: out, done: make(chan error, 1)}
	select {
	case p.queue <- f:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-f.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// reroute waits until this node's view differs from view (bounded by
// misrouteWait) and decides checks again on their owners in the new view,
// once.
func (r *Router) reroute(ctx context.Context, view *View, checks []actor.Check, out []actor.Decision) error {
	deadline := time.Now().Add(misrouteWait)
	for r.ownersView() == view {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w: ownership is moving; retry", ErrUnreachable)
		}
		time.Sleep(5 * time.Millisecond)
	}
	nodes := make([]string, len(checks))
	return r.Check(ctx, checks, out, nodes, false)
}

func (r *Router) release(ctx context.Context, view *View, owner string, checks []actor.Check, marks []int64) error {
	p, err := r.peer(view, owner)
	if err != nil {
		return err
	}
	req := &sluicepb.ReleaseRequest{Checks: make([]*sluicepb.Check, len(checks)), Marks: marks}
	for i := range checks {
		req.Checks[i] = ToProtoCheck(&checks[i])
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = p.client.Release(ctx, req)
	return err
}

// peer returns the sender for the member named name, dialling it if needed.
func (r *Router) peer(view *View, name string) (*peer, error) {
	var addr string
	if view != nil {
		for _, m := range view.Members {
			if m.Name == name {
				addr = m.GRPCAddr
			}
		}
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: %s has no gRPC address", ErrUnreachable, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("%w: router closed", ErrUnreachable)
	}
	if p := r.peers[name]; p != nil && p.addr == addr {
		return p, nil
	} else if p != nil {
		p.close()
	}
	conn, err := grpc.NewClient(addr, r.cfg.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s at %s: %v", ErrUnreachable, name, addr, err)
	}
	p := &peer{
		r: r, name: name, addr: addr, conn: conn,
		client: sluicepb.NewPeerServiceClient(conn),
		queue:  make(chan *pending, 4096),
		quit:   make(chan struct{}),
	}
	r.peers[name] = p
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		p.run()
	}()
	return p, nil
}

// Close stops the senders and closes the peer connections.
func (r *Router) Close() {
	r.mu.Lock()
	r.closed = true
	for _, p := range r.peers {
		p.close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// pending is a share of a caller's checks waiting to be forwarded.
type pending struct {
	ctx    context.Context
	checks []actor.Check
	out    []actor.Decision
	done   chan error
}

// peer batches the checks forwarded to one member.
type peer struct {
	r      *Router
	name   string
	addr   string
	conn   *grpc.ClientConn
	client sluicepb.PeerServiceClient
	queue  chan *pending
	quit   chan struct{}
	once   sync.Once
}

func (p *peer) close() {
	p.once.Do(func() {
		close(p.quit)
		p.conn.Close()
	})
}

// run starts MaxInFlight senders and waits for them. Each takes what is
// queued (up to MaxForwardBatch checks) and sends it as one Forward call:
// while they are all busy, checks queue up and share the next call. A
// caller's checks go straight to a waiting sender, with no goroutine in
// between.
func (p *peer) run() {
	var senders sync.WaitGroup
	for range p.r.cfg.MaxInFlight {
		senders.Go(p.sender)
	}
	senders.Wait()
}

func (p *peer) sender() {
	for {
		var first *pending
		select {
		case first = <-p.queue:
		case <-p.quit:
			p.failQueued()
			return
		}
		if w := p.r.cfg.ForwardWait; w > 0 {
			time.Sleep(w)
		}
		batch := []*pending{first}
		n := len(first.checks)
	drain:
		for n < p.r.cfg.MaxForwardBatch {
			select {
			case f := <-p.queue:
				batch = append(batch, f)
				n += len(f.checks)
			default:
				break drain
			}
		}
		p.send(batch, n)
	}
}

func (p *peer) failQueued() {
	for {
		select {
		case f := <-p.queue:
			f.done <- fmt.Errorf("%w: %s: router closed", ErrUnreachable, p.name)
		default:
			return
		}
	}
}

// send forwards a batch under the earliest deadline of its callers.
func (p *peer) send(batch []*pending, n int) {
	checks := make([]actor.Check, 0, n)
	var deadline time.Time
	for _, f := range batch {
		checks = append(checks, f.checks...)
		if d, ok := f.ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
			deadline = d
		}
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(5 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	out := make([]actor.Decision, len(checks))
	err := p.call(ctx, checks, out, nil, false)
	off := 0
	for _, f := range batch {
		if err == nil {
			copy(f.out, out[off:off+len(f.checks)])
		}
		off += len(f.checks)
		f.done <- err
	}
}

// call makes one Forward call.
func (p *peer) call(ctx context.Context, checks []actor.Check, out []actor.Decision, marks []int64, reserve bool) error {
	req := &sluicepb.ForwardRequest{Checks: make([]*sluicepb.Check, len(checks)), Reserve: reserve, FromNode: p.r.cfg.Self}
	for i := range checks {
		req.Checks[i] = ToProtoCheck(&checks[i])
	}
	start := time.Now()
	resp, err := p.client.Forward(ctx, req)
	p.r.cfg.Observer.Forwarded(p.name, len(checks), time.Since(start), err)
	if err != nil {
		if st, ok := status.FromError(err); ok {
			switch st.Code() {
			case codes.InvalidArgument, codes.ResourceExhausted:
				return err
			case codes.Aborted:
				return fmt.Errorf("%w: %s", errMisrouted, st.Message())
			}
		}
		return fmt.Errorf("%w: %s: %v", ErrUnreachable, p.name, err)
	}
	if len(resp.Decisions) != len(checks) || reserve && len(resp.Marks) != len(checks) {
		return fmt.Errorf("%w: %s answered %d decisions for %d checks", ErrUnreachable, p.name, len(resp.Decisions), len(checks))
	}
	for i, d := range resp.Decisions {
		out[i] = actor.Decision{
			Allowed:    d.Allowed,
			Limit:      d.Limit,
			Remaining:  d.Remaining,
			RetryAfter: d.RetryAfter.AsDuration(),
			ResetAfter: d.ResetAfter.AsDuration(),
		}
	}
	copy(marks, resp.Marks)
	return nil
}

// ToProtoCheck encodes a resolved engine check for the wire.
func ToProtoCheck(c *actor.Check) *sluicepb.Check {
	cost := c.Cost
	return &sluicepb.Check{
		Key:       []byte(c.Key),
		Limit:     c.Limit,
		Window:    durationpb.New(c.Window),
		Algorithm: sluicepb.Algorithm(c.Algorithm + 1),
		Cost:      &cost,
		Refund:    c.Refund,
		Penalty:   c.Penalty,
	}
}

// Conn returns the connection to the live member named name, for calls
// other than forwarding (admin calls answered by a key's owner).
func (r *Router) Conn(name string) (*grpc.ClientConn, error) {
	var view *View
	if r.cfg.Membership != nil {
		view = r.cfg.Membership.View()
	}
	p, err := r.peer(view, name)
	if err != nil {
		return nil, err
	}
	return p.conn, nil
}

// Owner returns the name of the member that owns key, and whether it is
// another node.
func (r *Router) Owner(key string) (string, bool) {
	v := r.ownersView()
	if v == nil || v.Len() == 0 {
		return r.cfg.Self, false
	}
	o := v.Owner(key).Name
	return o, o != "" && o != r.cfg.Self
}
