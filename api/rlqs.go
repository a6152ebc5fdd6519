package api

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/api/limits"
)

// The Rate Limit Quota Service (RLQS, envoy.service.rate_limit_quota.v3):
// Envoys report how many requests each of their buckets saw, and the
// server assigns each bucket a token bucket. Sluice maps a bucket to a
// key of the limits file (its bucket_id's entries, sorted by name, are a
// descriptor of the stream's domain), divides the key's rate among the
// buckets of this node's streams by max-min fair share over what they
// report, and backs every assignment with a quota lease on the key: an
// assignment of max_tokens and rate tokens a second can admit at most
// max_tokens + rate × window in any window, so it leases that many hits
// until its TTL (and a margin) has passed, extended each time the same
// assignment is sent again. The owner grants a lease only if it fits, so
// the assignments of every stream of every node, and the key's other
// callers, never admit more than the limit in any window
// (docs/envoy.md, "RLQS").

// RLQS settings.
const (
	// rlqsFill is the fill interval of every assignment: Envoy's token
	// bucket counts whole seconds.
	rlqsFill = time.Second
	// rlqsMinTTL and rlqsMaxTTL bound an assignment's TTL: twice the
	// time between the stream's reports.
	rlqsMinTTL = 2 * time.Second
	rlqsMaxTTL = time.Minute
	// rlqsTransit is added to a lease beyond its assignment's TTL: the
	// time an assignment may take to reach Envoy, plus its clock's drift.
	rlqsTransit = time.Second
	// rlqsChange is how far a bucket's fair share must move from the rate
	// it holds before it gets a new one: a new assignment takes a new
	// lease while the old one still counts.
	rlqsChange = 0.1
	// rlqsMaxBuckets bounds the buckets of one stream.
	rlqsMaxBuckets = 10_000
)

// rlqsService serves RLQS streams.
type rlqsService struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	s *Server

	mu   sync.Mutex
	keys map[string]map[*rlqsBucket]bool // the buckets of this node's streams, by key
	// closing is closed when the node stops: streams end after sending
	// every bucket a zero TTL.
	closing   chan struct{}
	closeOnce sync.Once

	streams     prometheus.Gauge
	assignments *prometheus.CounterVec
	streamSeq   atomic.Uint64 // numbers the streams, for rlqsHolder
}

func newRLQSService(s *Server, reg prometheus.Registerer) *rlqsService {
	r := &rlqsService{
		s: s, keys: make(map[string]map[*rlqsBucket]bool), closing: make(chan struct{}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_rlqs_streams",
			Help: "Open RLQS streams (Envoy's rate limit quota filter).",
		}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_rlqs_assignments_total",
			Help: "RLQS bucket actions sent, by kind: token_bucket (new), extended (the same again), allow_all (no limit applies), deny_all (limit 0, or no room), abandon, expire (zero TTL before the node stops).",
		}, []string{"kind"}),
	}
	reg.MustRegister(r.streams, r.assignments)
	return r
}

// rlqsBucket is one bucket of one stream.
type rlqsBucket struct {
	id     *rlqsv3.BucketId
	name   string // its entries, for logs and map keys
	holder string // its leases' holder: rlqsHolder

	// What the limits file says of it, and the file it was read from.
	kind   rlqsKind
	key    string
	limit  int64
	window time.Duration
	cfg    *limits.Config

	// demand is the requests a second it reports, smoothed; known once
	// it reported a time elapsed.
	demand      float64
	demandKnown bool
	lastReport  time.Time
	ttl         time.Duration // of its assignments

	// The assignment in force and its lease: leaseN covers every
	// assignment it was sent that may still admit within a window.
	rate    int64 // tokens a second; 0: none yet, or deny_all
	leaseID actor.ReservationID
	leaseN  int64
	// changed is when the rate last changed, and oldTTL the TTL of the
	// assignments sent before: once changed + oldTTL + transit + window
	// has passed, the old assignments can admit in no window any more
	// and the lease shrinks to what the rate needs.
	changed time.Time
	oldTTL  time.Duration
	ttlSent time.Duration // the longest TTL sent with the rate in force
	// ownerRate is b's max-min fair share of the key among the holders
	// of every node, as a rate (requests a second), from what the owner
	// last reported; 0 when no share is in force.
	ownerRate float64
}

