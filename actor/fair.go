package actor

import (
	"math"
	"slices"
)

// This file divides a key's room among the holders of its quota leases
// by max-min fair share over their demand (Reservation.Demand). Like
// state.go it is pure code: the key's actor is its only user.
//
// The owner remembers, in memory only, each holder that stated a demand
// within the last window: its demand and the hits leased to it over about
// a window (granted, less what its settles gave back). While the demands
// together fit the key's capacity, every holder leases as it asks. When
// they do not, each holder's share is its max-min fair share of the
// capacity (no holder gets more than it wants; what one does not want is
// divided equally among the others), and a lease is granted only up to
// the part of the share not leased yet. The capacity is the limit less
// what leasing costs: a slice's hits count from its grant until a window
// after its expiry, so a holder that leases r hits a window holds about
// r × (window + TTL) / window of the key's room.
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
	// cur and prev are the hits leased to it in the period of a window
	// starting at at, and in the one before.
	at        int64
	cur, prev int64
}

// advance moves h's periods on to the one that holds now.
func (h *holderShare) advance(now, window int64) {
	if now < h.at+window {
		return
	}
	if now < h.at+2*window {
		h.prev = h.cur
	} else {
		h.prev = 0
	}
	h.cur = 0
	h.at = now - (now-h.at)%window
}

// leased estimates the hits leased to h over the window before now: all
// of the current period, and the part of the previous one still inside
// the window.
func (h *holderShare) leased(now, window int64) int64 {
	h.advance(now, window)
	rest := 1 - float64(now-h.at)/float64(window)
	return satAdd(h.cur, int64(math.Ceil(float64(h.prev)*rest)))
}

// wait returns how long from now until h's leased estimate is at most
// target, with nothing more leased.
func (h *holderShare) wait(now, window, target int64) int64 {
	h.advance(now, window)
	room := target - h.cur
	if room < 0 {
		// Not before the next period; then only cur, fading, counts.
		next := h.at + window
		return next - now + fadeTime(h.cur, target, window)
	}
	start := h.at + fadeTime(h.prev, room, window)
	return max(start-now, 0)
}

// fadeTime is how far into a period a previous period's n hits weigh at
// most target (their weight falls linearly from 1 to 0 over the period).
func fadeTime(n, target, window int64) int64 {
	if n <= target {
		return 0
	}
	if target < 0 {
		target = 0
	}
	return int64(math.Ceil((1 - float64(target)/float64(n)) * float64(window)))
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
		sh = append(sh, holderShare{holder: r.Holder, at: now})
		i = len(sh) - 1
		s.res.shares = sh
	}
	sh[i].demand, sh[i].seen, sh[i].ttl = r.Demand, now, int64(r.TTL)
	if share = s.shareOf(i); share == 0 {
		return cost, 0, 0
	}
	left := share - sh[i].leased(now, s.window)
	if left <= 0 {
		// Until a useful part frees: the cost, or a tenth of the
		// share if less, so that a holder over its share is not
		// answered one hit a call.
		need := min(cost, max(1, share/10))
		return 0, share, max(sh[i].wait(now, s.window, share-need), 1)
	}
	return min(cost, left), share, 0
}

// shareOf returns the fair share of the holder at index i of s's shares,
// 0 when the demands fit the capacity and no share is in force.
func (s *state) shareOf(i int) int64 {
	sh := s.res.shares
	capacity := s.fairCapacity(sh[i].ttl)
	demands := make([]int64, len(sh))
	var total int64
	for k := range sh {
		demands[k] = sh[k].demand
		total = satAdd(total, sh[k].demand)
	}
	if total <= capacity {
		return 0
	}
	return max(1, maxMinShare(capacity, demands, i))
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

// noteLeased adds n hits (negative: given back) to what holder was
// leased, if it stated a demand.
func (s *state) noteLeased(now int64, holder string, n int64) {
	if s.res == nil || holder == "" {
		return
	}
	i := slices.IndexFunc(s.res.shares, func(h holderShare) bool { return h.holder == holder })
	if i < 0 {
		return
	}
	h := &s.res.shares[i]
	h.advance(now, s.window)
	if n >= 0 {
		h.cur = satAdd(h.cur, n)
		return
	}
	back := -n
	take := min(back, h.cur)
	h.cur -= take
	h.prev = max(0, h.prev-(back-take))
}
