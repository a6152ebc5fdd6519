package actor

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"time"
)

// This file holds the three limit algorithms: the state of one key and the
// decision of one check against it. It is pure code: no goroutines, no clock,
// no locks. Time is passed in as unix nanoseconds, and the key's actor is the
// only user of its state.
//
// Rules shared by the three algorithms:
//
//   - allowed = used + cost <= limit; a peek (cost 0) records nothing and is
//     allowed when used <= limit.
//   - Denied hits are not recorded unless the check asks for a Penalty; then
//     they are recorded as if allowed, within a bound that preserves every
//     decision (see each algorithm).
//   - A refund removes up to Cost of the newest hits, never below zero, and is
//     always allowed.
//   - A check whose limit or window differs from the stored ones applies the new
//     values from then on; what was recorded is kept (see each algorithm).
//   - A check whose algorithm differs converts the state conservatively: the
//     hits the old algorithm counts at now become hits recorded at now in the
//     new one. Hits are only ever moved later in time, never forgotten, so
//     the switch hands out no free window.
//   - When the clock goes backwards (another node's clock, an NTP step) the
//     state never moves back: hits are recorded no earlier than the newest
//     one, buckets and refills stay where they are. Backward time only delays
//     capacity.
//   - Every state that holds hits carries a lineage, a random number drawn
//     when it starts from empty (see state.lineage): two copies with the
//     same lineage are versions of one history, which merge tells apart
//     from states that counted different hits.

// run is n hits recorded at time at (unix ns).
type run struct{ at, n int64 }

// state is the limiter state of one key. Its actor goroutine is its only
// user, so it has no locks. The zero value is a key never seen: the first
// check sets its algorithm, limit and window.
//
// The fields that an algorithm does not use are zero. On amd64 a state is 96
// bytes, plus 16 bytes per run of the sliding log (and its reservations,
// when it holds some).
type state struct {
	// limit is the number of hits allowed per window; 0 only in the zero
	// value.
	limit int64
	// window is the length of the sliding interval in ns.
	window int64
	// buf is the sliding log, a ring: its len is the number of runs, its cap
	// the ring's size, and the oldest run is at index head of buf[:cap(buf)].
	// Timestamps increase strictly from the oldest run to the newest. Pruning
	// and appending cost O(1) and never move runs. Read it through
	// segments or appendEntries.
	buf []run
	// at is, for SlidingWindow, the start of the current bucket (a multiple of
	// window) and, for TokenBucket, the time tokens were last refilled.
	at int64
	// prev is, for SlidingWindow, the hits in the previous bucket.
	prev int64
	// cur is, for SlidingWindow, the hits in the current bucket and, for
	// SlidingLog, the sum of n over the log.
	cur int64
	// tokens is, for TokenBucket, the tokens available at time at, in
	// [0, limit], or down to -limit once usage took the bucket into debt.
	tokens float64
	// lineage names the history the state belongs to: a random non-zero
	// number drawn when a check records hits in a state that held nothing
	// (a key never seen, or one whose hits have all expired), kept through
	// every later change (new limit, window or algorithm, refunds,
	// releases, merges) and through encoding. Copies of one state (on disk,
	// on a standby, handed over) keep it, so merge can tell copies of one
	// history, to be merged without counting a hit twice, from states that
	// counted different hits. 0 is unknown: the zero value, and states
	// written before lineages; such a state draws one at its next change.
	lineage uint64
	// res holds the key's open reservations; nil when it has none.
	res *openReservations
	// head is the index of the oldest run in buf[:cap(buf)].
	head uint32
	algo Algorithm
	// rewrite is set when the log changed other than by hits added at its
	// newest end (a new key, a new limit or window, a refund, a release, a
	// trim, a merge, a decode): the store's copy can then not be brought up
	// to date by appending (see appendTail).
	rewrite bool
}

// maxMaxRuns bounds the maxRuns argument of decide (and so the runs of one
// key, 256 MiB at 16 bytes each); a larger value is treated as this one.
const maxMaxRuns = 1 << 24

// never is the RetryAfter of a check that can never be allowed (a cost above
// the limit, which validation normally rejects first).
const never = time.Duration(math.MaxInt64)

// segments returns the sliding log, oldest first, as two slices (the second
// one is empty unless the ring wraps). They alias s: do not keep them across
// calls to decide or decode.
func (s *state) segments() (a, b []run) {
	ring, h, n := s.buf[:cap(s.buf)], int(s.head), len(s.buf)
	if h+n <= len(ring) {
		return ring[h : h+n], nil
	}
	return ring[h:], ring[:h+n-len(ring)]
}

// appendEntries appends the sliding log, oldest first, to dst (for admin
// views).
func (s *state) appendEntries(dst []run) []run {
	a, b := s.segments()
	return append(append(dst, a...), b...)
}

// runAt returns the i-th run of the log, 0 being the oldest.
func (s *state) runAt(i int) *run {
	ring := s.buf[:cap(s.buf)]
	j := int(s.head) + i
	if j >= len(ring) {
		j -= len(ring)
	}
	return &ring[j]
}

// warm reads the state and the oldest run of its log, the memory a
// decision reads first, and returns a value read, for the caller to keep
// (so that the loads happen).
func (s *state) warm() int64 {
	if len(s.buf) == 0 {
		return s.limit
	}
	return s.buf[:cap(s.buf)][s.head].at
}