type rlqsKind uint8

const (
	rlqsLimited rlqsKind = iota
	rlqsAllowAll
	rlqsDenyAll
)

// StreamRateLimitQuotas answers each usage report with an action for each
// bucket it reports.
func (r *rlqsService) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	if err := r.s.mayLease(stream.Context(), "rlqs"); err != nil {
		return err
	}
	r.streams.Inc()
	defer r.streams.Dec()
	ctx := context.WithValue(stream.Context(), rlqsStreamKey{}, r.streamSeq.Add(1))
	type recv struct {
		m   *rlqsv3.RateLimitQuotaUsageReports
		err error
	}
	msgs := make(chan recv, 1)
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case msgs <- recv{m, err}:
			case <-stream.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var domain string
	buckets := make(map[string]*rlqsBucket)
	defer func() {
		r.mu.Lock()
		for _, b := range buckets {
			r.forget(b)
		}
		r.mu.Unlock()
	}()
	for {
		var in recv
		select {
		case in = <-msgs:
		case <-r.closing:
			return r.expireAll(stream, buckets)
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
		if in.err != nil {
			if errors.Is(in.err, io.EOF) || errors.Is(in.err, context.Canceled) || status.Code(in.err) == codes.Canceled {
				return nil
			}
			return in.err
		}
		if domain == "" {
			if domain = in.m.GetDomain(); domain == "" {
				return status.Error(codes.InvalidArgument, "rlqs: the first usage report has no domain: set the domain of Envoy's rate limit quota filter (it names the limits file's domain)")
			}
		}
		resp, err := r.report(ctx, domain, in.m, buckets)
		if err != nil {
			return err
		}
		if len(resp.BucketAction) > 0 {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// rlqsHolder names the holder of a stream's leases in a key's state: the
// node, the stream's peer and the stream's number on the node,
// "node-1 rlqs 10.0.0.7:41532 #7". Each stream is its own holder for fair
// shares.
func rlqsHolder(ctx context.Context, node string) string {
	h := node + " rlqs"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		h += " " + p.Addr.String()
	}
	if n, ok := ctx.Value(rlqsStreamKey{}).(uint64); ok {
		h += fmt.Sprintf(" #%d", n)
	}
	return h[max(0, len(h)-actor.MaxHolderLen):]
}

// rlqsStreamKey is the context key of a stream's number.
type rlqsStreamKey struct{}

// report handles one usage report of a stream of domain whose buckets are
// buckets, and returns the actions to send.
func (r *rlqsService) report(ctx context.Context, domain string, m *rlqsv3.RateLimitQuotaUsageReports, buckets map[string]*rlqsBucket) (*rlqsv3.RateLimitQuotaResponse, error) {
	now := r.s.clock.Now()
	var cfg *limits.Config
	if r.s.limits != nil {
		cfg = r.s.limits.Current()
	}
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var reported []*rlqsBucket
	var ttl time.Duration = rlqsMinTTL
	for i, u := range m.GetBucketQuotaUsages() {
		entries, name, err := rlqsEntries(i, u.GetBucketId())
		if err != nil {
			return nil, err
		}
		b := buckets[name]
		if b == nil {
			if len(buckets) >= rlqsMaxBuckets {
				return nil, status.Errorf(codes.ResourceExhausted, "rlqs: more than %d buckets on one stream: make the bucket ids of Envoy's bucket matchers coarser", rlqsMaxBuckets)
			}
			b = &rlqsBucket{id: u.GetBucketId(), name: name, holder: rlqsHolder(ctx, r.s.cfg.NodeName)}
			r.classify(cfg, domain, entries, b)
			buckets[name] = b
			r.mu.Lock()
			r.register(b)
			r.mu.Unlock()
		} else if b.cfg != cfg {
			r.reclassify(cfg, domain, entries, b)
		}
		// Other streams read these (share), under r.mu.
		r.mu.Lock()
		if el := u.GetTimeElapsed().AsDuration(); el > 0 {
			// The latest rate, not an average: a share that moves takes a
			// new lease while the old one still counts, so it should move
			// once, to where the demand is.
			b.demand = float64(u.GetNumRequestsAllowed()+u.GetNumRequestsDenied()) / el.Seconds()
			b.demandKnown = true
			ttl = max(ttl, 2*el)
		}
		b.lastReport = now
		r.mu.Unlock()
		reported = append(reported, b)
	}
	ttl = min(ttl, rlqsMaxTTL)
	r.mu.Lock()
	for _, b := range reported {
		b.ttl = ttl
	}
	r.mu.Unlock()
	resp.BucketAction = append(resp.BucketAction, r.assignAll(ctx, reported, ttl)...)
	// Buckets this stream stopped reporting give their share back.
	for name, b := range buckets {
		if now.Sub(b.lastReport) > 3*rlqsMaxTTL {
			r.mu.Lock()
			r.forget(b)
			r.mu.Unlock()
			delete(buckets, name)
			r.assignments.WithLabelValues("abandon").Inc()
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{
				BucketId:     b.id,
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
			})
		}
	}
	return resp, nil
}

// rlqsAssignParallel bounds the buckets of one report assigned at once
// (each assignment may wait for a lease from its key's owner).
const rlqsAssignParallel = 16

// assignAll assigns each bucket of a report, rlqsAssignParallel at a
// time, and returns their actions in the report's order. A bucket
// reported twice is assigned once.
func (r *rlqsService) assignAll(ctx context.Context, reported []*rlqsBucket, ttl time.Duration) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	actions := make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, len(reported))
	first := make(map[*rlqsBucket]int, len(reported))
	var wg sync.WaitGroup
	sem := make(chan struct{}, rlqsAssignParallel)
	for i, b := range reported {
		if _, seen := first[b]; seen {
			continue
		}
		first[b] = i
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			actions[i] = r.assign(ctx, b, ttl)
		}()
	}
	wg.Wait()
	for i, b := range reported {
		actions[i] = actions[first[b]]
	}
	return actions
}

