package api

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// nativeService serves sluice.v1.RateLimitService.
type nativeService struct {
	sluicepb.UnimplementedRateLimitServiceServer
	s *Server
}

// Check decides a batch of checks.
func (n *nativeService) Check(ctx context.Context, req *sluicepb.CheckRequest) (*sluicepb.CheckResponse, error) {
	s := n.s
	start := time.Now()
	var t trafficCall
	resp, err := n.check(ctx, req, &t)
	s.metrics.native.latency.Observe(time.Since(start).Seconds())
	s.record(ctx, &t, start, len(req.GetChecks()), err)
	if err != nil {
		s.metrics.native.failed(ctx, err, len(req.GetChecks()))
		return nil, toStatus(err)
	}
	return resp, nil
}

func (n *nativeService) check(ctx context.Context, req *sluicepb.CheckRequest, t *trafficCall) (*sluicepb.CheckResponse, error) {
	s := n.s
	if len(req.Checks) == 0 {
		return nil, badInput("no checks: send at least one check")
	}
	if max := s.maxBatch(); len(req.Checks) > max {
		return nil, badInput("%d checks in one call; the maximum is %d: split the batch", len(req.Checks), max)
	}
	now := s.clock.Now()
	t.now = now
	checks := make([]actor.Check, len(req.Checks))
	refunds, leases := false, false
	for i, pc := range req.Checks {
		if err := s.nativeCheck(i, pc, now, &checks[i]); err != nil {
			return nil, err
		}
		refunds = refunds || checks[i].Refund && checks[i].Cost > 0
		leases = leases || pc.Lease
		if req.AllOrNothing && checks[i].Usage && checks[i].Cost > 0 {
			return nil, badFields([]string{"checks[" + strconv.Itoa(i) + "].usage"}, "check %d: a usage report is recorded whatever the other checks say, so it cannot be part of an all_or_nothing batch; send it in a call of its own", i)
		}
	}
	if refunds {
		if err := s.mayRefund(ctx); err != nil {
			return nil, err
		}
	}
	if leases {
		if err := s.mayLease(ctx, "lease"); err != nil {
			return nil, err
		}
	}
	out := make([]actor.Decision, len(checks))
	nodes := make([]string, len(checks))
	if err := s.decide(ctx, checks, out, nodes, req.AllOrNothing); err != nil {
		return nil, err
	}
	resp := &sluicepb.CheckResponse{Decisions: make([]*sluicepb.Decision, len(out))}
	resp.RoutesVersion = s.cluster.RoutesVersion()
	// The messages of the decisions, allocated together.
	decs := make([]sluicepb.Decision, len(out))
	durs := make([]durationpb.Duration, 2*len(out))
	allowed := 0
	usage := false
	for i := range out {
		d := &out[i]
		if d.Allowed {
			allowed++
		}
		pd := &decs[i]
		pd.Allowed, pd.Limit, pd.Remaining, pd.Node = d.Allowed, d.Limit, d.Remaining, nodes[i]
		pd.Forwarded = nodes[i] != s.cfg.NodeName
		pd.RetryAfter = setDuration(&durs[2*i], d.RetryAfter)
		pd.ResetAfter = setDuration(&durs[2*i+1], d.ResetAfter)
		if checks[i].Reservation != nil && d.Allowed {
			hc := &checks[i]
			if d.Granted > 0 && d.Granted != hc.Cost {
				// Part of a lease: the handle's estimate is what it holds.
				g := *hc
				g.Cost, hc = d.Granted, &g
			}
			pd.Reservation = appendHandle(nil, hc)
			pd.Granted, pd.Share = d.Granted, d.Share
		}
		if d.Err != nil {
			pd.ErrorCode, pd.ErrorMessage = checkStatus(d.Err)
		}
		resp.Decisions[i] = pd
		usage = usage || checks[i].Usage || checks[i].Reservation != nil
	}
	if usage {
		s.countUsage(checks, out)
	}
	s.metrics.native.allowed.Add(float64(allowed))
	s.metrics.native.denied.Add(float64(len(out) - allowed))
	t.checks, t.out = checks, out
	return resp, nil
}

// Routes lists the members a client hashes keys over, with their
// addresses, so that it can send each check to the node that decides it.
func (n *nativeService) Routes(ctx context.Context, _ *sluicepb.RoutesRequest) (*sluicepb.RoutesResponse, error) {
	s := n.s
	if err := s.joining(); err != nil {
		return nil, toStatus(err)
	}
	version, routes := s.cluster.Routes()
	resp := &sluicepb.RoutesResponse{Version: version, Node: s.cfg.NodeName, Members: make([]*sluicepb.RouteMember, len(routes))}
	if m := s.cluster.Map(); m != nil {
		resp.ClusterId = m.ClusterID
	}
	for i, x := range routes {
		// A single node lists itself, at the address it is bound to.
		if x.Name == s.cfg.NodeName && x.Addr == "" {
			x.Addr = s.grpcAddr()
		}
		resp.Members[i] = &sluicepb.RouteMember{Name: x.Name, Addr: x.Addr, Up: x.Up}
	}
	return resp, nil
}