// decide applies check c at time now and fills d. It returns true when the
// state changed in a way that must be persisted: hits recorded or refunded,
// or limit, window or algorithm changed on a key that was seen before.
// Pruning expired hits, refilling tokens or moving to a new bucket alone is
// not a change. maxRuns bounds the sliding log: when the limit is above it,
// timestamps are rounded up to a multiple of ceil(window/maxRuns), so that a
// log never holds more than maxRuns+1 runs.
//
// Inputs that validation rejects (limit or window not positive, a negative
// cost, an unknown algorithm) are denied without touching s; decide never
// panics.
func (s *state) decide(now int64, c *Check, maxRuns int, d *Decision) (changed bool) {
	*d = Decision{Limit: c.Limit}
	if c.Limit <= 0 || c.Window <= 0 || c.Cost < 0 || c.Algorithm >= numAlgorithms {
		d.RetryAfter = never
		return false
	}
	maxRuns = max(1, min(maxRuns, maxMaxRuns))
	if c.settles() {
		// A settle takes the key's parameters as they are.
		return s.settle(now, c, maxRuns, d)
	}
	if s.limit <= 0 || s.window <= 0 || s.algo >= numAlgorithms {
		// A key never seen (or a zero state): nothing to keep or convert.
		s.reset(now, c.Algorithm, c.Limit, int64(c.Window))
	} else if c.Algorithm != s.algo {
		s.convert(now, c.Algorithm, c.Limit, int64(c.Window), maxRuns)
		changed = true
	} else if c.Limit != s.limit || int64(c.Window) != s.window {
		s.resize(now, c.Limit, int64(c.Window))
		changed = true
	}
	d.Limit = s.limit
	var recorded bool
	if s.res != nil {
		s.pruneReservations(now)
	}
	if r := c.Reservation; r == nil {
		recorded = s.algoDecide(now, c, maxRuns, d)
	} else if r.Lease && s.algo == SlidingLog && s.holdsReservation(r.ID) {
		var share int64
		if r.Demand > 0 && r.Holder != "" {
			_, share, _ = s.fairGrant(now, r, 0) // its word, and its share
		}
		recorded = s.leaseExtend(now, satAdd(now, int64(r.TTL)), c, maxRuns, d)
		if d.Allowed {
			d.Granted, d.Share = s.res.list[s.res.find(r.ID)].n, share
		}
	} else if s.holdsReservation(r.ID) || s.res != nil && len(s.res.list) >= MaxReservations {
		s.reserveHeld(now, c, maxRuns, d)
	} else {
		recorded = s.reserveNew(now, c, maxRuns, d)
	}
	if !d.Allowed && c.Reservation == nil && c.Cost > 0 && s.leaseOpen() {
		s.res.denied++
	}
	changed = changed || recorded
	if changed && s.lineage == 0 {
		// A new history (the algorithms zero the lineage when they record
		// hits in a state that held nothing), or a state of unknown
		// lineage: draw one. The next write must be a full one, which
		// carries it.
		s.lineage = newLineage()
		s.rewrite = true
	}
	return changed
}

// reserveNew decides a reserving check whose ID s does not hold: a new
// lease (up to its holder's fair share, when it states a demand) or a new
// reservation. It reports whether it recorded hits.
func (s *state) reserveNew(now int64, c *Check, maxRuns int, d *Decision) bool {
	r := c.Reservation
	if r.Lease && r.Demand > 0 && r.Holder != "" {
		// Up to its fair share and to the room: a part of the cost may
		// be granted.
		grant, share, wait := s.fairGrant(now, r, c.Cost)
		defer func() { d.Share = share }()
		peek := Check{Key: c.Key, Limit: c.Limit, Window: c.Window, Algorithm: c.Algorithm}
		s.algoDecide(now, &peek, maxRuns, d)
		switch room := d.Remaining; {
		case grant == 0 && room > 0:
			// Over its share while others' shares hold the room.
			d.Allowed, d.RetryAfter = false, time.Duration(wait)
			return false
		case room == 0:
			grant = 1 // denied below, with the wait for a hit
		default:
			grant = min(grant, room)
		}
		if grant < c.Cost {
			fair := *c
			fair.Cost = grant
			c = &fair
		}
	}
	var recorded bool
	expires := satAdd(now, int64(r.TTL))
	if r.Lease && s.algo == SlidingLog {
		if recorded = s.leaseDecide(now, expires, c, maxRuns, d); recorded {
			s.addReservation(r, s.mark(), c.Cost, expires)
		}
	} else if recorded = s.algoDecide(now, c, maxRuns, d); recorded && d.Allowed {
		s.addReservation(r, s.mark(), c.Cost, expires)
	}
	if d.Allowed && r.Lease {
		d.Granted = c.Cost
		s.noteLeased(now, r.Holder, expires, c.Cost)
	}
	return recorded
}

// algoDecide decides c with s's algorithm (s has c's parameters).
func (s *state) algoDecide(now int64, c *Check, maxRuns int, d *Decision) (recorded bool) {
	switch s.algo {
	case SlidingLog:
		return s.logDecide(now, c, maxRuns, d)
	case SlidingWindow:
		return s.windowDecide(now, c, d)
	case TokenBucket:
		return s.bucketDecide(now, c, d)
	}
	return false
}

// newLineage returns a random non-zero lineage.
func newLineage() uint64 {
	for {
		if l := rand.Uint64(); l != 0 {
			return l
		}
	}
}

// reset makes s an empty state of the given algorithm and parameters at now,
// of unknown lineage.
func (s *state) reset(now int64, algo Algorithm, limit, window int64) {
	buf := s.buf[:0]
	if algo != SlidingLog {
		buf = nil // give the log's memory back
	}
	*s = state{algo: algo, limit: limit, window: window, buf: buf, rewrite: true}
	switch algo {
	case SlidingWindow:
		s.at = floorDiv(now, window) * window
	case TokenBucket:
		s.at = now
		s.tokens = float64(limit)
	}
}

// convert switches s to another algorithm. Rule: the hits the old algorithm
// counts at now (usedAt) become hits recorded at now in the new one: one run
// at now (rounded up as usual) in the log, the current bucket in the sliding
// window, limit-used tokens in the bucket. The hits of the past are only ever
// moved later in time, so the new algorithm starts from the count the old one
// had at the switch, and never forgets a hit sooner than the true history
// would.
func (s *state) convert(now int64, algo Algorithm, limit, window int64, maxRuns int) {
	used, lineage, res := s.usedAt(now), s.lineage, s.res
	s.reset(now, algo, limit, window)
	s.lineage, s.res = lineage, res
	if used <= 0 {
		return
	}
	switch algo {
	case SlidingLog:
		s.logAdd(now, used, maxRuns)
	case SlidingWindow:
		s.cur = used
	case TokenBucket:
		s.tokens = max(0, float64(limit)-float64(used))
	}
}