// rlqsEntries returns the descriptor entries of a bucket id, sorted by
// name, and a name for the bucket.
func rlqsEntries(i int, id *rlqsv3.BucketId) ([]limits.Entry, string, error) {
	if len(id.GetBucket()) == 0 {
		return nil, "", status.Errorf(codes.InvalidArgument, "rlqs: usage %d has an empty bucket_id: Envoy's bucket matchers must name each bucket", i)
	}
	entries := make([]limits.Entry, 0, len(id.GetBucket()))
	for k, v := range id.GetBucket() {
		entries = append(entries, limits.Entry{Key: k, Value: v})
	}
	sort.Slice(entries, func(a, b int) bool { return entries[a].Key < entries[b].Key })
	var name strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&name, "%q=%q,", e.Key, e.Value)
	}
	return entries, name.String(), nil
}

// classify sets what the limits file says of b.
func (r *rlqsService) classify(cfg *limits.Config, domain string, entries []limits.Entry, b *rlqsBucket) {
	b.cfg = cfg
	rule, counted, ok := cfg.Match(domain, entries)
	switch {
	case !ok || rule.Unlimited:
		b.kind = rlqsAllowAll
	case rule.Limit == 0:
		b.kind = rlqsDenyAll
	default:
		b.kind, b.key, b.limit, b.window = rlqsLimited, envoyKey(domain, counted), rule.Limit, rule.Window
	}
}

