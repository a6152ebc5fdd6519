package actor

import (
	"slices"
)

// This file divides a key's room among the holders of its quota leases
// by max-min fair share over their demand (Reservation.Demand). Like
// state.go it is pure code: the key's actor is its only user.
//
// The owner remembers, in memory only, each holder that stated a demand
// within the last window: its demand and the hits leased to it that the
// key still counts (granted, less what its settles gave back). While the
// demands together fit the key's capacity, or one holder alone stated
// one, every holder leases as it asks. Otherwise each holder's share is
// its max-min fair share of the capacity (no holder gets more than it
// wants; what one does not want is divided equally among the others), and
// a lease is granted only up to what that share lets the holder hold of
// the key's count. The capacity is the limit less what leasing costs: a
// slice's hits count from its grant until a window after its expiry, so a
// holder that leases r hits a window holds about r × (window + TTL) /
// window of the key's room.
//
// Fair shares only ever grant less than the room allows, never more, so
// they change nothing about exactness; and a node that takes a key over
// (after a failover) starts without demands and learns them from the
// next requests.

// holderShare is what a key's owner knows of one holder's demand.
type holderShare struct {
	holder string
	// demand is the holder's latest word, hits a window.
	demand int64
	// seen is when it last asked, unix ns; ttl the TTL it asked for.
	seen, ttl int64
	// leases are the hits leased to it that the key still counts, by
	// expiry (a lease's hits count until a window after it), oldest
	// first, less what it gave back.
	leases []leaseRun
}

// leaseRun is n hits leased to a holder that expire at at.
type leaseRun struct{ at, n int64 }

// maxLeaseRuns bounds a holder's leaseRuns: past it, the two oldest
// merge at the later expiry, which only counts them longer.
const maxLeaseRuns = 32

// held returns the hits leased to h that the key counts at now.
func (h *holderShare) held(now, window int64) int64 {
	h.leases = slices.DeleteFunc(h.leases, func(r leaseRun) bool { return r.at+window <= now })
	var n int64
	for _, r := range h.leases {
		n = satAdd(n, r.n)
	}
	return n
}

// add records n hits leased to h until at.
func (h *holderShare) add(at, n int64) {
	i := len(h.leases)
	for i > 0 && h.leases[i-1].at > at {
		i--
	}
	h.leases = slices.Insert(h.leases, i, leaseRun{at, n})
	if len(h.leases) > maxLeaseRuns {
		h.leases[1].n = satAdd(h.leases[1].n, h.leases[0].n)
		h.leases = slices.Delete(h.leases, 0, 1)
	}
}

// giveBack takes n hits leased until at off h's count: from that run,
// then from the newest.
func (h *holderShare) giveBack(at, n int64) {
	if i := slices.IndexFunc(h.leases, func(r leaseRun) bool { return r.at == at }); i >= 0 {
		take := min(n, h.leases[i].n)
		h.leases[i].n -= take
		n -= take
	}
	for i := len(h.leases) - 1; i >= 0 && n > 0; i-- {
		take := min(n, h.leases[i].n)
		h.leases[i].n -= take
		n -= take
	}
	h.leases = slices.DeleteFunc(h.leases, func(r leaseRun) bool { return r.n <= 0 })
}

// wait returns how long from now until h holds at most target, with
// nothing more leased.
func (h *holderShare) wait(now, window, target int64) int64 {
	n := h.held(now, window)
	for _, r := range h.leases {
		if n <= target {
			break
		}
		n -= r.n
		if n <= target {
			return max(r.at+window-now, 0)
		}
	}
	return 0
}

// maxMinShare returns the max-min fair share of capacity for the demand
// at index i of demands: the water level L with sum(min(d, L)) =
// capacity, capped at demands[i].
func maxMinShare(capacity int64, demands []int64, i int) int64 {
	sorted := slices.Clone(demands)
	slices.Sort(sorted)
	rem := capacity
	for k, d := range sorted {
		if level := rem / int64(len(sorted)-k); d > level {
			return min(demands[i], level)
		}
		rem -= d
	}
	return demands[i]
}

// fairGrant records the demand of r's holder at now and returns how many
// of cost hits it may lease now (0: none until wait has passed), the
// share it was measured against (0 when the demands fit and none is in
// force), and the wait.
func (s *state) fairGrant(now int64, r *Reservation, cost int64) (grant, share, wait int64) {
	if s.res == nil {
		s.res = &openReservations{}
	}
	s.pruneShares(now)
	sh := s.res.shares
	i := slices.IndexFunc(sh, func(h holderShare) bool { return h.holder == r.Holder })
	if i < 0 {
		if len(sh) >= MaxReservations {
			return cost, 0, 0 // a bound on memory: the holder leases as without a demand
		}
		sh = append(sh, holderShare{holder: r.Holder})
		i = len(sh) - 1
		s.res.shares = sh
	}
	sh[i].demand, sh[i].seen, sh[i].ttl = r.Demand, now, int64(r.TTL)
	if share = s.shareOf(i); share == 0 {
		return cost, 0, 0
	}
	// What the share lets it hold: a share of r a window leased in
	// slices of this TTL holds r × (window + ttl) / window of the count.
	may := s.fairHold(share, sh[i].ttl)
	left := may - sh[i].held(now, s.window)
	if left <= 0 {
		// Until a useful part frees: the cost, or a tenth of the
		// share if less, so that a holder over its share is not
		// answered one hit a call.
		need := min(cost, max(1, share/10))
		return 0, share, max(sh[i].wait(now, s.window, may-need), 1)
	}
	return min(cost, left), share, 0
}

// shareOf returns the fair share of the holder at index i of s's shares,
// 0 when no share is in force: the demands fit the capacity, or one
// holder alone stated one.
func (s *state) shareOf(i int) int64 {
	sh := s.res.shares
	capacity := s.fairCapacity(sh[i].ttl)
	demands := make([]int64, len(sh))
	var total int64
	for k := range sh {
		demands[k] = sh[k].demand
		total = satAdd(total, sh[k].demand)
	}
	if total <= capacity || len(sh) < 2 {
		return 0 // no share in force: the demands fit, or one holder alone
	}
	return max(1, maxMinShare(capacity, demands, i))
}

// fairHold is what a holder of share hits a window, leasing slices of
// ttl, may hold of the key's count.
func (s *state) fairHold(share, ttl int64) int64 {
	return int64(float64(share) * (float64(s.window) + float64(max(ttl, 0))) / float64(s.window))
}

// fairCapacity is the hits a window that leases of ttl can give out
// without holding more than the limit: limit × window / (window + ttl).
func (s *state) fairCapacity(ttl int64) int64 {
	return max(1, int64(float64(s.limit)*float64(s.window)/(float64(s.window)+float64(max(ttl, 0)))))
}

// pruneShares forgets the holders not heard from for a window.
func (s *state) pruneShares(now int64) {
	if s.res == nil || len(s.res.shares) == 0 {
		return
	}
	s.res.shares = slices.DeleteFunc(s.res.shares, func(h holderShare) bool { return h.seen <= now-s.window })
}

// noteLeased records n hits leased to holder until at, or given back
// (n negative), if the holder stated a demand.
func (s *state) noteLeased(now int64, holder string, at, n int64) {
	if s.res == nil || holder == "" {
		return
	}
	i := slices.IndexFunc(s.res.shares, func(h holderShare) bool { return h.holder == holder })
	if i < 0 {
		return
	}
	if h := &s.res.shares[i]; n >= 0 {
		h.add(at, n)
	} else {
		h.giveBack(at, -n)
	}
}
