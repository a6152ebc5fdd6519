package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// DefaultSettleTimeout is the deadline of a Settle without WithTimeout:
// a settle is off the request's path, and one that fails leaves the
// reservation to settle at its estimate when it expires (an overshoot is
// then lost), so it waits longer than a decision.
const DefaultSettleTimeout = time.Second

// Reservation holds the estimate of work whose actual cost is known only
// once it is done (an LLM request reserves its max_tokens, and settles
// with the tokens it used). Reserve makes it; Settle settles it.
type Reservation struct {
	// Allowed says whether the work may go ahead: every check's estimate
	// fitted and is held by Sluice, or Sluice did not decide and the
	// failure policy allowed it.
	Allowed bool
	// Decisions holds the decision of each check of Reserve, in order.
	Decisions []Decision

	checks  []Check
	handles [][]byte // one per check when Sluice holds the reservation
}

// Held reports whether Sluice holds the reservation: it then counts the
// estimate until Settle, or until it expires (settled at the estimate).
func (r *Reservation) Held() bool { return r != nil && r.Allowed && len(r.handles) > 0 }

// Handles returns the reservation's handles, one per check, when Sluice
// holds it (nil otherwise): opaque bytes that settle it through the
// native API's Settle from anywhere. Keep them secret: anyone holding a
// handle can settle its reservation.
func (r *Reservation) Handles() [][]byte {
	if !r.Held() {
		return nil
	}
	return r.handles
}

// Settlement is the outcome of settling one check of a reservation.
type Settlement struct {
	// Key is the check's key.
	Key string
	// Settled says whether Sluice held the reservation and settled it now.
	// False when it had settled already, expired (settled at its
	// estimate), or was reset; or when Sluice did not decide (Err).
	Settled bool
	// Reported says that Sluice did not hold the reservation because it
	// did not decide the Reserve (the failure policy allowed the work):
	// the cost was sent as a usage report instead (see Check.Usage).
	Reported bool
	// Returned is what went back to the budget (estimate - cost), and
	// Overshoot what was recorded above the estimate (cost - estimate).
	Returned, Overshoot int64
	// Remaining is how many cost-1 hits the key allows now; -1 unknown.
	Remaining int64
	// RetryAfter is 0 when the key is below its limit, else the wait until
	// it is; ResetAfter the wait until the whole limit is back.
	RetryAfter, ResetAfter time.Duration
	// Node names the node that settled it.
	Node string
}

// Reserve reserves each check's Cost, an estimate, for ttl (at least
// 1ms): if every one fits, their hits are recorded at once, so that
// concurrent work cannot spend the same budget, and the reservation is
// held until Settle, or until ttl has passed, when it is settled at its
// estimate. Several checks are reserved all or nothing (a request
// against a per-user and a per-team budget). Reserve makes one call of
// its own, within Config.Timeout like Check. Peek, Refund, Penalty and
// Usage make no sense here and are refused by Sluice.
//
// The reservation is always usable: when Sluice does not decide, the
// failure policy does (Allowed), err says why, and Settle sends the
// actual cost as a usage report instead.
func (c *Client) Reserve(ctx context.Context, ttl time.Duration, checks []Check, opts ...Option) (*Reservation, error) {
	return c.reserve(ctx, ttl, checks, false, "", 0, opts)
}

// reserve is Reserve; with lease, of quota leases (see Lease) held by
// holder.
func (c *Client) reserve(ctx context.Context, ttl time.Duration, checks []Check, lease bool, holder string, demand int64, opts []Option) (*Reservation, error) {
	c.stats.checks.Add(uint64(len(checks)))
	r := &Reservation{checks: append([]Check(nil), checks...), Decisions: make([]Decision, len(checks))}
	if len(checks) == 0 {
		r.Allowed = true
		return r, nil
	}
	s := c.settings(ctx, opts)
	req := &sluicepb.CheckRequest{Checks: make([]*sluicepb.Check, len(checks)), AllOrNothing: len(checks) > 1}
	pcs := make([]sluicepb.Check, len(checks))
	for i := range checks {
		req.Checks[i] = toProto(&checks[i], &pcs[i])
		req.Checks[i].ReserveFor = durationpb.New(ttl)
		req.Checks[i].Lease, req.Checks[i].Holder, req.Checks[i].Demand = lease, holder, demand
	}
	rl := c.wholeCall(checks)
	resp, info, err := send(c, ctx, s.deadline, func(ctx context.Context, o []grpc.CallOption) (*sluicepb.CheckResponse, error) {
		return rl.Check(ctx, req, o...)
	}, len(checks))
	if err == nil && len(resp.Decisions) != len(checks) {
		err = fmt.Errorf("client: %d decisions for %d checks", len(resp.Decisions), len(checks))
	}
	if err != nil {
		r.Allowed = true
		for i := range checks {
			r.Decisions[i] = c.failed(&checks[i], s.policy, err)
			r.Allowed = r.Allowed && r.Decisions[i].Allowed
		}
		return r, fmt.Errorf("client: reserve %s: %w", quoteKey(checks[0].Key), err)
	}
	r.Allowed = true
	r.handles = make([][]byte, len(checks))
	for i, pd := range resp.Decisions {
		if err := undecided(pd); err != nil {
			r.Decisions[i] = c.failed(&r.checks[i], s.policy, err)
			r.Allowed = r.Allowed && r.Decisions[i].Allowed
			continue
		}
		r.Decisions[i] = c.decided(&r.checks[i], pd, &info)
		r.Decisions[i].granted = pd.Granted
		r.Allowed = r.Allowed && pd.Allowed && len(pd.Reservation) > 0
		r.handles[i] = pd.Reservation
	}
	return r, nil
}