// reclassify looks b up again in a limits file that changed since it
// was classified. A bucket whose rule changed (its key, limit or window,
// or whether it is limited) starts anew, as a bucket first seen: this
// report's answer replaces Envoy's assignment, and the old assignment's
// lease counts on its key until it expires, as every lease does.
func (r *rlqsService) reclassify(cfg *limits.Config, domain string, entries []limits.Entry, b *rlqsBucket) {
	n := rlqsBucket{}
	r.classify(cfg, domain, entries, &n)
	if n.kind == b.kind && n.key == b.key && n.limit == b.limit && n.window == b.window {
		b.cfg = cfg
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(b)
	b.kind, b.key, b.limit, b.window, b.cfg = n.kind, n.key, n.limit, n.window, cfg
	b.rate, b.leaseID, b.leaseN, b.changed, b.oldTTL, b.ttlSent = 0, actor.ReservationID{}, 0, time.Time{}, 0, 0
	r.register(b)
}

// register adds a limited bucket to its key's buckets. r.mu is held.
func (r *rlqsService) register(b *rlqsBucket) {
	if b.kind != rlqsLimited {
		return
	}
	if r.keys[b.key] == nil {
		r.keys[b.key] = make(map[*rlqsBucket]bool)
	}
	r.keys[b.key][b] = true
}

// forget drops b from its key's buckets. r.mu is held.
func (r *rlqsService) forget(b *rlqsBucket) {
	if hs := r.keys[b.key]; hs != nil {
		delete(hs, b)
		if len(hs) == 0 {
			delete(r.keys, b.key)
		}
	}
}

// share returns b's max-min fair share, in requests a second, of its
// key's rate among this node's buckets of the key: each bucket gets what
// it asks up to an equal part of what the smaller askers left. A bucket
// whose demand is unknown asks for everything. The key's rate is
// rlqsCapacity. It also returns how many buckets share it.
func (r *rlqsService) share(b *rlqsBucket) (float64, int) {
	capacity := rlqsCapacity(b)
	now := r.s.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var demands []float64
	for o := range r.keys[b.key] {
		if o != b && now.Sub(o.lastReport) > o.ttl {
			continue // silent past its assignment: its share is free again
		}
		d := capacity
		if o.demandKnown {
			d = o.demand
		}
		demands = append(demands, d)
	}
	want := capacity
	if b.demandKnown {
		want = b.demand
	}
	return maxMinShare(capacity, demands, want), len(demands)
}

// rlqsCapacity is the rate, in requests a second, that b's key's
// assignments divide: limit / (window + two fills). An assignment of rate
// r leases r × (1 + F) (F: the fills of a window), so the assignments
// together hold at most limit − C, C being this rate: the room kept free
// (the headroom) is at least any bucket's rate. A bucket whose share
// falls needs that room, since Envoy replaces its bucket with a full one
// (a burst of the new rate) while the old one still counts; new
// assignments and raises are granted only from the room beyond it, so
// that a newcomer can always make the others give way.
func rlqsCapacity(b *rlqsBucket) float64 {
	return float64(b.limit) / (b.window + 2*rlqsFill).Seconds()
}

// rlqsHeadroom is rlqsCapacity in whole hits: the room kept free for
// buckets lowering their rate.
func rlqsHeadroom(b *rlqsBucket) int64 {
	return int64(math.Ceil(rlqsCapacity(b)))
}

// maxMinShare returns the max-min fair share of capacity for a demand of
// want among demands (want is one of them).
func maxMinShare(capacity float64, demands []float64, want float64) float64 {
	slices.Sort(demands)
	left := capacity
	for i, d := range demands {
		equal := left / float64(len(demands)-i)
		if d >= equal {
			return min(want, equal)
		}
		left -= d
	}
	return want
}

// assign returns the action for bucket b, assignments lasting ttl.
//
// An assignment of rate r (a token bucket of r tokens, r a second) admits
// at most r + r × F in any window, F being the fills a window holds: that
// is its need, r(1+F). A change of rate replaces Envoy's bucket with a
// full new one, so a window across the change may see the old bucket's
// burst and the new one's: the lease grows by r_new + max(0, r_new −
// r_old) × F, and shrinks back to the need once the old assignment can
// admit in no window any more. The lease moves to a window after the new
// TTL each time an assignment is sent.
func (r *rlqsService) assign(ctx context.Context, b *rlqsBucket, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	blanket := func(rule typev3.RateLimitStrategy_BlanketRule, kind string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
		r.assignments.WithLabelValues(kind).Inc()
		return rlqsAction(b.id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}})
	}
	switch b.kind {
	case rlqsAllowAll:
		return blanket(typev3.RateLimitStrategy_ALLOW_ALL, "allow_all")
	case rlqsDenyAll:
		return blanket(typev3.RateLimitStrategy_DENY_ALL, "deny_all")
	}
	now := r.s.clock.Now()
	fills := int64((b.window + rlqsFill - 1) / rlqsFill)
	need := func(rate int64) int64 { return rate * (1 + fills) }
	leaseTTL := ttl + rlqsTransit
	share, peers := r.share(b)
	if b.ownerRate > 0 {
		// The key's owner hears every node's buckets: its share binds
		// too.
		share = min(share, b.ownerRate)
	}
	want := int64(math.Floor(share))
	if share > 0 {
		want = max(want, 1) // a bucket with a demand gets at least a request a second
	}
	if b.rate == 0 {
		// A first assignment: at most an equal part, until its demand and
		// the others' are known from a report, and only from the room
		// beyond the headroom.
		want = min(want, max(1, int64(rlqsCapacity(b)/float64(peers))))
		if room, ok := r.room(ctx, b); ok {
			want = min(want, (room-rlqsHeadroom(b))/(1+fills))
		}
		// With no room, a lease of one hit, given back at once: it tells
		// the owner this bucket's demand, so that the buckets holding the
		// key, on any node, hear their share fall and give way.
		var id actor.ReservationID
		rand.Read(id[:])
		n := int64(1)
		if want >= 1 {
			n = need(want)
		}
		ok, held := r.lease(ctx, b, id, n, leaseTTL)
		if rate := held / (1 + fills); ok && want >= 1 && rate >= 1 {
			b.rate, b.leaseID, b.leaseN, b.changed, b.oldTTL = rate, id, held, now, 0
			r.assignments.WithLabelValues("token_bucket").Inc()
			return rlqsAction(b.id, ttl, tokenBucket(rate))
		}
		if ok {
			r.settle(ctx, b, id)
		}
		return blanket(typev3.RateLimitStrategy_DENY_ALL, "deny_all")
	}
	if want > b.rate && float64(want-b.rate) > rlqsChange*float64(b.rate) {
		// A raise, from the room beyond the headroom only: at most what
		// it allows, if that is still a change worth one.
		if room, ok := r.room(ctx, b); ok {
			if fit := (room - rlqsHeadroom(b) + b.rate*fills) / (1 + fills); fit < want {
				want = max(fit, b.rate) // never a cut for want of room
			}
		}
	}
	if math.Abs(float64(want-b.rate)) > rlqsChange*float64(b.rate) {
		grow := func(rate int64) int64 { return rate + max(0, rate-b.rate)*fills }
		ok, _ := r.lease(ctx, b, b.leaseID, b.leaseN+grow(want), leaseTTL)
		if ok {
			b.leaseN += grow(want)
			b.rate, b.changed, b.oldTTL = want, now, b.ttlSent
			b.ttlSent = ttl
			r.assignments.WithLabelValues("token_bucket").Inc()
			return rlqsAction(b.id, ttl, tokenBucket(want))
		}
	}
	// The same assignment again; the lease shrinks to the rate's need once
	// no earlier assignment can admit in a window.
	n := b.leaseN
	if b.leaseN > need(b.rate) && now.After(b.changed.Add(b.oldTTL+rlqsTransit+b.window)) {
		n = need(b.rate)
	}
	if ok, _ := r.lease(ctx, b, b.leaseID, n, leaseTTL); !ok {
		// Not extended (no decision): let Envoy fall back rather than
		// spend an assignment no lease covers.
		b.rate = 0
		return blanket(typev3.RateLimitStrategy_DENY_ALL, "deny_all")
	}
	b.leaseN, b.ttlSent = n, max(b.ttlSent, ttl)
	r.assignments.WithLabelValues("extended").Inc()
	return rlqsAction(b.id, ttl, tokenBucket(b.rate))
}

