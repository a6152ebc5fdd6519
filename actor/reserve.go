package actor

import (
	"encoding/binary"
	"math"
	"slices"
	"time"
)

// This file holds what a key remembers of its reservations (see
// Reservation), and the usage rules shared by usage reports and the
// overshoot of a settle. Like state.go it is pure code: the key's actor is
// its only user.
//
// A reservation is recorded as ordinary hits (the estimate, where decide
// put them: mark) plus a record here. The record changes no decision: it
// only lets a settle give back exactly those hits, once, and keeps the key
// alive (its deadline) until the reservation expires. Expiring settles at
// the estimate, so it is just forgetting the record: no timer, no write;
// expired records are dropped by the next decision on the key, and a key
// whose hits and reservations have all expired is empty, and leaves memory
// and disk on its alarm like any other.

// reservation is one open reservation of a key.
type reservation struct {
	id ReservationID
	// mark is where its hits went (state.mark at the reserve): the run's
	// time, the bucket's start, or 0 for a token bucket.
	mark int64
	// n is the estimate: the hits it recorded. Positive.
	n int64
	// expires is when it is settled at its estimate, unix ns.
	expires int64
	// holder is Reservation.Holder, in memory only ("" once read from
	// disk or a copy).
	holder string
	// lease: a quota lease (in memory only, as holder).
	lease bool
}

// openReservations are a key's open reservations, in the order they were
// made. A state points to them only while it holds one (or remembers a
// holder's demand), so that a key without reservations pays one nil
// pointer.
type openReservations struct {
	list []reservation
	// denied counts the checks denied while the key held an open lease
	// (in memory only): the price of exactness KeyState shows.
	denied int64
	// shares are the holders that stated a demand within the last window
	// (in memory only; see fair.go). They keep the record alive while
	// the key holds no reservation.
	shares []holderShare
}

// empty reports whether r holds neither reservations nor shares.
func (r *openReservations) empty() bool { return len(r.list) == 0 && len(r.shares) == 0 }

// find returns the index of the reservation id, or -1.
func (r *openReservations) find(id ReservationID) int {
	for i := range r.list {
		if r.list[i].id == id {
			return i
		}
	}
	return -1
}

// latest returns the latest expiry, 0 if none.
func (r *openReservations) latest() int64 {
	var dl int64
	for i := range r.list {
		dl = max(dl, r.list[i].expires)
	}
	return dl
}

// live reports whether a reservation is still open at now.
func (r *openReservations) live(now int64) bool {
	for i := range r.list {
		if r.list[i].expires > now {
			return true
		}
	}
	return false
}

// pruneReservations forgets the reservations expired at now (settled at
// their estimate). It is not a change to persist: an expired record in the
// store is dropped when read.
func (s *state) pruneReservations(now int64) {
	if s.res == nil {
		return
	}
	s.res.list = slices.DeleteFunc(s.res.list, func(r reservation) bool { return r.expires <= now })
	s.pruneShares(now)
	if s.res.empty() {
		s.res = nil
	}
}

// holdsReservation reports whether s holds reservation id.
func (s *state) holdsReservation(id ReservationID) bool {
	return s.res != nil && s.res.find(id) >= 0
}

// leaseOpen reports whether s holds an open quota lease (as far as this
// node knows: see reservation.lease).
func (s *state) leaseOpen() bool {
	if s.res == nil {
		return false
	}
	for i := range s.res.list {
		if s.res.list[i].lease {
			return true
		}
	}
	return false
}

// addReservation records reservation r of n hits put at mark.
func (s *state) addReservation(r *Reservation, mark, n, expires int64) {
	if s.res == nil {
		s.res = &openReservations{}
	}
	s.res.list = append(s.res.list, reservation{id: r.ID, mark: mark, n: n, expires: expires, holder: r.Holder, lease: r.Lease})
	s.rewrite = true // a tail carries hits only
}

// takeReservation removes reservation id and returns it.
func (s *state) takeReservation(id ReservationID) (reservation, bool) {
	if s.res == nil {
		return reservation{}, false
	}
	i := s.res.find(id)
	if i < 0 {
		return reservation{}, false
	}
	r := s.res.list[i]
	s.res.list = slices.Delete(s.res.list, i, i+1)
	if s.res.empty() {
		s.res = nil
	}
	s.rewrite = true
	return r, true
}

// reservedLive returns the hits of the reservations whose hits may still
// be in the sliding log at now: those a settle could give back.
func (s *state) reservedLive(now int64) int64 {
	if s.res == nil {
		return 0
	}
	var n int64
	for i := range s.res.list {
		if r := &s.res.list[i]; r.expires > now && !s.expired(r.mark, now) {
			n = satAdd(n, r.n)
		}
	}
	return n
}

// logKeep is how many of its newest hits a sliding log keeps when a
// penalty or a usage report takes it past its limit: limit+1, plus the
// hits of its open reservations. A decision (cost c >= 0: used + c <=
// limit) depends only on the newest limit+1 hits, so dropping older ones
// changes no decision, remaining, retryAfter or resetAfter; and a settle
// gives back at most the reserved hits, after which the newest limit+1
// hits are still among those kept. Refunds (the newest hits) may reach
// hits that were dropped: they are forgotten, as with penalties.
func (s *state) logKeep(now int64) int64 {
	return satAdd(satAdd(s.limit, 1), s.reservedLive(now))
}

// logUsage records n hits of usage at now, whatever the limit, then keeps
// the newest logKeep of them.
func (s *state) logUsage(now, n int64, maxRuns int) {
	s.logAdd(now, n, maxRuns)
	if keep := s.logKeep(now); s.cur > keep {
		s.logTrim(keep)
	}
}

