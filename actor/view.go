package actor

import (
	"slices"
	"time"
)

// KeyState is the live state of one key, for operators.
type KeyState struct {
	Key string
	// Found is false when the key holds nothing, in memory or on disk.
	Found bool
	// InMemory is false when the state was read from disk only.
	InMemory  bool
	Algorithm Algorithm
	Limit     int64
	Window    time.Duration
	// Runs is the sliding log, oldest first.
	Runs []Run
	// BucketStart, Previous and Current are the sliding window's buckets.
	BucketStart       time.Time
	Previous, Current int64
	// Tokens were available at Updated (token bucket).
	Tokens  float64
	Updated time.Time
	// Used and Remaining count hits now; RetryAfter is the wait for a cost-1
	// hit; ResetAfter the wait until the whole limit is back.
	Used, Remaining        int64
	RetryAfter, ResetAfter time.Duration
	// ExpiresAt is when the key leaves memory and disk if nothing arrives.
	ExpiresAt time.Time
	// Lineage names the history of the state: copies of it (on a standby,
	// handed over) carry the same one. 0: unknown (written before
	// lineages).
	Lineage uint64
	// ReadAt is the owner's clock when it read the state.
	ReadAt time.Time
	// Reservations is the number of open reservations (see Reservation),
	// and Reserved the hits they reserved.
	Reservations int
	Reserved     int64
	// Holders groups the open reservations by holder (Reservation.Holder;
	// "" for those without one, or whose holder this node does not know:
	// read from disk or a copy), in the order of their first reservation.
	Holders []HolderView
	// LeaseDenials counts the checks denied while the key held an open
	// quota lease, counted since the key last held no reservation (as
	// far as this node knows): denials a lease's held room may have
	// caused, the price of exactness.
	LeaseDenials int64
}

// HolderView is what one holder holds of a key.
type HolderView struct {
	Holder string
	// Leases is how many of its reservations are quota leases (known to
	// this node); Reservations all of them, and Hits their hits.
	Leases, Reservations int
	// Demand is the hits a window the holder last said it wants (0: it
	// stated none), Share its max-min fair share of the key's capacity
	// for leases (0 while the demands fit it: no share in force), and
	// Leased the hits leased to it that the key still counts (until a
	// window after each lease's expiry), less what it gave back: its
	// slice use. Known only to the node that granted
	// them, within a window of the holder's last request.
	Demand, Share, Leased int64
	Hits                  int64
	// Expires is when the last of them expires.
	Expires time.Time
}

// Run is a number of hits recorded at the same time.
type Run struct {
	At    time.Time
	Count int64
}

// KeySummary names a key that holds state, for listings.
type KeySummary struct {
	Key       string
	InMemory  bool
	ExpiresAt time.Time
}

// clone returns a deep copy of s, so that deciding on it leaves s alone.
func (s *state) clone() state {
	c := *s
	if s.buf != nil {
		// Same capacity: the log is a ring that wraps at cap(buf).
		c.buf = make([]run, len(s.buf), cap(s.buf))
		copy(c.buf[:cap(c.buf)], s.buf[:cap(s.buf)])
	}
	if s.res != nil {
		c.res = &openReservations{list: slices.Clone(s.res.list), denied: s.res.denied, shares: slices.Clone(s.res.shares)}
	}
	return c
}

// view fills v from s at now without changing s.
func (s *state) view(now int64, maxRuns int, v *KeyState) {
	v.Found = true
	v.Algorithm, v.Limit, v.Window, v.Lineage = s.algo, s.limit, time.Duration(s.window), s.lineage
	probe := Check{Key: v.Key, Limit: s.limit, Window: time.Duration(s.window), Algorithm: s.algo}
	var d Decision
	peek := s.clone()
	peek.decide(now, &probe, maxRuns, &d) // cost 0: prunes, records nothing
	v.Used = peek.usedAt(now)
	v.Remaining, v.ResetAfter = d.Remaining, d.ResetAfter
	switch s.algo {
	case SlidingLog:
		for _, r := range peek.appendEntries(nil) {
			v.Runs = append(v.Runs, Run{At: time.Unix(0, r.at), Count: r.n})
		}
	case SlidingWindow:
		v.BucketStart, v.Previous, v.Current = time.Unix(0, peek.at), peek.prev, peek.cur
	case TokenBucket:
		v.Tokens, v.Updated = s.tokens, time.Unix(0, s.at)
	}
	one := s.clone()
	probe.Cost = 1
	one.decide(now, &probe, maxRuns, &d)
	v.RetryAfter = d.RetryAfter
	if dl := s.deadline(); dl > 0 {
		v.ExpiresAt = time.Unix(0, dl)
	}
	if peek.res != nil {
		v.Reservations = len(peek.res.list)
		v.LeaseDenials = peek.res.denied
		for _, r := range peek.res.list {
			v.Reserved = satAdd(v.Reserved, r.n)
			i := slices.IndexFunc(v.Holders, func(h HolderView) bool { return h.Holder == r.holder })
			if i < 0 {
				i = len(v.Holders)
				v.Holders = append(v.Holders, HolderView{Holder: r.holder})
			}
			h := &v.Holders[i]
			h.Reservations++
			if r.lease {
				h.Leases++
			}
			h.Hits = satAdd(h.Hits, r.n)
			if e := time.Unix(0, r.expires); e.After(h.Expires) {
				h.Expires = e
			}
		}
		for i := range peek.res.shares {
			sh := &peek.res.shares[i]
			k := slices.IndexFunc(v.Holders, func(h HolderView) bool { return h.Holder == sh.holder })
			if k < 0 {
				k = len(v.Holders)
				v.Holders = append(v.Holders, HolderView{Holder: sh.holder})
			}
			h := &v.Holders[k]
			h.Demand, h.Share, h.Leased = sh.demand, peek.shareOf(i), sh.held(now, peek.window)
		}
	}
}

// mark returns where the hits that decide just recorded were put, for
// release: the newest run's time (sliding log), the current bucket's start
// (sliding window), or 0 (token bucket).
func (s *state) mark() int64 {
	switch s.algo {
	case SlidingLog:
		if len(s.buf) > 0 {
			return s.runAt(len(s.buf) - 1).at
		}
	case SlidingWindow:
		return s.at
	}
	return 0
}

// release takes back n hits recorded at mark (see mark), exactly those and
// not newer ones, if they are still held. It reports whether s changed.
func (s *state) release(mark, n int64) bool {
	if n <= 0 {
		return false
	}
	switch s.algo {
	case SlidingLog:
		for i := len(s.buf) - 1; i >= 0; i-- {
			r := s.runAt(i)
			if r.at < mark {
				return false
			}
			if r.at != mark {
				continue
			}
			s.rewrite = true
			take := min(n, r.n)
			r.n -= take
			s.cur -= take
			if r.n == 0 {
				for j := i; j < len(s.buf)-1; j++ {
					*s.runAt(j) = *s.runAt(j + 1)
				}
				s.buf = s.buf[:len(s.buf)-1]
			}
			return true
		}
	case SlidingWindow:
		switch mark {
		case s.at:
			take := min(n, s.cur)
			s.cur -= take
			return take > 0
		case s.at - s.window:
			take := min(n, s.prev)
			s.prev -= take
			return take > 0
		}
	case TokenBucket:
		before := s.tokens
		s.tokens = min(float64(s.limit), s.tokens+float64(n))
		return s.tokens != before
	}
	return false
}