// lease takes (or, with an ID b holds, extends, grows or shrinks to n) a
// lease of n hits on b's key for ttl, stating b's demand, and reports
// whether the owner granted it and how many hits the lease holds (a new
// one may get less than n: the room, or b's fair share among the key's
// holders of every node). It keeps the fair share the owner reports in
// b.ownerRate.
func (r *rlqsService) lease(ctx context.Context, b *rlqsBucket, id actor.ReservationID, n int64, ttl time.Duration) (bool, int64) {
	demand := rlqsCapacity(b)
	if b.demandKnown {
		demand = b.demand // smoothed and measured: no margin
	}
	c := actor.Check{Key: b.key, Limit: b.limit, Window: b.window, Algorithm: actor.SlidingLog, Cost: n,
		Reservation: &actor.Reservation{ID: id, TTL: ttl, Lease: true, Holder: b.holder,
			Demand: max(1, int64(math.Ceil(demand*b.window.Seconds())))}}
	out := make([]actor.Decision, 1)
	ctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	if err := r.s.decide(ctx, []actor.Check{c}, out, nil, false); err != nil || out[0].Err != nil {
		return false, 0
	}
	// A share of s hits a window lets a holder leasing for ttl hold
	// s × (window + ttl) / window of the key; a rate r holds r(1 + F).
	b.ownerRate = 0
	if s := out[0].Share; s > 0 {
		fills := float64((b.window + rlqsFill - 1) / rlqsFill)
		b.ownerRate = float64(s) * (b.window + ttl).Seconds() / b.window.Seconds() / (1 + fills)
	}
	if !out[0].Allowed {
		return false, 0
	}
	g := out[0].Granted
	if g == 0 {
		g = n // an owner of an earlier version grants all or nothing, and says nothing
	}
	if g < n && id != b.leaseID {
		return true, g // a new lease: part of it is fine, the caller sizes the rate to it
	} else if g < n {
		// b's lease had ended (expired unrenewed) and a new one of the
		// same ID got only part: the assignment it was meant to cover is
		// not covered. Give it back; the bucket starts anew.
		r.settle(ctx, b, id)
		return false, 0
	}
	return true, n
}

