package api

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/actor"
)

// A node that does not own a key of a lease rule (limits file, lease:
// true) decides its hits from quota leases: slices of the key's room that
// the owner counts as spent at once (actor.Reservation.Lease) and that
// this node spends on its own, rather than forwarding every hit. A slice
// is asked for in the background once the one held is spent or its time
// is up; until it arrives, hits are forwarded as usual. Near the limit the
// owner grants none, and every hit goes to it. docs/envoy.md, "Hot keys:
// quota leases", has the argument for exactness; client.Lease is the same
// holder in the Go client.

// Defaults of a node's slices.
const (
	// leaseSliceFraction: a slice asks for a tenth of the limit.
	leaseSliceFraction = 10
	// leaseTTLFraction: a slice lasts a tenth of the window, from
	// leaseMinTTL to leaseMaxTTL.
	leaseTTLFraction = 10
	leaseMinTTL      = 10 * time.Millisecond
	leaseMaxTTL      = 5 * time.Second
	// leaseClockMargin: the node spends a slice until send + TTL × 10/11,
	// so that a clock up to 10% slow against the owner's stops in time.
	leaseClockMargin = 11
	// maxLeaseHolders bounds the keys a node holds slices of; past it,
	// new keys are forwarded as without leases.
	maxLeaseHolders = 10_000
	// leaseCallTimeout bounds a call that asks for or settles a slice.
	leaseCallTimeout = 2 * time.Second
)

// nodeLeases are the slices a node holds, by key.
type nodeLeases struct {
	s       *Server
	mu      sync.Mutex
	holders map[string]*leaseHolder
	// slices counts slices by result (granted, denied, failed); local
	// the hits decided from them.
	slices *prometheus.CounterVec
	local  prometheus.Counter
	// wg tracks the calls in the background.
	wg sync.WaitGroup
}

func newNodeLeases(s *Server, reg prometheus.Registerer) *nodeLeases {
	l := &nodeLeases{
		s:       s,
		holders: make(map[string]*leaseHolder),
		slices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_lease_slices_total",
			Help: "Quota lease slices this node asked for, for keys of lease rules it does not own, by result (granted; denied: no room; failed: not decided).",
		}, []string{"result"}),
		local: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_lease_local_decisions_total",
			Help: "Hits this node allowed from quota lease slices it holds, without asking the key's owner.",
		}),
	}
	reg.MustRegister(l.slices, l.local)
	return l
}

// leaseHolder holds the slices of one key.
type leaseHolder struct {
	key    string
	limit  int64
	window time.Duration
	algo   actor.Algorithm
	slice  int64
	ttl    time.Duration

	mu       sync.Mutex
	cur      *nodeSlice
	renewing bool
	retryAt  time.Time
	room     int64 // the key's room as the owner last reported it; -1 unknown
}

// nodeSlice is a granted slice.
type nodeSlice struct {
	id      actor.ReservationID
	n, used int64
	until   time.Time
}

// spend decides c from a slice of its key if this node holds one with
// room for c.Cost, and reports whether it did (d is then the decision).
// Otherwise it starts asking for a slice in the background, and c goes to
// the owner as usual. Only plain checks of a cost above 0 are spent.
func (l *nodeLeases) spend(c *actor.Check, d *actor.Decision) bool {
	if c.Cost <= 0 || c.Refund || c.Usage || c.Penalty || c.Reservation != nil || c.Algorithm == actor.SlidingWindow {
		return false
	}
	if owner, _ := l.s.cluster.Owner(c.Key); owner == l.s.cfg.NodeName {
		return false // deciding it here costs no more than a slice
	}
	h := l.holder(c)
	if h == nil {
		return false
	}
	now := l.s.clock.Now()
	h.mu.Lock()
	if s := h.cur; s != nil {
		if s.n-s.used >= c.Cost && now.Before(s.until) {
			s.used += c.Cost
			*d = actor.Decision{Allowed: true, Limit: h.limit, Remaining: s.n - s.used}
			h.mu.Unlock()
			l.local.Inc()
			return true
		}
		h.cur = nil
		l.settle(h, s)
	}
	if !h.renewing && !now.Before(h.retryAt) {
		h.renewing = true
		want := h.slice
		if h.room >= 0 {
			want = max(1, min(want, h.room/2))
		}
		l.wg.Add(1)
		go l.take(h, want)
	}
	h.mu.Unlock()
	return false
}

// holder returns the holder of c's key, made on first use; nil when the
// node holds slices of maxLeaseHolders keys already.
func (l *nodeLeases) holder(c *actor.Check) *leaseHolder {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.holders[c.Key]; h != nil && h.limit == c.Limit && h.window == c.Window && h.algo == c.Algorithm {
		return h
	}
	if len(l.holders) >= maxLeaseHolders {
		return nil
	}
	h := &leaseHolder{
		key: c.Key, limit: c.Limit, window: c.Window, algo: c.Algorithm, room: -1,
		slice: max(1, c.Limit/leaseSliceFraction),
		ttl:   min(max(c.Window/leaseTTLFraction, leaseMinTTL), leaseMaxTTL),
	}
	l.holders[c.Key] = h // a changed rule replaces the holder; its slice expires
	return h
}

