package api

import (
	"context"
	"crypto/rand"
	"errors"
	"math"
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
// is asked for once the one held is spent or its time is up; the hits
// that arrive meanwhile wait for its answer (about what forwarding them
// would take), and are forwarded as usual only if no slice came (a failed
// call: then for a TTL). The request states
// the node's demand (the key's hits asked of it over about a window), and
// the owner grants it up to the key's room and the node's max-min fair
// share among the key's holders (actor/fair.go). When it grants none, the
// node denies the key's hits itself until the owner's RetryAfter, at most
// a TTL. docs/envoy.md, "Hot keys: quota leases", has the argument for
// exactness; client.Lease is the same holder in the Go client.

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
	// deniedHere counts the hits denied without asking the owner.
	deniedHere prometheus.Counter
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
		deniedHere: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_lease_denied_here_total",
			Help: "Hits of leased keys this node denied without asking the key's owner, after the owner denied it a slice (no room, or the node at its fair share).",
		}),
	}
	reg.MustRegister(l.slices, l.local, l.deniedHere)
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
	renewing chan struct{} // closed when the slice being asked for is answered
	retryAt  time.Time
	// deniedUntil: the owner said there is no room for this node (the
	// key at its limit, or the node at its fair share): hits are denied
	// here until then.
	deniedUntil time.Time
	// The hits asked of this node, in the period of a window from at and
	// the one before, since born: the demand it states.
	born, at         time.Time
	asked, askedPrev int64
}

// nodeSlice is a granted slice.
type nodeSlice struct {
	id      actor.ReservationID
	n, used int64
	until   time.Time
}

// spend decides c from a slice of its key if this node holds one with
// room for c.Cost, and reports whether it did (d is then the decision).
// Otherwise it asks for a slice and waits for the answer (within ctx),
// or for the one being asked for, and tries again; c goes to the owner as
// usual when no slice came. While the owner has denied this node a slice
// (no room for it), c is denied here. Only plain checks of a cost above 0
// are spent.
func (l *nodeLeases) spend(ctx context.Context, c *actor.Check, d *actor.Decision) bool {
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
	h.mu.Lock()
	h.ask(l.s.clock.Now(), c.Cost)
	for attempt := 0; ; attempt++ {
		if done, wait := l.spendOnce(h, c, d); done {
			h.mu.Unlock()
			return true
		} else if wait == nil || attempt > 0 {
			h.mu.Unlock()
			return false
		} else {
			// Waiting for the slice costs about what forwarding would,
			// and keeps this node's hits within its fair share: a hit
			// forwarded meanwhile would be a plain check, outside it.
			h.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return false
			}
			h.mu.Lock()
		}
	}
}

// spendOnce is one try of spend, h.mu held: it reports whether it decided
// c, and otherwise the answer to wait for, if a slice is being asked for.
func (l *nodeLeases) spendOnce(h *leaseHolder, c *actor.Check, d *actor.Decision) (bool, chan struct{}) {
	now := l.s.clock.Now()
	if s := h.cur; s != nil {
		if s.n-s.used >= c.Cost && now.Before(s.until) {
			s.used += c.Cost
			*d = actor.Decision{Allowed: true, Limit: h.limit, Remaining: s.n - s.used}
			l.local.Inc()
			return true, nil
		}
		h.cur = nil
		l.settle(h, s)
	}
	if now.Before(h.deniedUntil) {
		*d = actor.Decision{Limit: h.limit, RetryAfter: h.deniedUntil.Sub(now)}
		l.deniedHere.Inc()
		return true, nil
	}
	if h.renewing == nil && !now.Before(h.retryAt) {
		h.renewing = make(chan struct{})
		want := h.slice
		demand := h.demand(now)
		if now.Sub(h.born) >= h.window {
			// Sized by demand once a window of it is known.
			want = max(1, min(want, demand*int64(h.ttl)/int64(h.window)+1))
		}
		l.wg.Add(1)
		go l.take(h, want, demand)
	}
	return false, h.renewing
}

// ask counts n hits asked of this node at now. h.mu is held.
func (h *leaseHolder) ask(now time.Time, n int64) {
	if el := now.Sub(h.at); el >= h.window || el < 0 {
		if el < 2*h.window && el >= 0 {
			h.askedPrev = h.asked
		} else {
			h.askedPrev = 0
		}
		h.asked = 0
		if el >= 0 {
			h.at = h.at.Add(el - el%h.window)
		} else {
			h.at = now // the clock went back
		}
	}
	h.asked += n
}

// demand returns the hits a window this node wants of the key, as it
// tells the owner for fair shares: those asked of it over about the last
// window (over the first window, its rate so far), and a quarter more,
// for slices that expire partly spent. h.mu is held.
func (h *leaseHolder) demand(now time.Time) int64 {
	h.ask(now, 0)
	w := float64(h.window)
	var est float64
	if age := now.Sub(h.born); age < h.window {
		est = float64(h.asked) * w / float64(max(age, h.ttl))
	} else {
		est = float64(h.asked) + float64(h.askedPrev)*(1-float64(now.Sub(h.at))/w)
	}
	return max(1, int64(min(est*5/4, float64(math.MaxInt64/2)))+1)
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
	now := l.s.clock.Now()
	h := &leaseHolder{
		key: c.Key, limit: c.Limit, window: c.Window, algo: c.Algorithm, born: now, at: now,
		slice: max(1, c.Limit/leaseSliceFraction),
		ttl:   min(max(c.Window/leaseTTLFraction, leaseMinTTL), leaseMaxTTL),
	}
	l.holders[c.Key] = h // a changed rule replaces the holder; its slice expires
	return h
}

// take asks the key's owner for a slice of want hits, stating demand.
func (l *nodeLeases) take(h *leaseHolder, want, demand int64) {
	defer l.wg.Done()
	c := actor.Check{Key: h.key, Limit: h.limit, Window: h.window, Algorithm: h.algo, Cost: want,
		Reservation: &actor.Reservation{TTL: h.ttl, Lease: true, Holder: l.s.cfg.NodeName, Demand: demand}}
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
	close(h.renewing)
	h.renewing = nil
	switch {
	case err != nil:
		l.slices.WithLabelValues("failed").Inc()
		h.retryAt = l.s.clock.Now().Add(h.ttl)
	case !out[0].Allowed:
		// No room for this node: the key is at its limit, or the node
		// has its fair share while the rest is held for other holders.
		// Its hits are denied here until the owner's RetryAfter, at most
		// a TTL (forwarding each would take the room as it frees, first
		// come first served, past the other holders' shares).
		l.slices.WithLabelValues("denied").Inc()
		h.deniedUntil = l.s.clock.Now().Add(min(max(out[0].RetryAfter, time.Millisecond), h.ttl))
		h.retryAt = h.deniedUntil
	default:
		l.slices.WithLabelValues("granted").Inc()
		if g := out[0].Granted; g > 0 && g < want {
			want = g
		}
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
		if lease[i] && s.leases.spend(ctx, &checks[i], &out[i]) {
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