// resize applies a new limit or window to s, keeping what was recorded:
//
//   - SlidingLog: the runs keep their timestamps; they expire at at+window
//     with the new window, and count against the new limit. Hits that had
//     expired under the old window by now stay expired: a longer window
//     does not bring them back.
//   - SlidingWindow: a new limit applies to the same counts. A new window
//     changes the bucket grid, so the estimate at now under the old window
//     becomes the current bucket's count in the new grid (moved later in
//     time: conservative).
//   - TokenBucket: the bucket is refilled to now at the old rate, then the
//     used part (limit - tokens) is kept: tokens = max(0, newLimit - used). So a
//     raised limit gives exactly the extra capacity, and a lowered one never
//     leaves more tokens than the old state had spare. Refill continues at
//     the new rate.
func (s *state) resize(now, limit, window int64) {
	switch s.algo {
	case SlidingLog:
		s.logPrune(now) // what expired under the old window stays expired
		s.limit, s.window = limit, window
		s.rewrite = true
	case SlidingWindow:
		if window != s.window {
			s.windowAdvance(now)
			est := s.windowEstimate(now)
			s.at = floorDiv(now, window) * window
			s.prev, s.cur = 0, est
		}
		s.limit, s.window = limit, window
	case TokenBucket:
		s.bucketRefill(now)
		used := float64(s.limit) - s.tokens
		lo := 0.0
		if s.tokens < 0 {
			lo = -float64(limit) // keep the debt, within the new bound
		}
		s.limit, s.window = limit, window
		s.tokens = min(float64(limit), max(lo, float64(limit)-used))
	}
}

// deadline is the unix ns time at which the state becomes empty (equivalent
// to a key never seen) if nothing else arrives: its hits have expired and
// its reservations too; 0 if it is empty already at its last update. For
// all t >= deadline, isEmpty(t) is true.
func (s *state) deadline() int64 {
	dl := s.hitsDeadline()
	if s.res != nil {
		dl = max(dl, s.res.latest())
	}
	return dl
}

// hitsDeadline is deadline without the reservations.
func (s *state) hitsDeadline() int64 {
	if s.limit <= 0 || s.window <= 0 {
		return 0
	}
	switch s.algo {
	case SlidingLog:
		if len(s.buf) > 0 {
			return s.runAt(len(s.buf)-1).at + s.window
		}
	case SlidingWindow:
		switch {
		case s.cur > 0: // cur becomes prev in the next bucket and weighs until its end
			return s.at + 2*s.window
		case s.prev > 0:
			return s.at + s.window
		}
	case TokenBucket:
		if el := s.bucketWait(float64(s.limit)); el > 0 {
			return s.at + el
		}
	}
	return 0
}

// isEmpty reports whether at time now the state holds nothing: all hits have
// expired, or the bucket is full.
func (s *state) isEmpty(now int64) bool {
	if s.res != nil && s.res.live(now) {
		return false
	}
	if s.algo == SlidingLog && s.limit > 0 {
		// The newest run expires last.
		return len(s.buf) == 0 || s.expired(s.runAt(len(s.buf)-1).at, now)
	}
	return s.usedAt(now) <= 0
}

// usedAt returns the hits counted at now (for admin views and algorithm
// conversion): the hits of the log that have not expired, the sliding
// window's estimate, or, for the token bucket, limit - tokens rounded up. It
// does not change s.
func (s *state) usedAt(now int64) int64 {
	if s.limit <= 0 || s.window <= 0 {
		return 0
	}
	switch s.algo {
	case SlidingLog:
		var used int64
		a, b := s.segments()
		for _, seg := range [2][]run{a, b} {
			for _, r := range seg {
				if !s.expired(r.at, now) {
					used = satAdd(used, r.n)
				}
			}
		}
		return used
	case SlidingWindow:
		t := *s
		t.windowAdvance(now)
		return t.windowEstimate(now)
	case TokenBucket:
		// limit - remaining, where remaining may be negative in debt.
		r := math.Floor(s.bucketAt(now-s.at) + s.bucketEps())
		if r >= float64(s.limit) {
			return 0
		}
		return s.limit - int64(r)
	}
	return 0
}

// --- Sliding log ---------------------------------------------------------
//
// Exact. A run recorded at t counts while now < t+window. Runs with equal
// timestamps merge, so the log holds at most limit runs (limit+1 with
// penalties). When limit > maxRuns, timestamps are rounded up to a multiple
// of res = ceil(window/maxRuns) ns: live timestamps then lie in
// (now-window, now+res), which holds at most maxRuns+1 multiples of res.
// Rounding up only makes hits expire later, so the log still never allows
// more than the limit in any window; capacity comes back at most res late.
// (The ceiling, not the floor, of window/maxRuns: with the floor, a window of
// 1999 ns and maxRuns 1000 would round to 1 ns and allow 1999 runs.) After a
// change of limit, the runs recorded under the old one stay until they
// expire, so for one window the log may hold up to the old bound plus the new.
//
// Each decide prunes the runs expired at now under the window in force; a
// pruned hit never comes back, even if the clock later goes back or a longer
// window arrives.

// expired reports whether a hit recorded at at no longer counts at now.
func (s *state) expired(at, now int64) bool { return at <= now-s.window }

func (s *state) logDecide(now int64, c *Check, maxRuns int, d *Decision) (recorded bool) {
	s.logPrune(now)
	used := s.cur
	switch {
	case c.Refund:
		d.Allowed = true
		recorded = s.logRefund(c.Cost) > 0
	case c.Usage && c.Cost == 0:
		d.Allowed = used < s.limit
	case c.Usage:
		d.Allowed = c.Cost <= s.limit && used <= s.limit-c.Cost
		if len(s.buf) == 0 {
			s.lineage = 0 // it held nothing: a new history
		}
		s.logUsage(now, c.Cost, maxRuns)
		recorded = true
	case c.Cost == 0:
		d.Allowed = used <= s.limit
	case c.Cost > s.limit:
		d.Allowed = false
	default:
		d.Allowed = used <= s.limit && c.Cost <= s.limit-used
		if d.Allowed || c.Penalty {
			if len(s.buf) == 0 {
				s.lineage = 0 // it held nothing: a new history
			}
			s.logAdd(now, c.Cost, maxRuns)
			recorded = true
		}
		if !d.Allowed && c.Penalty {
			// Keep the newest limit+1 hits. The hits that count at any later
			// time are a suffix of the log, and a decision against this limit
			// only depends on that suffix up to its newest limit+1 hits: the
			// dropped hits change no decision, remaining, retryAfter or
			// resetAfter (until the limit is raised or hits are refunded: they
			// are forgotten, a cost of opting in to penalties). See logKeep.
			s.logTrim(s.logKeep(now))
		}
	}
	d.Remaining = max(0, s.limit-s.cur)
	if len(s.buf) > 0 {
		d.ResetAfter = time.Duration(s.runAt(len(s.buf)-1).at + s.window - now)
	}
	switch {
	case d.Allowed:
	case c.Usage:
		d.RetryAfter = s.logWait(now, 1) // until the key is below its limit
	default:
		d.RetryAfter = s.logWait(now, c.Cost)
	}
	return recorded
}