// nativeCheck turns check i of a request into an engine check: the values
// sent, then an override (which wins), then the limits file for what is
// still missing.
func (s *Server) nativeCheck(i int, pc *sluicepb.Check, now time.Time, c *actor.Check) error {
	c.Key = string(pc.Key)
	if pc.KeyText != "" {
		if len(pc.Key) > 0 {
			return badInput("check %d: both key and key_text are set; set one (key_text is the key as text)", i)
		}
		c.Key = pc.KeyText
	}
	c.Limit = pc.Limit
	if pc.Window != nil {
		if err := pc.Window.CheckValid(); err != nil {
			return badInput("check %d: window: %v", i, err)
		}
		c.Window = pc.Window.AsDuration()
	}
	algo, err := fromProtoAlgorithm(pc.Algorithm)
	if err != nil {
		return badInput("check %d: %v", i, err)
	}
	c.Algorithm = algo
	c.Cost = 1
	if pc.Cost != nil {
		c.Cost = *pc.Cost
	}
	c.Refund, c.Penalty, c.Usage = pc.Refund, pc.Penalty, pc.Usage
	field := "checks[" + strconv.Itoa(i) + "]."
	switch {
	case len(pc.ReservationId) > 0 || pc.Settle:
		return badFields([]string{field + "reservation_id"}, "check %d: reservation_id and settle are for Sluice's nodes among themselves: reserve with reserve_for, and settle with Settle", i)
	case c.Usage && (c.Refund || c.Penalty):
		return badFields([]string{field + "usage"}, "check %d: a usage report is always recorded: it cannot also be a refund or a penalty", i)
	case pc.ReserveFor != nil:
		if err := pc.ReserveFor.CheckValid(); err != nil || pc.ReserveFor.AsDuration() <= 0 {
			return badFields([]string{field + "reserve_for"}, "check %d: reserve_for %v: it must be a positive duration (how long the reservation lasts before it settles at its estimate)", i, pc.ReserveFor.AsDuration())
		}
		if c.Usage || c.Refund || c.Penalty {
			return badFields([]string{field + "reserve_for"}, "check %d: a reservation cannot also be a usage report, a refund or a penalty", i)
		}
		c.Reservation = &actor.Reservation{ID: newReservationID(), TTL: pc.ReserveFor.AsDuration(), Lease: pc.Lease, Holder: pc.Holder, Demand: pc.Demand}
	case pc.Lease:
		return badFields([]string{field + "lease"}, "check %d: lease needs reserve_for: how long the caller may spend the slice before it expires", i)
	case pc.Holder != "":
		return badFields([]string{field + "holder"}, "check %d: holder names who holds a reservation: it needs reserve_for", i)
	case pc.Demand != 0:
		return badFields([]string{field + "demand"}, "check %d: demand is a lease holder's word for fair shares: it needs reserve_for, lease and holder", i)
	}
	if c.Limit < 0 {
		return badInput("check %d: limit: %d; it must be a positive count, or 0 to take it from an override or the limits file", i, c.Limit)
	}
	if o := s.overrides.Match(c.Key, now); o != nil {
		o.Apply(c)
	}
	if c.Limit == 0 || c.Window == 0 {
		if rule := s.limitsRuleForKey(c.Key); rule != nil {
			if c.Limit == 0 {
				c.Limit = rule.Limit
			}
			if c.Window == 0 {
				c.Window = rule.Window
			}
		}
	}
	if c.Limit == 0 || c.Window == 0 {
		return missingLimitOrWindow(i, []byte(c.Key), c)
	}
	return nil
}

// missingLimitOrWindow is the error of check i, whose limit or window (or
// both) neither the check, nor an override, nor the limits file gave: it
// says which, and names the fields.
func missingLimitOrWindow(i int, key []byte, c *actor.Check) error {
	field := "checks[" + strconv.Itoa(i) + "]."
	switch {
	case c.Limit == 0 && c.Window == 0:
		return badFields([]string{field + "limit", field + "window"}, "check %d (key %s): no limit and no window: send them, set an override, or give the key a limits file entry", i, actor.QuoteKey(key))
	case c.Window == 0:
		return badFields([]string{field + "window"}, "check %d (key %s): no window: the limit is %d, but neither the check nor an override nor a limits file entry gives a window; send one", i, actor.QuoteKey(key), c.Limit)
	}
	return badFields([]string{field + "limit"}, "check %d (key %s): no limit: the window is %v, but neither the check nor an override nor a limits file entry gives a limit; send one", i, actor.QuoteKey(key), c.Window)
}

// fromProtoAlgorithm maps the API's algorithm to the engine's.
func fromProtoAlgorithm(a sluicepb.Algorithm) (actor.Algorithm, error) {
	algo, ok := cluster.AlgorithmFromProto(a)
	if !ok {
		return 0, badInput("algorithm: unknown value %d (want 1 sliding log, 2 sliding window or 3 token bucket)", a)
	}
	return algo, nil
}

// maxBatch is the most checks one call may carry.
func (s *Server) maxBatch() int { return s.engineLimits().MaxBatch }

// decide runs checks on their owners, all or nothing if asked, and puts
// the name of the node that decided each into nodes (if not nil).
func (s *Server) decide(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, allOrNothing bool) error {
	if nodes == nil {
		nodes = make([]string, len(checks))
	}
	return s.decider.Check(ctx, checks, out, nodes, allOrNothing)
}