// take asks the key's owner for a slice of want hits.
func (l *nodeLeases) take(h *leaseHolder, want int64) {
	defer l.wg.Done()
	c := actor.Check{Key: h.key, Limit: h.limit, Window: h.window, Algorithm: h.algo, Cost: want,
		Reservation: &actor.Reservation{TTL: h.ttl, Lease: true, Holder: l.s.cfg.NodeName}}
	rand.Read(c.Reservation.ID[:])
	ctx, cancel := context.WithTimeout(context.Background(), leaseCallTimeout)
	defer cancel()
	sent := l.s.clock.Now()
	out := make([]actor.Decision, 1)
	err := l.s.decide(ctx, []actor.Check{c}, out, nil, false)
	if err == nil {
		err = out[0].Err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.renewing = false
	switch {
	case err != nil:
		l.slices.WithLabelValues("failed").Inc()
		h.retryAt = l.s.clock.Now().Add(h.ttl)
	case !out[0].Allowed:
		l.slices.WithLabelValues("denied").Inc()
		h.room = out[0].Remaining
		h.retryAt = l.s.clock.Now().Add(h.ttl)
	default:
		l.slices.WithLabelValues("granted").Inc()
		h.room = out[0].Remaining
		s := &nodeSlice{id: c.Reservation.ID, n: want, until: sent.Add(h.ttl * (leaseClockMargin - 1) / leaseClockMargin)}
		if !l.s.clock.Now().Before(s.until) {
			// Back too late to spend: forward for a TTL.
			l.settle(h, s)
			h.retryAt = l.s.clock.Now().Add(h.ttl)
			return
		}
		h.cur = s
	}
}

// settle gives back in the background what s did not spend, unless it
// was spent whole. h.mu is held.
func (l *nodeLeases) settle(h *leaseHolder, s *nodeSlice) {
	if s.used == s.n {
		return
	}
	c := actor.Check{Key: h.key, Limit: h.limit, Window: h.window, Algorithm: h.algo, Cost: s.used,
		Reservation: &actor.Reservation{ID: s.id, Settle: true}}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), leaseCallTimeout)
		defer cancel()
		// A settle that fails leaves the slice to expire at its estimate.
		l.s.decide(ctx, []actor.Check{c}, make([]actor.Decision, 1), nil, false) //nolint:errcheck
	}()
}

// CloseLeases stops asking for quota lease slices, settles those held if
// settle (a graceful shutdown: their unspent hits go back; otherwise they
// expire at their estimate), and waits, within ctx, for the calls in the
// background.
// It also ends the RLQS streams, each bucket sent a zero TTL first.
func (s *Server) CloseLeases(ctx context.Context, settle bool) {
	s.rlqs.close()
	s.leases.close(ctx, settle)
}

func (l *nodeLeases) close(ctx context.Context, settle bool) {
	l.mu.Lock()
	for _, h := range l.holders {
		h.mu.Lock()
		h.retryAt = time.Unix(1<<40, 0) // no more slices
		if s := h.cur; s != nil {
			h.cur = nil
			if settle {
				l.settle(h, s)
			}
		}
		h.mu.Unlock()
	}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// hotKeys are the keys Config.LeaseHotKeys leases: those the node's
// traffic counts show hot. Read on every Envoy check, refreshed by the
// first check a second after the last refresh.
type hotKeys struct {
	set        atomic.Pointer[hotSet]
	refreshing atomic.Bool
}

type hotSet struct {
	at   time.Time
	keys map[string]bool
}

// hotKeysTop is how many of the node's top keys are looked at.
const hotKeysTop = 64

// leaseHot reports whether key is one of the node's hot keys, when
// Config.LeaseHotKeys is set.
func (s *Server) leaseHot(key string) bool {
	if s.cfg.LeaseHotKeys <= 0 || s.traffic == nil {
		return false
	}
	now := s.clock.Now()
	hs := s.hot.set.Load()
	if (hs == nil || now.Sub(hs.at) >= time.Second || now.Before(hs.at)) && s.hot.refreshing.CompareAndSwap(false, true) {
		snap := s.traffic.Snapshot(now, hotKeysTop, 0)
		next := &hotSet{at: now, keys: make(map[string]bool)}
		if secs := snap.Window.Seconds(); secs > 0 {
			for _, e := range snap.Decisions.Entries {
				// The lower bound of its count: a key is leased only
				// when it surely is this hot.
				if float64(e.Count-e.Err)/secs >= s.cfg.LeaseHotKeys {
					next.keys[e.Key] = true
				}
			}
		}
		s.hot.set.Store(next)
		s.hot.refreshing.Store(false)
		hs = next
	}
	return hs != nil && hs.keys[key]
}

// decideLeased is decide for checks of which lease marks those of lease
// rules: those a slice this node holds covers are decided here, the rest
// by their owners.
func (s *Server) decideLeased(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, lease []bool) error {
	if nodes == nil {
		nodes = make([]string, len(checks))
	}
	var rest []int
	for i := range checks {
		if lease[i] && s.leases.spend(&checks[i], &out[i]) {
			nodes[i] = s.cfg.NodeName
			continue
		}
		rest = append(rest, i)
	}
	switch len(rest) {
	case 0:
		return nil
	case len(checks):
		return s.decide(ctx, checks, out, nodes, false)
	}
	sub := make([]actor.Check, len(rest))
	for j, i := range rest {
		sub[j] = checks[i]
	}
	subOut, subNodes := make([]actor.Decision, len(rest)), make([]string, len(rest))
	if err := s.decide(ctx, sub, subOut, subNodes, false); err != nil {
		var ice *actor.InvalidCheckError
		if errors.As(err, &ice) {
			ice.Index = rest[ice.Index]
		}
		return err
	}
	for j, i := range rest {
		out[i], nodes[i] = subOut[j], subNodes[j]
	}
	return nil
}