// leaseDecide decides a lease of c.Cost hits (see Reservation.Lease) on
// a sliding log: allowed when the cost fits now, as a plain check; its
// hits are then recorded at expires, so that they count until a window
// after it. It reports whether it recorded them.
func (s *state) leaseDecide(now, expires int64, c *Check, maxRuns int, d *Decision) bool {
	peek := Check{Key: c.Key, Limit: c.Limit, Window: c.Window, Algorithm: c.Algorithm}
	s.logDecide(now, &peek, maxRuns, d) // prunes, and fills d as for the key now
	if c.Cost > s.limit || s.cur > s.limit-c.Cost {
		d.Allowed, d.RetryAfter = false, s.logWait(now, c.Cost)
		return false
	}
	if len(s.buf) == 0 {
		s.lineage = 0 // it held nothing: a new history
	}
	s.logAdd(expires, c.Cost, maxRuns)
	d.Allowed, d.RetryAfter = true, 0
	d.Remaining = max(0, s.limit-s.cur)
	d.ResetAfter = time.Duration(s.runAt(len(s.buf)-1).at + s.window - now)
	return true
}

// leaseExtend extends the open lease c.Reservation.ID to expires: its
// hits move to that later time, so they count a window after it (moving
// hits later never lets a window hold more). An earlier expiry keeps the
// later one. A cost above the lease's grows it, if the hits it adds fit
// now (denied otherwise, and nothing changes); a smaller one (at least
// 1) shrinks it, giving the difference back as a settle would: its
// holder's word that it will spend no more. It reports whether it
// changed s.
func (s *state) leaseExtend(now, expires int64, c *Check, maxRuns int, d *Decision) bool {
	peek := Check{Key: c.Key, Limit: c.Limit, Window: c.Window, Algorithm: c.Algorithm}
	s.logDecide(now, &peek, maxRuns, d)
	d.Allowed, d.RetryAfter = true, 0
	r := &s.res.list[s.res.find(c.Reservation.ID)]
	n, changed := r.n, false
	switch {
	case c.Cost > n:
		// Grown: the hits it adds must fit now, as a new lease's would.
		if grow := c.Cost - n; grow > s.limit || s.cur > s.limit-grow {
			d.Allowed, d.RetryAfter = false, s.logWait(now, grow)
			return false
		}
		n = c.Cost
	case c.Cost < n:
		// Shrunk: its holder says it will spend no more than that, as a
		// settle does.
		s.release(r.mark, n-c.Cost)
		s.noteLeased(now, r.holder, r.expires, c.Cost-n)
		r.n, n, changed = c.Cost, c.Cost, true
	}
	if n != r.n || expires > r.expires {
		expires = max(expires, r.expires)
		s.release(r.mark, r.n)
		s.logAdd(expires, n, maxRuns)
		s.noteLeased(now, r.holder, r.expires, -r.n)
		s.noteLeased(now, r.holder, expires, n)
		r.mark, r.expires, r.n, changed = s.mark(), expires, n, true
	}
	if changed {
		s.rewrite = true
		d.Remaining = max(0, s.limit-s.cur)
		d.ResetAfter = time.Duration(s.runAt(len(s.buf)-1).at + s.window - now)
	}
	return changed
}

// logWait returns how long from now until cost fits, with nothing else
// arriving: the oldest used-(limit-cost) hits must expire.
func (s *state) logWait(now, cost int64) time.Duration {
	if cost > s.limit {
		return never
	}
	need := s.cur - (s.limit - cost)
	if need <= 0 {
		return 0
	}
	var acc int64
	a, b := s.segments()
	for _, seg := range [2][]run{a, b} {
		for _, r := range seg {
			acc = satAdd(acc, r.n)
			if acc >= need {
				return time.Duration(r.at + s.window - now)
			}
		}
	}
	return never // unreachable: need <= cur
}

// logPrune drops the runs expired at now.
func (s *state) logPrune(now int64) {
	for len(s.buf) > 0 {
		r := s.runAt(0)
		if !s.expired(r.at, now) {
			return
		}
		s.cur -= r.n
		s.popOldest()
	}
}

// popOldest drops the oldest run (the caller adjusts cur).
func (s *state) popOldest() {
	s.head++
	if int(s.head) == cap(s.buf) {
		s.head = 0
	}
	s.buf = s.buf[:len(s.buf)-1]
	if len(s.buf) == 0 {
		s.head = 0
	}
}

// logAdd records n hits at now, rounded up to the resolution when the limit
// is above maxRuns, and never earlier than the newest run.
func (s *state) logAdd(now, n int64, maxRuns int) {
	at := now
	if s.limit > int64(maxRuns) {
		res := s.window / int64(maxRuns)
		if s.window%int64(maxRuns) != 0 {
			res++
		}
		if q := floorDiv(at, res) * res; q != at {
			at = q + res
		}
	}
	s.cur = satAdd(s.cur, n)
	if len(s.buf) > 0 {
		if last := s.runAt(len(s.buf) - 1); at <= last.at {
			last.n = satAdd(last.n, n)
			return
		}
	}
	if len(s.buf) == cap(s.buf) {
		// Grow, up to the most runs this limit needs (the allocation is
		// rounded up to its size class). A new log takes one run (16
		// bytes): most keys of a large key space are touched once or
		// twice, and a ring of four would hold 48 bytes of nothing for
		// each of them; a second run grows it to four.
		bound := int(min(s.limit, int64(maxRuns))) + 1
		want := 1
		if len(s.buf) > 0 {
			want = max(min(max(2*len(s.buf), 4), bound), len(s.buf)+1)
		}
		a, b := s.segments()
		grown := slices.Grow([]run(nil), want)
		s.buf = append(append(grown, a...), b...)
		s.head = 0
	}
	s.buf = s.buf[:len(s.buf)+1]
	*s.runAt(len(s.buf) - 1) = run{at, n}
}

// logRefund removes up to n of the newest hits and returns how many.
func (s *state) logRefund(n int64) int64 {
	var done int64
	s.rewrite = true
	for n > 0 && len(s.buf) > 0 {
		last := s.runAt(len(s.buf) - 1)
		if last.n > n {
			last.n -= n
			s.cur -= n
			return done + n
		}
		n -= last.n
		done += last.n
		s.cur -= last.n
		s.buf = s.buf[:len(s.buf)-1]
	}
	if len(s.buf) == 0 {
		s.head = 0
	}
	return done
}