// bucketUsage takes n tokens of usage from the bucket, which may go into
// debt down to -limit (one window of refill), and reports whether the
// tokens changed. The bucket must be refilled to now.
func (s *state) bucketUsage(n int64) bool {
	t := max(s.tokens-float64(n), -float64(s.limit))
	if t == s.tokens {
		return false
	}
	s.tokens = t
	return true
}

// recordUsage records n hits of usage at now in any algorithm: the
// overshoot of a settle.
func (s *state) recordUsage(now, n int64, maxRuns int) {
	switch s.algo {
	case SlidingLog:
		s.logPrune(now)
		s.logUsage(now, n, maxRuns)
	case SlidingWindow:
		s.windowAdvance(now)
		s.cur = satAdd(s.cur, n)
	case TokenBucket:
		s.bucketRefill(now)
		s.bucketUsage(n)
	}
}

// reserveHeld decides a reserving check that records nothing: its ID is
// held already (a retry: allowed), or the key holds MaxReservations
// (denied until the first expires). The numbers are a peek's.
func (s *state) reserveHeld(now int64, c *Check, maxRuns int, d *Decision) {
	p := Check{Key: c.Key, Limit: c.Limit, Window: c.Window, Algorithm: c.Algorithm}
	s.algoDecide(now, &p, maxRuns, d)
	if s.holdsReservation(c.Reservation.ID) {
		d.Allowed, d.RetryAfter = true, 0
		return
	}
	first := int64(math.MaxInt64)
	for i := range s.res.list {
		first = min(first, s.res.list[i].expires)
	}
	d.Allowed, d.RetryAfter = false, time.Duration(max(first-now, 0))
}

// settle settles reservation c.Reservation.ID at c.Cost (see Reservation)
// and reports whether it was held.
func (s *state) settle(now int64, c *Check, maxRuns int, d *Decision) bool {
	if !s.valid() {
		return false
	}
	s.pruneReservations(now)
	r, held := s.takeReservation(c.Reservation.ID)
	if held {
		switch {
		case c.Cost < r.n:
			s.release(r.mark, r.n-c.Cost)
			if r.lease {
				s.noteLeased(now, r.holder, r.expires, c.Cost-r.n)
			}
		case c.Cost > r.n:
			s.recordUsage(now, c.Cost-r.n, maxRuns)
		}
		if s.lineage == 0 {
			s.lineage = newLineage()
		}
	}
	// The key as it is now: a usage peek (allowed below the limit).
	p := Check{Key: c.Key, Limit: s.limit, Window: time.Duration(s.window), Algorithm: s.algo, Usage: true}
	s.algoDecide(now, &p, maxRuns, d)
	d.Allowed = held
	return held
}

// needsUsageVersion reports whether s can only be encoded in version 4:
// it holds reservations, or a token bucket in debt.
func (s *state) needsUsageVersion() bool {
	return s.res != nil && len(s.res.list) > 0 || s.tokens < 0
}

// appendReservations appends the reservations of a version 4 segment:
// uvarint count, then each: 16 bytes ID, varint mark, uvarint n, varint
// expires.
func (s *state) appendReservations(b []byte) []byte {
	if s.res == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(s.res.list)))
	for _, r := range s.res.list {
		b = append(b, r.id[:]...)
		b = binary.AppendVarint(b, r.mark)
		b = binary.AppendUvarint(b, uint64(r.n))
		b = binary.AppendVarint(b, r.expires)
	}
	return b
}

// decodeReservations reads what appendReservations wrote into t.
func (t *state) decodeReservations(d *decoder) {
	count := d.uvarint("reservations")
	switch {
	case d.err != nil:
		return
	case count > MaxReservations:
		d.fail("%d reservations; at most %d", count, MaxReservations)
		return
	case count > int64(len(d.b)/19): // 16 + at least 1 + 1 + 1 bytes each
		d.fail("%d reservations in %d bytes", count, len(d.b))
		return
	case count == 0:
		return
	}
	res := &openReservations{list: make([]reservation, 0, count)}
	for i := range count {
		var r reservation
		if len(d.b) < len(r.id) {
			d.fail("reservation %d: id: truncated", i)
			return
		}
		copy(r.id[:], d.b)
		d.b = d.b[len(r.id):]
		r.mark = d.varint("reservation mark")
		r.n = d.uvarint("reservation estimate")
		r.expires = d.varint("reservation expiry")
		switch {
		case d.err != nil:
			return
		case r.id == ReservationID{}:
			d.fail("reservation %d: id is zero", i)
			return
		case r.n <= 0:
			d.fail("reservation %d: estimate %d is not positive", i, r.n)
			return
		case res.find(r.id) >= 0:
			d.fail("reservation %d: id repeated", i)
			return
		}
		res.list = append(res.list, r)
	}
	t.res = res
}

// unionReservations returns the reservations of s and o that are open at
// now, each ID once (s's record if both hold it), for merge. Copies of
// one history hold the same records; a record only one side holds was made
// after the other's copy, or settled on the other: merge keeps it, so a
// holder whose settle was lost with a node can still settle (and one that
// settled on the lost node could settle again: see docs/engine.md).
func unionReservations(now int64, s, o *state) *openReservations {
	var out []reservation
	for _, x := range [2]*state{s, o} {
		if x.res == nil {
			continue
		}
		for _, r := range x.res.list {
			if r.expires <= now || len(out) >= MaxReservations || slices.ContainsFunc(out, func(q reservation) bool { return q.id == r.id }) {
				continue
			}
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return &openReservations{list: out}
}