// Settle settles r with the actual cost of the work: below the estimate,
// the difference goes back to each check's budget; above it, the excess
// is recorded as usage, even over the limit. A reservation settles once;
// settling a reservation that was not Allowed does nothing. It waits up to
// DefaultSettleTimeout unless WithTimeout says otherwise.
func (c *Client) Settle(ctx context.Context, r *Reservation, cost int64, opts ...Option) ([]Settlement, error) {
	if r == nil || !r.Allowed || len(r.checks) == 0 {
		return nil, nil
	}
	if cost < 0 {
		return nil, fmt.Errorf("client: settle: cost %d is negative", cost)
	}
	s := c.settings(ctx, append([]Option{WithTimeout(DefaultSettleTimeout)}, opts...))
	out := make([]Settlement, len(r.checks))
	for i := range out {
		out[i] = Settlement{Key: r.checks[i].Key, Remaining: -1}
	}
	if !r.Held() {
		// Sluice did not decide the reserve: report what was spent.
		usage := make([]Check, len(r.checks))
		for i, ch := range r.checks {
			usage[i] = Check{Key: ch.Key, Limit: ch.Limit, Window: ch.Window, Algorithm: ch.Algorithm, Cost: cost, Peek: cost == 0, Usage: true}
		}
		res, err := c.direct(ctx, usage, s.deadline, false)
		if err != nil {
			return out, fmt.Errorf("client: settle %s as usage: %w", quoteKey(r.checks[0].Key), err)
		}
		for i := range res {
			pd, o := res[i].dec, &out[i]
			o.Reported, o.Remaining, o.Node = true, pd.Remaining, pd.Node
			o.RetryAfter, o.ResetAfter = pd.RetryAfter.AsDuration(), pd.ResetAfter.AsDuration()
		}
		return out, nil
	}
	req := &sluicepb.SettleRequest{Settlements: make([]*sluicepb.Settlement, len(r.handles))}
	for i, h := range r.handles {
		req.Settlements[i] = &sluicepb.Settlement{Reservation: h, Cost: cost}
	}
	rl := c.wholeCall(r.checks)
	resp, _, err := send(c, ctx, s.deadline, func(ctx context.Context, o []grpc.CallOption) (*sluicepb.SettleResponse, error) {
		return rl.Settle(ctx, req, o...)
	}, len(r.handles))
	if err == nil && len(resp.Results) != len(r.handles) {
		err = fmt.Errorf("client: %d results for %d settlements", len(resp.Results), len(r.handles))
	}
	if err != nil {
		return out, fmt.Errorf("client: settle %s: %w", quoteKey(r.checks[0].Key), err)
	}
	for i, res := range resp.Results {
		o := &out[i]
		o.Settled, o.Returned, o.Overshoot = res.Settled, res.Returned, res.Overshoot
		o.Remaining, o.Node = res.Remaining, res.Node
		o.RetryAfter, o.ResetAfter = res.RetryAfter.AsDuration(), res.ResetAfter.AsDuration()
	}
	return out, nil
}

// wholeCall returns where a call that must stay whole goes: the node that
// decides most of checks when the client routes (it forwards the others),
// else the address given.
func (c *Client) wholeCall(checks []Check) sluicepb.RateLimitServiceClient {
	if c.routes == nil {
		return c.rl
	}
	return c.routes.majority(len(checks), func(i int) string { return checks[i].Key }).l.rl
}

// send makes one call of its own under deadline (Close cuts it), and once
// more if the node answered that ownership of a key is moving and the
// deadline leaves time for it.
func send[T any](c *Client, ctx context.Context, deadline time.Time, call func(context.Context, []grpc.CallOption) (T, error), n int) (T, callInfo, error) {
	var zero T
	var info callInfo
	select {
	case <-c.done:
		return zero, info, ErrClosed
	default:
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel)
	defer stop()
	opts := append(c.callOp[:len(c.callOp):len(c.callOp)], grpc.Peer(&info.peer))
	for try := 0; ; try++ {
		info.sent = c.now()
		c.stats.calls.Add(1)
		c.stats.batched.Add(uint64(n))
		resp, err := call(ctx, opts)
		if err == nil || try > 0 || !moving(err) {
			if err != nil && c.ctx.Err() != nil {
				err = ErrClosed
			}
			return resp, info, err
		}
		pause := 2 * time.Millisecond
		if d, ok := ctx.Deadline(); ok {
			pause = min(pause, time.Until(d)/4)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return zero, info, err
		}
		c.stats.retries.Add(1)
	}
}