// logTrim drops the oldest hits until at most keep remain.
func (s *state) logTrim(keep int64) {
	s.rewrite = true
	for s.cur > keep && len(s.buf) > 0 {
		first := s.runAt(0)
		if excess := s.cur - keep; first.n > excess {
			first.n -= excess
			s.cur = keep
			return
		}
		s.cur -= first.n
		s.popOldest()
	}
}

// --- Sliding window counter ------------------------------------------------
//
// Two buckets aligned to multiples of window: prev and cur hits. At elapsed
// e = now - (start of the current bucket),
//
//	estimate = ceil(prev * (window-e) / window) + cur
//
// and a check is allowed when estimate + cost <= limit. The weighted part is
// rounded up, always, so the estimate is never below the continuous formula
// and is an integer (remaining and retryAfter are exact in integers; the
// products use 128-bit arithmetic, so no limit or window overflows).
//
// Error bound. Let p be the hits allowed in the tail of bucket k-1 that an
// interval of length window, ending at fraction f of bucket k, covers. Hits in
// bucket k up to fraction f are allowed only while
// ceil(prev*(1-f)) + cur <= limit, with prev >= p, so they number at most
// limit - p(1-f). The interval holds at most p + limit - p(1-f) = limit + p*f,
// and p*f < limit since f < 1 and p <= limit: fewer than 2*limit hits in any
// interval of length window, and the greedy adversary (limit hits at the last
// ns of a bucket, then as many as allowed in the next) reaches 2*limit-1. The
// estimate can also deny hits the exact log would allow (hits early in bucket
// k-1 still weigh in bucket k). state_model_test.go measures both.
//
// Penalty hits are recorded in cur, capped at limit (more would change no
// decision in this bucket). A refund takes from cur, then from prev.

func (s *state) windowDecide(now int64, c *Check, d *Decision) (recorded bool) {
	s.windowAdvance(now)
	est := s.windowEstimate(now)
	switch {
	case c.Refund:
		d.Allowed = true
		n := min(c.Cost, s.cur)
		s.cur -= n
		m := min(c.Cost-n, s.prev)
		s.prev -= m
		recorded = n+m > 0
	case c.Usage && c.Cost == 0:
		d.Allowed = est < s.limit
	case c.Usage:
		// Recorded in full, not capped as penalties are: the key is in
		// debt until the hits have weighed out of the window.
		d.Allowed = c.Cost <= s.limit && est <= s.limit-c.Cost
		if est == 0 {
			s.lineage = 0 // it held nothing: a new history
		}
		s.cur = satAdd(s.cur, c.Cost)
		recorded = true
	case c.Cost == 0:
		d.Allowed = est <= s.limit
	case c.Cost > s.limit:
		d.Allowed = false
	default:
		d.Allowed = est <= s.limit && c.Cost <= s.limit-est
		if (d.Allowed || c.Penalty) && est == 0 {
			s.lineage = 0 // it held nothing: a new history
		}
		if d.Allowed {
			s.cur += c.Cost // est + cost <= limit, so no overflow
			recorded = true
		} else if c.Penalty {
			if n := min(satAdd(s.cur, c.Cost), s.limit); n > s.cur {
				s.cur = n
				recorded = true
			}
		}
	}
	est = s.windowEstimate(now)
	d.Remaining = max(0, s.limit-est)
	switch {
	case s.cur > 0:
		d.ResetAfter = time.Duration(s.at + 2*s.window - now)
	case s.prev > 0:
		d.ResetAfter = time.Duration(s.at + s.window - now)
	}
	switch {
	case d.Allowed:
	case c.Usage:
		d.RetryAfter = s.windowWait(now, 1) // until the key is below its limit
	default:
		d.RetryAfter = s.windowWait(now, c.Cost)
	}
	return recorded
}

// windowAdvance moves the buckets to the one that holds now. A time before
// the current bucket (the clock went back) leaves them where they are.
func (s *state) windowAdvance(now int64) {
	start := floorDiv(now, s.window) * s.window
	switch {
	case start <= s.at:
	case start-s.at == s.window:
		s.prev, s.cur, s.at = s.cur, 0, start
	default:
		s.prev, s.cur, s.at = 0, 0, start
	}
}

// windowEstimate returns the estimate at now; the buckets must be advanced
// to now.
func (s *state) windowEstimate(now int64) int64 {
	e := min(max(now-s.at, 0), s.window)
	return satAdd(mulDivCeil(s.prev, s.window-e, s.window), s.cur)
}

// windowWait returns how long from now until cost fits, with nothing else
// arriving: in the current bucket as prev decays, else in the next one,
// where cur becomes prev, else at the start of the one after (empty).
func (s *state) windowWait(now, cost int64) time.Duration {
	if cost > s.limit {
		return never
	}
	// ceil(p*(window-e)/window) <= room  <=>  e >= window - floor(room*window/p).
	fitsFrom := func(p, room int64) int64 {
		if p <= room {
			return 0
		}
		return s.window - mulDivFloor(room, s.window, p) // room < p: no overflow
	}
	if room := s.limit - cost - s.cur; room >= 0 {
		if e := fitsFrom(s.prev, room); e < s.window {
			return time.Duration(max(s.at+e-now, 0))
		}
	}
	e := fitsFrom(s.cur, s.limit-cost) // <= window: at worst the bucket after next
	return time.Duration(s.at + s.window + e - now)
}

// --- Token bucket -----------------------------------------------------------
//
// Burst up to limit, refilled continuously at limit per window:
// tokens = min(limit, tokens + elapsed*limit/window), with tokens a float64 and
// the refill time an int64 (unix ns never goes through a float). A cost fits
// when tokens + eps >= cost, where eps = limit*2^-40 absorbs float rounding
// (three refills of a third make one token; float64 errors are near
// limit*2^-52) and is far below one hit: it lets capacity return at most
// window*2^-40 early (under 1ns for windows under 18 minutes, 29µs for a year).
// retryAfter and resetAfter are the smallest whole ns at which that same test
// passes, so a check at now+retryAfter is allowed and one at
// now+retryAfter-1ns is not. remaining = floor(tokens + eps).
//
// Error bound: an interval of length window holds at most the burst (limit)
// plus what refills during it (limit): at most 2*limit allowed hits.
//
// A penalty takes the cost anyway, down to 0 tokens; a refund gives the cost
// back, up to limit tokens.