// settle gives back lease id of b's key at cost 0 (it admits nothing).
func (r *rlqsService) settle(ctx context.Context, b *rlqsBucket, id actor.ReservationID) {
	c := actor.Check{Key: b.key, Limit: b.limit, Window: b.window, Algorithm: actor.SlidingLog,
		Reservation: &actor.Reservation{ID: id, Settle: true}}
	ctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	r.s.decide(ctx, []actor.Check{c}, make([]actor.Decision, 1), nil, false) //nolint:errcheck // unsettled, it expires at its estimate
}

// room returns the room b's key has now (a peek), and whether its owner
// answered.
func (r *rlqsService) room(ctx context.Context, b *rlqsBucket) (int64, bool) {
	c := actor.Check{Key: b.key, Limit: b.limit, Window: b.window, Algorithm: actor.SlidingLog}
	out := make([]actor.Decision, 1)
	ctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	if err := r.s.decide(ctx, []actor.Check{c}, out, nil, false); err != nil || out[0].Err != nil {
		return 0, false
	}
	return out[0].Remaining, true
}

// tokenBucket is the strategy of rate tokens a second, a second's worth
// of burst.
func tokenBucket(rate int64) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(rate, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(rate, math.MaxUint32))),
		FillInterval:  durationpb.New(rlqsFill),
	}}}
}

// rlqsAction is an assignment of strategy to bucket id for ttl.
func rlqsAction(id *rlqsv3.BucketId, ttl time.Duration, strategy *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    strategy,
		}},
	}
}

// expireAll sends every bucket of a stream a zero TTL, so that its Envoy
// falls back to its expired-assignment behaviour at once rather than
// spending an assignment this node no longer renews, and ends the stream.
func (r *rlqsService) expireAll(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer, buckets map[string]*rlqsBucket) error {
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, b := range buckets {
		r.assignments.WithLabelValues("expire").Inc()
		resp.BucketAction = append(resp.BucketAction, rlqsAction(b.id, 0, &typev3.RateLimitStrategy{
			Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}))
	}
	if len(resp.BucketAction) > 0 {
		stream.Send(resp) //nolint:errcheck // the stream ends either way
	}
	return status.Error(codes.Unavailable, "rlqs: the node is stopping")
}

// close ends every stream (expireAll).
func (r *rlqsService) close() { r.closeOnce.Do(func() { close(r.closing) }) }
