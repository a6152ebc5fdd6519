package api

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// This file holds the native API's reservations: the handles a reserving
// check returns and Settle, which takes them back. A reservation lives in
// its key's state (actor.Reservation), on the key's owner; the handle
// names it with 128 random bits, so only its holder can settle it, and
// carries what routing the settle to the owner needs (the key and its
// parameters) and the estimate (so that the answer can say what was given
// back or recorded above it).

// handleVersion starts every handle.
const handleVersion = 1

// handle is a decoded reservation handle.
type handle struct {
	id       actor.ReservationID
	estimate int64
	limit    int64
	window   time.Duration
	algo     actor.Algorithm
	key      string
}

// appendHandle encodes the handle of the reservation c made: version,
// 16-byte ID, uvarint estimate, limit and window (ns), the algorithm,
// then the key.
func appendHandle(b []byte, c *actor.Check) []byte {
	b = append(b, handleVersion)
	b = append(b, c.Reservation.ID[:]...)
	b = binary.AppendUvarint(b, uint64(c.Cost))
	b = binary.AppendUvarint(b, uint64(c.Limit))
	b = binary.AppendUvarint(b, uint64(c.Window))
	b = append(b, byte(c.Algorithm))
	return append(b, c.Key...)
}

// errBadHandle is the reason for a handle Sluice did not make.
var errBadHandle = errors.New("not a reservation handle: pass Decision.reservation as it came back")

// parseHandle decodes a handle. The engine validates the key, limit and
// window it holds like a check's; the ID is only ever compared.
func parseHandle(b []byte) (handle, error) {
	var h handle
	if len(b) < 1+len(h.id) || b[0] != handleVersion {
		return h, errBadHandle
	}
	copy(h.id[:], b[1:])
	b = b[1+len(h.id):]
	var vals [3]int64
	for i := range vals {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > 1<<62 {
			return h, errBadHandle
		}
		vals[i], b = int64(v), b[n:]
	}
	if len(b) < 2 {
		return h, errBadHandle
	}
	h.estimate, h.limit, h.window = vals[0], vals[1], time.Duration(vals[2])
	h.algo, h.key = actor.Algorithm(b[0]), string(b[1:])
	return h, nil
}

// newReservationID returns 16 random bytes from the operating system's
// generator: a handle cannot be guessed.
func newReservationID() actor.ReservationID {
	var id actor.ReservationID
	rand.Read(id[:]) // never fails (crypto/rand)
	return id
}

// countUsage counts the usage reports and reservations of a native call.
func (s *Server) countUsage(checks []actor.Check, out []actor.Decision) {
	u := &s.metrics.usage
	for i := range checks {
		c, d := &checks[i], &out[i]
		switch {
		case c.Reservation != nil && d.Allowed:
			u.reserves.WithLabelValues("allowed").Inc()
			u.reservedHits.Add(float64(c.Cost))
		case c.Reservation != nil:
			u.reserves.WithLabelValues("denied").Inc()
		case c.Usage && c.Cost > 0:
			u.reports.WithLabelValues("native").Inc()
			u.reportedHits.WithLabelValues("native").Add(float64(c.Cost))
			if !d.Allowed {
				u.overLimit.WithLabelValues("native").Inc()
			}
		}
	}
}

// Settle settles reservations.
func (n *nativeService) Settle(ctx context.Context, req *sluicepb.SettleRequest) (*sluicepb.SettleResponse, error) {
	s := n.s
	start := time.Now()
	resp, err := s.settle(ctx, req)
	s.metrics.native.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

func (s *Server) settle(ctx context.Context, req *sluicepb.SettleRequest) (*sluicepb.SettleResponse, error) {
	switch n := len(req.Settlements); {
	case n == 0:
		return nil, badInput("no settlements: send at least one")
	case n > s.maxBatch():
		return nil, badInput("%d settlements in one call; the maximum is %d: split the batch", n, s.maxBatch())
	}
	checks := make([]actor.Check, len(req.Settlements))
	handles := make([]handle, len(req.Settlements))
	res := make([]actor.Reservation, len(req.Settlements))
	for i, st := range req.Settlements {
		field := "settlements[" + strconv.Itoa(i) + "]."
		h, err := parseHandle(st.Reservation)
		if err != nil {
			return nil, badFields([]string{field + "reservation"}, "settlement %d: %v", i, err)
		}
		if st.Cost < 0 {
			return nil, badFields([]string{field + "cost"}, "settlement %d: cost %d: it must be 0 or more", i, st.Cost)
		}
		handles[i] = h
		res[i] = actor.Reservation{ID: h.id, Settle: true}
		checks[i] = actor.Check{Key: h.key, Limit: h.limit, Window: h.window, Algorithm: h.algo, Cost: st.Cost, Reservation: &res[i]}
	}
	out := make([]actor.Decision, len(checks))
	nodes := make([]string, len(checks))
	if err := s.decide(ctx, checks, out, nodes, false); err != nil {
		var ice *actor.InvalidCheckError
		if errors.As(err, &ice) && ice.Index < len(checks) {
			return nil, badFields([]string{"settlements[" + strconv.Itoa(ice.Index) + "].reservation"}, "settlement %d: the handle holds a bad %s: %s", ice.Index, ice.Field, ice.Reason)
		}
		return nil, err
	}
	resp := &sluicepb.SettleResponse{Results: make([]*sluicepb.SettleResult, len(out))}
	results := make([]sluicepb.SettleResult, len(out))
	durs := make([]durationpb.Duration, 2*len(out))
	u := &s.metrics.usage
	for i := range out {
		d, h, r := &out[i], &handles[i], &results[i]
		r.Settled, r.Limit, r.Remaining, r.Node = d.Allowed, d.Limit, d.Remaining, nodes[i]
		r.RetryAfter = setDuration(&durs[2*i], d.RetryAfter)
		r.ResetAfter = setDuration(&durs[2*i+1], d.ResetAfter)
		if d.Allowed {
			cost := checks[i].Cost
			r.Returned, r.Overshoot = max(0, h.estimate-cost), max(0, cost-h.estimate)
			u.settles.WithLabelValues("settled").Inc()
			u.returnedHits.Add(float64(r.Returned))
			u.overshootHits.Add(float64(r.Overshoot))
		} else {
			u.settles.WithLabelValues("not_held").Inc()
		}
		resp.Results[i] = r
	}
	return resp, nil
}