func (s *state) bucketDecide(now int64, c *Check, d *Decision) (recorded bool) {
	s.bucketRefill(now)
	eps := s.bucketEps()
	switch {
	case c.Refund:
		d.Allowed = true
		if t := min(float64(s.limit), s.tokens+float64(c.Cost)); t != s.tokens {
			s.tokens = t
			recorded = true
		}
	case c.Usage && c.Cost == 0:
		d.Allowed = s.tokens+eps >= 1
	case c.Usage:
		d.Allowed = c.Cost <= s.limit && s.tokens+eps >= float64(c.Cost)
		if s.tokens+eps >= float64(s.limit) {
			s.lineage = 0 // full: it held nothing, a new history
		}
		recorded = s.bucketUsage(c.Cost)
	case c.Cost == 0:
		d.Allowed = s.tokens+eps >= 0 // used <= limit: not in debt
	case c.Cost > s.limit:
		d.Allowed = false
	default:
		d.Allowed = s.tokens+eps >= float64(c.Cost)
		if d.Allowed || c.Penalty {
			if t := max(0, s.tokens-float64(c.Cost)); t != s.tokens {
				if s.tokens+eps >= float64(s.limit) {
					s.lineage = 0 // full: it held nothing, a new history
				}
				s.tokens = t
				recorded = true
			}
		}
	}
	d.Remaining = s.bucketRemaining(s.tokens)
	if el := s.bucketWait(float64(s.limit)); el > 0 {
		d.ResetAfter = time.Duration(s.at + el - now)
	}
	switch {
	case d.Allowed:
	case c.Usage:
		// Until the key is below its limit: one token.
		d.RetryAfter = time.Duration(max(s.at+s.bucketWait(1)-now, 0))
	case c.Cost > s.limit:
		d.RetryAfter = never
	default:
		d.RetryAfter = time.Duration(max(s.at+s.bucketWait(float64(c.Cost))-now, 0))
	}
	return recorded
}

func (s *state) bucketEps() float64 { return float64(s.limit) * 0x1p-40 }

// bucketAt returns the tokens el ns after the last refill. A bucket in
// debt (tokens >= -limit) is full after at most two windows.
func (s *state) bucketAt(el int64) float64 {
	switch {
	case el <= 0:
		return s.tokens
	case el >= s.window && s.tokens >= 0, el/2 >= s.window:
		return float64(s.limit)
	}
	return min(float64(s.limit), s.tokens+float64(el)*float64(s.limit)/float64(s.window))
}

// bucketRefill brings the tokens to now. A time before the last refill
// (the clock went back) changes nothing.
func (s *state) bucketRefill(now int64) {
	if el := now - s.at; el > 0 {
		s.tokens = s.bucketAt(el)
		s.at = now
	}
}

// bucketRemaining returns how many cost-1 hits tokens allow.
func (s *state) bucketRemaining(tokens float64) int64 {
	r := math.Floor(tokens + s.bucketEps())
	if r >= float64(s.limit) {
		return s.limit
	}
	return max(0, int64(r))
}

