package cluster

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster/control"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// maxBatchWait bounds a forwarded batch whose callers set no deadline.
const maxBatchWait = 5 * time.Second

// forward sends checks to member and fills out (and marks when
// reserving). Checks that are not reservations share batches with other
// callers' checks to the same member.
func (r *Router) forward(ctx context.Context, own *ownership, member string, checks []actor.Check, out []actor.Decision, marks []int64, reserve bool) error {
	p, err := r.peers.get(member)
	if err != nil {
		return err
	}
	if reserve {
		// Reservations are rare: they go on their own, unbatched.
		return p.call(ctx, checks, out, marks, true)
	}
	closed := &UnreachableError{Member: member, Reason: "connection closed"}
	f := &pending{ctx: ctx, checks: checks, out: out, done: make(chan error, 1)}
	select {
	case <-p.quit:
		return closed
	default:
	}
	select {
	case p.queue <- f:
	case <-p.quit:
		return closed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-f.done:
		return err
	case <-p.quit:
		// The senders are gone, or going: f may never be sent.
		select {
		case err := <-f.done:
			return err
		default:
			return closed
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release takes back reserved hits on member.
func (r *Router) release(ctx context.Context, own *ownership, member string, checks []actor.Check, marks []int64) error {
	p, err := r.peers.get(member)
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

// peerPool holds a connection and senders per peer, and connections to
// the admin services that have a listener of their own. Its lock is the
// last of the router's (see Router).
type peerPool struct {
	r      *Router
	mu     sync.Mutex
	peers  map[string]*peer      // by name
	admins map[string]*adminConn // by name
	closed bool
}

// adminConn is a connection to a member's admin service at addr.
type adminConn struct {
	addr string
	conn *grpc.ClientConn
}

func (pp *peerPool) init(r *Router) {
	pp.r = r
	pp.peers = make(map[string]*peer)
	pp.admins = make(map[string]*adminConn)
}

// addrs returns where the member named name serves, as gossip sees it now
// (a pod that came back with a new IP), else as the cluster map recorded.
func (pp *peerPool) addrs(name string) (control.Addrs, bool) {
	r := pp.r
	if m := r.members(); m != nil {
		if m, ok := m.View().Member(name); ok && m.State == StateAlive {
			return control.Addrs{Gossip: m.GossipAddr, GRPC: m.GRPCAddr, Peer: cmp.Or(m.PeerAddr, m.GRPCAddr), Admin: cmp.Or(m.AdminAddr, m.GRPCAddr)}, true
		}
	}
	if own := r.own.Load(); own != nil {
		if x, ok := own.cur.members[name]; ok && x.Phase != control.PhaseLeft && x.Addrs.Peer != "" {
			a := x.Addrs
			a.Peer, a.Admin = cmp.Or(a.Peer, a.GRPC), cmp.Or(a.Admin, a.GRPC)
			return a, true
		}
	}
	return control.Addrs{}, false
}

// get returns the sender for the member named name, dialling it if needed
// (again, if its address changed).
func (pp *peerPool) get(name string) (*peer, error) {
	a, ok := pp.addrs(name)
	if !ok {
		return nil, &UnreachableError{Member: name, Reason: "no address known"}
	}
	addr := a.Peer
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.closed {
		return nil, fmt.Errorf("%w: router closed", ErrUnreachable)
	}
	if p := pp.peers[name]; p != nil && p.addr == addr {
		return p, nil
	} else if p != nil {
		p.close()
	}
	conn, err := grpc.NewClient(addr, pp.r.cfg.DialOptions...)
	if err != nil {
		return nil, &UnreachableError{Member: name, Reason: fmt.Sprintf("dial %s: %v", addr, err)}
	}
	p := &peer{
		r: pp.r, name: name, addr: addr, conn: conn,
		client: sluicepb.NewPeerServiceClient(conn),
		queue:  make(chan *pending, 4096),
		quit:   make(chan struct{}),
	}
	pp.peers[name] = p
	pp.r.wg.Add(1)
	go func() {
		defer pp.r.wg.Done()
		p.run()
	}()
	return p, nil
}

// adminConn returns a connection to the admin service of the member named
// name: the peer connection when the member serves both on one address.
func (pp *peerPool) adminConn(name string) (*grpc.ClientConn, error) {
	a, ok := pp.addrs(name)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a known member", ErrUnreachable, name)
	}
	if a.Admin == a.Peer {
		p, err := pp.get(name)
		if err != nil {
			return nil, err
		}
		return p.conn, nil
	}
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.closed {
		return nil, fmt.Errorf("%w: router closed", ErrUnreachable)
	}
	if c := pp.admins[name]; c != nil && c.addr == a.Admin {
		return c.conn, nil
	} else if c != nil {
		c.conn.Close()
	}
	conn, err := grpc.NewClient(a.Admin, pp.r.cfg.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s's admin service at %s: %v", ErrUnreachable, name, a.Admin, err)
	}
	pp.admins[name] = &adminConn{addr: a.Admin, conn: conn}
	return conn, nil
}

func (pp *peerPool) close() {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.closed = true
	for _, p := range pp.peers {
		p.close()
	}
	for _, c := range pp.admins {
		c.conn.Close()
	}
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
	p.failQueued()
}

func (p *peer) sender() {
	for {
		var first *pending
		select {
		case first = <-p.queue:
		case <-p.quit:
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

// failQueued fails what is still queued once every sender stopped.
func (p *peer) failQueued() {
	for {
		select {
		case f := <-p.queue:
			f.done <- &UnreachableError{Member: p.name, Reason: "connection closed"}
		default:
			return
		}
	}
}

// send forwards a batch. The call runs until the latest deadline of the
// callers still waiting (at most maxBatchWait without one), so that an
// impatient caller does not fail the others' checks; each caller stops
// waiting at its own deadline. Callers already gone are left out.
func (p *peer) send(batch []*pending, n int) {
	live := batch[:0]
	for _, f := range batch {
		if err := f.ctx.Err(); err != nil {
			f.done <- err
			continue
		}
		live = append(live, f)
	}
	if len(live) == 0 {
		return
	}
	checks := make([]actor.Check, 0, n)
	var deadline time.Time
	for _, f := range live {
		checks = append(checks, f.checks...)
		d, ok := f.ctx.Deadline()
		if !ok {
			d = time.Now().Add(maxBatchWait)
		}
		if d.After(deadline) {
			deadline = d
		}
	}
	// The batch's call carries the first caller's trace context: its
	// trace shows the forward (the others' do not).
	ctx, cancel := context.WithDeadline(trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(live[0].ctx)), deadline)
	defer cancel()
	go func() {
		// Give up the call once every caller is gone.
		for _, f := range live {
			select {
			case <-f.ctx.Done():
			case <-ctx.Done():
				return
			}
		}
		cancel()
	}()
	out := make([]actor.Decision, len(checks))
	err := p.call(ctx, checks, out, nil, false)
	off := 0
	for _, f := range live {
		if err == nil {
			copy(f.out, out[off:off+len(f.checks)])
		}
		off += len(f.checks)
		f.done <- err
	}
}

// call makes one Forward call and maps the receiver's status (see the
// PeerService comment in proto/sluice/v1/sluice.proto).
func (p *peer) call(ctx context.Context, checks []actor.Check, out []actor.Decision, marks []int64, reserve bool) error {
	req := &sluicepb.ForwardRequest{Checks: make([]*sluicepb.Check, len(checks)), Reserve: reserve, FromNode: p.r.cfg.Self, MapVersion: p.r.mapVersion()}
	for i := range checks {
		req.Checks[i] = ToProtoCheck(&checks[i])
	}
	start := time.Now()
	resp, err := p.client.Forward(ctx, req)
	p.r.cfg.Observer.Forwarded(p.name, len(checks), time.Since(start), err)
	if err != nil {
		return fromPeerStatus(p.name, err)
	}
	if len(resp.Decisions) != len(checks) || reserve && len(resp.Marks) != len(checks) {
		return &UnreachableError{Member: p.name, Reason: fmt.Sprintf("answered %d decisions for %d checks", len(resp.Decisions), len(checks))}
	}
	for i, d := range resp.Decisions {
		out[i] = actor.Decision{
			Allowed:    d.Allowed,
			Limit:      d.Limit,
			Remaining:  d.Remaining,
			Granted:    d.Granted,
			Share:      d.Share,
			RetryAfter: d.RetryAfter.AsDuration(),
			ResetAfter: d.ResetAfter.AsDuration(),
		}
		if d.ErrorCode != 0 {
			// Not decided (a damaged record on the owner): the status the
			// owner gave it, passed on as it is.
			out[i] = actor.Decision{Err: status.Error(codes.Code(d.ErrorCode), d.ErrorMessage)}
		}
	}
	copy(marks, resp.Marks)
	return nil
}

// fromPeerStatus turns a peer's answer into this package's errors.
func fromPeerStatus(peer string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return &UnreachableError{Member: peer, Reason: err.Error()}
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.ResourceExhausted:
		return err
	case codes.Aborted:
		return fmt.Errorf("%w: %s", errMisrouted, st.Message())
	case codes.Unavailable:
		for _, kind := range []error{ErrNoQuorum, ErrMoving, ErrOwnerDown} {
			if strings.HasPrefix(st.Message(), kind.Error()) {
				var err error = &peerError{kind: kind, msg: st.Message()}
				if peerRecorded(st) != RecordedNo {
					err = maybeRecorded(err)
				}
				return err
			}
		}
	case codes.DeadlineExceeded, codes.Canceled:
		return &UnreachableError{Member: peer, Reason: "did not answer in time: " + st.Message()}
	}
	return &UnreachableError{Member: peer, Reason: err.Error()}
}

// peerRecorded is the MetaRecorded value of a peer's status: "" from a
// peer that does not say (a release before it), which counts as maybe.
func peerRecorded(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetMetadata()[MetaRecorded]
		}
	}
	return ""
}

// peerError is a refusal a peer explained: it matches its kind with
// errors.Is and reads as the peer's message.
type peerError struct {
	kind error
	msg  string
}

func (e *peerError) Error() string { return e.msg }
func (e *peerError) Unwrap() error { return e.kind }

// ToProtoCheck encodes a resolved engine check for the wire.
func ToProtoCheck(c *actor.Check) *sluicepb.Check {
	cost := c.Cost
	pc := &sluicepb.Check{
		Key:       []byte(c.Key),
		Limit:     c.Limit,
		Window:    durationpb.New(c.Window),
		Algorithm: AlgorithmToProto(c.Algorithm),
		Cost:      &cost,
		Refund:    c.Refund,
		Penalty:   c.Penalty,
		Usage:     c.Usage,
	}
	if r := c.Reservation; r != nil {
		pc.ReservationId, pc.Settle, pc.Lease, pc.Holder, pc.Demand = r.ID[:], r.Settle, r.Lease, r.Holder, r.Demand
		if !r.Settle {
			pc.ReserveFor = durationpb.New(r.TTL)
		}
	}
	return pc
}