// bucketWait returns the smallest el >= 0 such that need fits el ns after the
// last refill (at most window when the bucket is full, two in debt; need <=
// limit).
func (s *state) bucketWait(need float64) int64 {
	eps := s.bucketEps()
	fits := func(el int64) bool { return s.bucketAt(el)+eps >= need }
	if fits(0) {
		return 0
	}
	top := s.window
	if s.tokens < 0 {
		top = satAdd(s.window, s.window)
	}
	// Start from the closed form and correct it for rounding: gallop to a
	// bracket !fits(lo), fits(hi), then bisect.
	guess := math.Ceil((need - eps - s.tokens) * float64(s.window) / float64(s.limit))
	hi := top
	if guess < float64(top) {
		hi = max(int64(guess), 1)
	}
	var lo int64
	if fits(hi) {
		for step := int64(1); ; step *= 2 {
			lo = hi - step
			if lo <= 0 {
				lo = 0
				break
			}
			if !fits(lo) {
				break
			}
			hi = lo
		}
	} else {
		lo = hi
		for step := int64(1); ; step *= 2 {
			hi = lo + step
			if hi >= top || hi < lo {
				hi = top
				break
			}
			if fits(hi) {
				break
			}
			lo = hi
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// --- Encoding ---------------------------------------------------------------
//
// A stored state is one segment, or, for the sliding log only, a full segment
// followed by tail segments, each holding hits added to the log since the
// segment before (see appendTail). A segment:
//
//	byte     version: 3 for a full segment with a lineage, 1 for a full
//	         segment without (lineage 0: unknown), 2 for a tail segment,
//	         4 for a full segment with a lineage and reservations (or a
//	         token bucket in debt)
//	byte     algorithm
//	8 bytes  versions 3 and 4 only: the lineage, little-endian (not 0 in
//	         version 3; 0 in version 4 is unknown)
//	uvarint  limit (> 0)
//	uvarint  window in ns (> 0)
//	SlidingLog:    uvarint count, then count times: timestamp (the first as a
//	               varint, the others as a uvarint delta > 0 from the previous
//	               one) and uvarint n (> 0)
//	SlidingWindow: varint start of the current bucket, uvarint prev,
//	               uvarint cur
//	TokenBucket:   varint time of the last refill, 8 bytes little-endian
//	               float64 tokens in [0, limit] ([-limit, limit] in
//	               version 4)
//	version 4 only: uvarint count of reservations (at most
//	               MaxReservations), then each: 16 bytes ID (not zero, no
//	               two equal), varint mark, uvarint estimate (> 0), varint
//	               expiry (unix ns)
//
// The log of a chain is the runs of its segments in order; the first run of a
// tail segment may have the time of the run before it (more hits at that
// time), never an earlier one. The limit and window are the last segment's,
// the lineage the full segment's (tails do not carry one: a tail extends the
// history of the value it is appended to). A tail segment alone is a valid
// state too, of unknown lineage: the store keeps it alone when the value it
// followed was deleted, which happens only once every hit of that value has
// expired.
//
// A full log of limit 100 with one hit per ms takes about 17 + 100*3 bytes; a
// tail segment of one hit about 20.

const (
	stateVersion   = 1 // a full segment without lineage; what versions before tails wrote
	tailVersion    = 2
	lineageVersion = 3 // a full segment with a lineage
	usageVersion   = 4 // a full segment with a lineage, reservations and debt
)

// appendBinary appends the full encoding of s to b: one full segment (of
// version 1 if its lineage is unknown, so that it reads as it was written;
// of version 4 only when it holds reservations or a bucket in debt, so that
// keys without them are written as before).
func (s *state) appendBinary(b []byte) []byte {
	version := byte(lineageVersion)
	switch {
	case s.needsUsageVersion():
		version = usageVersion
	case s.lineage == 0:
		version = stateVersion
	}
	b = s.appendHeader(b, version)
	switch s.algo {
	case SlidingLog:
		b = binary.AppendUvarint(b, uint64(len(s.buf)))
		x, y := s.segments()
		var prev int64
		for i, seg := range [2][]run{x, y} {
			for j, e := range seg {
				if i == 0 && j == 0 {
					b = binary.AppendVarint(b, e.at)
				} else {
					b = binary.AppendUvarint(b, uint64(e.at-prev))
				}
				prev = e.at
				b = binary.AppendUvarint(b, uint64(e.n))
			}
		}
	case SlidingWindow:
		b = binary.AppendVarint(b, s.at)
		b = binary.AppendUvarint(b, uint64(s.prev))
		b = binary.AppendUvarint(b, uint64(s.cur))
	case TokenBucket:
		b = binary.AppendVarint(b, s.at)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.tokens))
	}
	if version == usageVersion {
		b = s.appendReservations(b)
	}
	return b
}

func (s *state) appendHeader(b []byte, version byte) []byte {
	b = append(b, version, byte(s.algo))
	if version == lineageVersion || version == usageVersion {
		b = binary.LittleEndian.AppendUint64(b, s.lineage)
	}
	b = binary.AppendUvarint(b, uint64(s.limit))
	return binary.AppendUvarint(b, uint64(s.window))
}

// saved is what the store holds of a key's sliding log, kept by the actor
// next to the state so that a write can append the hits recorded since the
// last one (appendTail) instead of the whole log. The zero value knows
// nothing: the next write is a full one.
//
// It holds no flag of its own: the store holds the log as of the last
// write when full is not 0 (a full segment is never empty), which keeps an
// entry in memory at 176 bytes, an allocation size class.
type saved struct {
	// at and n are the newest run of the log as last written.
	at, n int64
	// disk is the length of the stored value; full that of its full
	// segment, 0 when the store's copy is not known.
	disk, full uint32
}

// known reports whether the store holds the log as of the last write.
func (sv *saved) known() bool { return sv.full != 0 }

// written records that the store now holds the full encoding of s, of n
// bytes.
func (s *state) written(sv *saved, n int) {
	*sv = saved{}
	s.rewrite = false
	if s.algo != SlidingLog || len(s.buf) == 0 || n > math.MaxUint32/4 {
		return
	}
	last := s.runAt(len(s.buf) - 1)
	*sv = saved{at: last.at, n: last.n, disk: uint32(n), full: uint32(max(n, 1))}
}

// appendTail appends to b a tail segment holding the hits recorded since the
// store's copy was written (see saved), and reports whether it did. It does
// not when only a full write can bring the store up to date (no copy known,
// or the log changed other than by new hits); when every hit of the copy has
// expired at now (the full log is then just the new hits, and the store
// need not look for a value that may be gone); or when the stored value has
// grown to twice its full segment (plus a little): expired runs pile up in
// a chain, and a full write now and then sheds them, for an amortized
// constant number of bytes per hit.
func (s *state) appendTail(b []byte, sv *saved, now int64) ([]byte, bool) {
	if !sv.known() || s.rewrite || s.algo != SlidingLog || len(s.buf) == 0 || s.expired(sv.at, now) {
		return b, false
	}
	// The runs newer than the saved newest run, and the hits added to that
	// run (if it has not expired since).
	i := len(s.buf)
	for i > 0 && s.runAt(i-1).at > sv.at {
		i--
	}
	var more int64
	if i > 0 {
		if r := s.runAt(i - 1); r.at == sv.at {
			more = r.n - sv.n
		}
	}
	count := len(s.buf) - i
	if more > 0 {
		count++
	}
	if count == 0 || more < 0 {
		return b, false
	}
	start := len(b)
	b = s.appendHeader(b, tailVersion)
	b = binary.AppendUvarint(b, uint64(count))
	prev := int64(0)
	first := true
	if more > 0 {
		b = binary.AppendVarint(b, sv.at)
		b = binary.AppendUvarint(b, uint64(more))
		prev, first = sv.at, false
	}
	for j := i; j < len(s.buf); j++ {
		r := s.runAt(j)
		if first {
			b = binary.AppendVarint(b, r.at)
			first = false
		} else {
			b = binary.AppendUvarint(b, uint64(r.at-prev))
		}
		b = binary.AppendUvarint(b, uint64(r.n))
		prev = r.at
	}
	n := len(b) - start
	if uint64(sv.disk)+uint64(n) > 2*uint64(sv.full)+512 {
		return b[:start], false
	}
	last := s.runAt(len(s.buf) - 1)
	sv.at, sv.n, sv.disk = last.at, last.n, sv.disk+uint32(n)
	return b, true
}

// decoder reads the encoding; its first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	switch {
	case n == 0:
		d.err = fmt.Errorf("%s: truncated", what)
		return 0
	case n < 0 || v > math.MaxInt64:
		d.err = fmt.Errorf("%s: overflows int64", what)
		return 0
	}
	d.b = d.b[n:]
	return int64(v)
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	switch {
	case n == 0:
		d.err = fmt.Errorf("%s: truncated", what)
		return 0
	case n < 0:
		d.err = fmt.Errorf("%s: overflows int64", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

// decode replaces s with the state encoded in b. It returns an error, and
// leaves s as it was, for any input that appendBinary and appendTail did not
// produce.
func (s *state) decode(b []byte) error {
	if len(b) < 2 {
		return fmt.Errorf("actor: decode state: %d bytes; want at least 2", len(b))
	}
	var t state
	for seg := 0; len(b) > 0; seg++ {
		if len(b) < 2 {
			return fmt.Errorf("actor: decode state: segment %d: %d bytes; want at least 2", seg, len(b))
		}
		switch {
		case b[0] != stateVersion && b[0] != tailVersion && b[0] != lineageVersion && b[0] != usageVersion:
			return fmt.Errorf("actor: decode state: segment %d: unknown encoding version %d (want %d, %d, %d or %d)", seg, b[0], stateVersion, tailVersion, lineageVersion, usageVersion)
		case seg > 0 && b[0] != tailVersion:
			return fmt.Errorf("actor: decode state: segment %d: version %d after the first segment; want %d", seg, b[0], tailVersion)
		case b[1] >= byte(numAlgorithms):
			return fmt.Errorf("actor: decode state: unknown algorithm %d", b[1])
		case seg > 0 && Algorithm(b[1]) != SlidingLog:
			return fmt.Errorf("actor: decode state: segment %d: only a sliding log has more than one segment", seg)
		}
		t.algo = Algorithm(b[1])
		d := decoder{b: b[2:]}
		if b[0] == lineageVersion || b[0] == usageVersion {
			switch {
			case len(d.b) < 8:
				return fmt.Errorf("actor: decode state: %s: lineage: truncated", t.algo)
			case b[0] == lineageVersion && binary.LittleEndian.Uint64(d.b) == 0:
				return fmt.Errorf("actor: decode state: %s: lineage 0 in a segment of version %d", t.algo, lineageVersion)
			}
			t.lineage = binary.LittleEndian.Uint64(d.b)
			d.b = d.b[8:]
		}
		t.decodeSegment(&d, seg, b[0])
		if d.err != nil {
			return fmt.Errorf("actor: decode state: %s: %v", t.algo, d.err)
		}
		if t.algo != SlidingLog && len(d.b) > 0 {
			return fmt.Errorf("actor: decode state: %s: %d trailing bytes", t.algo, len(d.b))
		}
		b = d.b
	}
	t.rewrite = true
	*s = t
	return nil
}

// decodeSegment reads the rest of segment seg, of the given version (after
// its version, algorithm and lineage) into t, appending to t's log.
func (t *state) decodeSegment(d *decoder, seg int, version byte) {
	t.decodeFields(d, seg, version)
	if version == usageVersion {
		t.decodeReservations(d)
		if d.err == nil && t.res == nil && !(t.tokens < 0) {
			// What appendBinary writes as version 4 only.
			d.fail("version %d without reservations or debt", usageVersion)
		}
	}
}

// decodeFields reads the limit, window and algorithm fields of a segment.
func (t *state) decodeFields(d *decoder, seg int, version byte) {
	t.limit = d.uvarint("limit")
	t.window = d.uvarint("window")
	if d.err == nil && t.limit <= 0 {
		d.fail("limit %d is not positive", t.limit)
	}
	if d.err == nil && t.window <= 0 {
		d.fail("window %d is not positive", t.window)
	}
	switch t.algo {
	case SlidingLog:
		count := d.uvarint("log length")
		// Each run takes at least 2 bytes: refuse to allocate for runs that
		// are not there.
		if d.err == nil && count > int64(len(d.b)/2) {
			d.fail("log of %d runs in %d bytes", count, len(d.b))
		}
		if d.err == nil && count+int64(len(t.buf)) > maxMaxRuns {
			d.fail("log of %d runs; at most %d", count+int64(len(t.buf)), maxMaxRuns)
		}
		if d.err != nil || count == 0 {
			return
		}
		// Capacity rounded to the allocation's size class, as when the log
		// grows in logAdd (the ring wraps at cap(buf)).
		t.buf = slices.Grow(t.buf, int(count))
		var at int64
		for i := range count {
			if i == 0 {
				at = d.varint("timestamp")
			} else {
				delta := d.uvarint("timestamp delta")
				if d.err == nil && delta == 0 {
					d.fail("segment %d, run %d: timestamp equal to the previous one", seg, i)
				}
				if d.err == nil && at > math.MaxInt64-delta {
					d.fail("segment %d, run %d: timestamp overflows int64", seg, i)
				}
				at += delta
			}
			n := d.uvarint("count")
			if d.err == nil && n <= 0 {
				d.fail("segment %d, run %d: count %d is not positive", seg, i, n)
			}
			if d.err == nil && t.cur > math.MaxInt64-n {
				d.fail("segment %d, run %d: total count overflows int64", seg, i)
			}
			if d.err != nil {
				return
			}
			t.cur += n
			if k := len(t.buf); k > 0 && i == 0 {
				// The first run of a tail segment: the same time as the
				// run before adds to it; an earlier one is not a log.
				switch last := &t.buf[k-1]; {
				case at == last.at:
					last.n += n
					continue
				case at < last.at:
					d.fail("segment %d: run at %d before the previous segment's last run at %d", seg, at, last.at)
					return
				}
			}
			t.buf = append(t.buf, run{at, n})
		}
	case SlidingWindow:
		t.at = d.varint("bucket start")
		t.prev = d.uvarint("previous bucket")
		t.cur = d.uvarint("current bucket")
	case TokenBucket:
		t.at = d.varint("refill time")
		if d.err == nil && len(d.b) < 8 {
			d.fail("tokens: truncated")
		}
		if d.err == nil {
			t.tokens = math.Float64frombits(binary.LittleEndian.Uint64(d.b))
			d.b = d.b[8:]
			lo := 0.0
			if version == usageVersion {
				lo = -float64(t.limit)
			}
			if !(t.tokens >= lo && t.tokens <= float64(t.limit)) { // also NaN
				d.fail("tokens %v outside [%v, %d]", t.tokens, lo, t.limit)
			}
		}
	}
}

// --- Arithmetic ---------------------------------------------------------------

// floorDiv returns floor(a/b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// satAdd returns a+b for a, b >= 0, saturated at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// mulDivCeil returns ceil(a*b/c) for a >= 0, 0 <= b <= c, c > 0, without
// overflow (the result is at most a).
func mulDivCeil(a, b, c int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, r := bits.Div64(hi, lo, uint64(c)) // hi < c since a < 2^63 and b <= c
	if r != 0 {
		q++
	}
	return int64(q)
}

// mulDivFloor returns floor(a*b/c) for a, b >= 0 and c > 0, without
// overflow; a result above math.MaxInt64 saturates.
func mulDivFloor(a, b, c int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

// CheckStored returns why value, a key's state as the store holds it,
// cannot be decoded, or nil: what a load would find. sluice data verify
// checks every record of a data file with it.
func CheckStored(value []byte) error {
	var st state
	return st.decode(value)
}
