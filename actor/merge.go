package actor

import (
	"math"
	"slices"
)

// This file combines two states of the same key, for when the key's ownership
// moves between nodes or copies of its state meet: the new owner may already
// hold hits for the key (those it recorded while the old owner was
// unreachable, or an older copy from before a crash) and receives the old
// owner's state; a standby's copy meets the returning owner's disk; several
// nodes' copies of one key meet on a node that lost its disk.
//
// Two states are either copies of one history (the same non-zero lineage:
// the same state, written to disk and to a standby, perhaps one of them
// further along) or states that counted different hits (different or
// unknown lineages: each hit was recorded by one of them). The first merge
// idempotently (each hit they share is counted once), the second add up
// (the union of their hits). Either way the merged state counts at least
// what either side counted: ownership moving never hands out a free window.

// merge folds o into s at time now (unix ns), so that from now on s counts
// at least what s and o each counted before. o is not changed (o may be s
// itself). maxRuns bounds the sliding log as in decide.
//
// An empty side contributes nothing:
//
//   - A side that is not a valid state (zero value: a key never seen) or
//     holds nothing at now (isEmpty) contributes nothing. If s holds nothing
//     and o is valid, s becomes a copy of o: algorithm, limit, window,
//     lineage and all (s's own history has ended; the result is o's, and
//     later copies of o's history merge with it idempotently). If o holds
//     nothing, s is left exactly as it was.
//
// Same non-zero lineage: s and o are copies of one history (versions of one
// state, as the owner wrote it to its disk and to its standby, one perhaps
// further along or with hits the other never received). Counting the hits
// they share twice would deny for nothing, so they merge by the larger
// count, not the sum (join):
//
//   - SlidingLog: the union of the live runs, with the larger count at an
//     equal timestamp, then kept to the newest limit+1 hits as below.
//   - SlidingWindow: both are advanced to the bucket of now; per bucket the
//     larger count. If one's bucket is ahead of now (a clock that went
//     back), its grid is kept and the other's estimate at now becomes its
//     current bucket if that is larger.
//   - TokenBucket: both are refilled to the same time, now, and the fewer
//     tokens (more used) win. If a side's refill time is ahead of now (a
//     clock that went back), the merged bucket refills from that time.
//
// This is a join: merge(s, s) is s, the result does not depend on the
// order in which copies are merged (commutative and associative: with the
// same algorithm, limit and window, and no state ahead of now), and it
// counts at every later time at least what each side counts (for the log,
// up to limit+1 hits, beyond which no decision changes). It forgets nothing
// a copy holds: hits only one copy has (recorded by an owner after its last
// write reached the standby, or by a standby that took over) are kept, as
// long as they are at another timestamp or bucket than the other copy's
// hits; at the same one the larger count wins, which is exact for copies of
// one history, where the smaller count is a prefix of the larger. If the
// sides differ in algorithm, limit or window (one copy missed a change),
// the parameters of the side that was written last (the later latest
// time; ties broken by algorithm, limit, window) apply, the other side is
// converted to them as a check bringing them would (resize, convert), and
// the two are joined; the order of merges then matters only through that
// conversion.
//
// Different lineages, or one unknown (0): s and o counted different hits,
// and merge adds them up (sum). The result keeps s's lineage if it has one,
// else o's: it is s's history, which received o's hits (o's later copies
// then add up with it again: conservative).
//
//   - If s holds hits, s keeps its algorithm, limit and window, and o's hits
//     are judged against them from now on, as resize and convert do for a
//     check that brings other values; the next check applies its own
//     anyway. What expired at now under o's own window stays expired.
//
// Same algorithm: with t any time from now on, s₀ and o the states before
// the merge, and used(t) = usedAt(t) with no further hits:
//
//   - SlidingLog: the union of the live runs, sorted, equal timestamps adding
//     their counts (merge alone counts the same hit handed over twice
//     twice: conservative; importStates keeps a receipt so that it does
//     not, see excess). With equal windows and a limit at most maxRuns,
//     used(t) = min(s₀.used(t) + o.used(t), limit+1) exactly (with another
//     window, o's hits count while they are live under both). Only the
//     newest limit+1 hits are kept: as for penalties (logDecide), that
//     changes no decision, remaining, retryAfter or resetAfter until the
//     limit is raised or hits are refunded, and the log holds at most limit+1
//     runs. When the limit is above maxRuns, timestamps are rounded up to the
//     resolution as logAdd does (at most maxRuns+1 runs); should runs ahead
//     of now (a clock ahead) still exceed min(limit, maxRuns)+1, the oldest
//     are folded into the next one: hits are only moved later, never
//     forgotten.
//   - SlidingWindow: both are advanced to the bucket of now; on the same
//     grid, previous and current buckets add up, so the merged state is the
//     one that recorded every hit of both, and s₀.used(t), o.used(t) <=
//     used(t) <= s₀.used(t)+o.used(t). Sums are not capped at the limit as
//     penalties are: a bucket becomes the previous one and weighs in the next
//     window, where a cap would return capacity before the union's hits have
//     expired; they saturate at MaxInt64. If o has another window, or its
//     bucket is behind s's (a clock that went back), its estimate at now,
//     which bounds its count at every later time, joins s's current bucket,
//     the rule of resize; if o's bucket is ahead of s's, o's buckets are kept
//     and s's estimate joins o's current bucket.
//   - TokenBucket: both are refilled to now at their own rates, then
//     used = used_s + used_o (used = limit - tokens), so tokens = tokens_s +
//     tokens_o - limit with equal limits, clamped to [0, limit]: a single
//     bucket charged with the hits both consumed. This is never above
//     min(tokens_s, tokens_o), which would only bound each side and let a key
//     whose nodes were split spend up to twice the limit without paying for
//     it. A bucket keeps no history, so no merge can account for each side
//     having refilled on its own during the split: the merged bucket counts
//     at least what each side counts, not what one bucket that saw every
//     hit would. If o's refill time is ahead of now, the merged bucket
//     refills from that time.
//
// Different algorithms: o is converted to s's with convert's rule (the hits
// o counts at now become hits recorded in s's algorithm), then merged as
// above. They are recorded at now, or at o's latest time if that is ahead of
// now (a clock ahead), never earlier.
//
// merge never panics, whatever the states.
func (s *state) merge(now int64, o *state, maxRuns int) {
	maxRuns = max(1, min(maxRuns, maxMaxRuns))
	res := unionReservations(now, s, o)
	defer func() {
		s.rewrite = true
		if s.valid() {
			s.res = res
		}
	}()
	if !o.valid() {
		return
	}
	if !s.valid() || s.isEmpty(now) {
		if o != s {
			*s = o.clone()
		}
		return
	}
	if o.isEmpty(now) {
		return
	}
	if o == s {
		c := o.clone()
		o = &c
	}
	if s.lineage != 0 && s.lineage == o.lineage {
		s.join(now, o, maxRuns)
		return
	}
	if s.lineage == 0 {
		s.lineage = o.lineage
	}
	if o.algo != s.algo {
		t := o.converted(now, s.algo, s.limit, s.window, maxRuns)
		if !t.valid() {
			return
		}
		o = &t
	}
	switch s.algo {
	case SlidingLog:
		s.logMerge(now, o, maxRuns)
	case SlidingWindow:
		s.windowMerge(now, o)
	case TokenBucket:
		s.bucketMerge(now, o)
	}
}

// excess returns what s holds beyond old, where old is an earlier version
// of s's history (or several joined): the hits of s that old lacks, per
// timestamp (log), per bucket (window) or in tokens used at now (bucket),
// as a state of s's lineage and parameters, or the zero state if old holds
// all of s. Added up with a state that holds old's hits (merge), it counts
// each hit of s's history once: per instant that state's other hits plus
// max(old, s), what it would count had it taken the join of old and s. If
// old cannot be set beside s (other parameters, another bucket grid, a
// refill time that differs), excess is all of s: its hits that old holds
// count twice, which only denies more.
func (s *state) excess(now int64, old *state, maxRuns int) state {
	if !s.valid() || s.isEmpty(now) {
		return state{}
	}
	e := s.clone()
	if !old.valid() || old.isEmpty(now) || old.algo != s.algo || old.limit != s.limit || old.window != s.window {
		return e
	}
	switch s.algo {
	case SlidingLog:
		prior := old.appendEntries(nil)
		var out []run
		j := 0
		for _, r := range s.appendEntries(nil) {
			for j < len(prior) && prior[j].at < r.at {
				j++
			}
			n := r.n
			if j < len(prior) && prior[j].at == r.at {
				n -= prior[j].n
			}
			if n > 0 && !s.expired(r.at, now) && (len(out) == 0 || r.at > out[len(out)-1].at) {
				out = append(out, run{r.at, n})
			}
		}
		e.setLog(out, maxRuns, len(out))
	case SlidingWindow:
		e.windowAdvance(now)
		t := *old
		t.windowAdvance(now)
		if t.at != e.at {
			return s.clone()
		}
		e.prev, e.cur = max(0, e.prev-t.prev), max(0, e.cur-t.cur)
	case TokenBucket:
		e.bucketRefill(now)
		t := *old
		t.bucketRefill(now)
		if t.at != e.at {
			return s.clone()
		}
		used := t.tokens - e.tokens // what s used beyond old
		if !(used > 0) {
			return state{}
		}
		e.tokens = float64(e.limit) - used
	}
	if e.isEmpty(now) {
		return state{}
	}
	return e
}

// converted returns s's hits as a state of another algorithm, limit and
// window (convert's rule, as merge applies it): the hits s counts at now,
// recorded at now or at s's latest time if that is ahead of now, of s's
// lineage. It returns the zero state if s counts nothing at now.
func (s *state) converted(now int64, algo Algorithm, limit, window int64, maxRuns int) state {
	used := s.usedAt(now)
	if used <= 0 {
		return state{}
	}
	at := max(now, s.latest())
	var t state
	t.reset(at, algo, limit, window)
	t.lineage = s.lineage
	switch algo {
	case SlidingLog:
		t.logAdd(at, used, maxRuns)
	case SlidingWindow:
		t.cur = used
	case TokenBucket:
		t.tokens = max(0, float64(limit)-float64(used))
	}
	return t
}

// join merges o into s, both valid, holding hits at now and of the same
// lineage: copies of one history (see merge).
func (s *state) join(now int64, o *state, maxRuns int) {
	if s.algo != o.algo || s.limit != o.limit || s.window != o.window {
		// One copy missed a change of parameters: the one written last
		// sets them, and the other is converted.
		if paramsFirst(s, o) {
			u := *s // s's log goes with it: s gets a copy of o's
			*s = o.clone()
			o = &u
		}
		var t state
		if o.algo != s.algo {
			t = o.converted(now, s.algo, s.limit, s.window, maxRuns)
		} else {
			t = o.clone()
			t.resize(now, s.limit, s.window)
		}
		if !t.valid() || t.isEmpty(now) {
			return
		}
		o = &t
	}
	switch s.algo {
	case SlidingLog:
		s.logJoin(now, o, maxRuns)
	case SlidingWindow:
		s.windowJoin(now, o)
	case TokenBucket:
		s.bucketJoin(now, o)
	}
}

// paramsFirst reports whether a's parameters give way to b's in a join:
// b was written last (its latest time is later), or, at the same time, its
// algorithm, limit and window sort after a's.
func paramsFirst(a, b *state) bool {
	if x, y := a.latest(), b.latest(); x != y {
		return x < y
	}
	if a.algo != b.algo {
		return a.algo < b.algo
	}
	if a.limit != b.limit {
		return a.limit < b.limit
	}
	return a.window < b.window
}

// valid reports whether s is a state decide could have built: a known
// algorithm and positive limit and window (the zero value is not).
func (s *state) valid() bool {
	return s.limit > 0 && s.window > 0 && s.algo < numAlgorithms
}

// latest returns the latest time s refers to: the newest run of the log, the
// start of the current bucket, the last refill. It is later than now only
// when the clock went back since s was written.
func (s *state) latest() int64 {
	switch s.algo {
	case SlidingLog:
		if len(s.buf) > 0 {
			return s.runAt(len(s.buf) - 1).at
		}
		return math.MinInt64
	}
	return s.at
}

// logMerge makes s's log the union of s's and o's live runs, equal
// timestamps adding up (see merge).
func (s *state) logMerge(now int64, o *state, maxRuns int) {
	res := s.logRes(maxRuns)
	live := func(w, at int64) bool { return at > now-w } // !expired under window w
	a := make([]run, 0, len(s.buf)+len(o.buf))
	a = s.appendEntries(a)
	b := o.appendEntries(nil)
	out := make([]run, 0, len(a)+len(b))
	add := func(r run) {
		if r.n <= 0 {
			return
		}
		at := roundUp(r.at, res)
		if k := len(out) - 1; k >= 0 && at <= out[k].at {
			// Equal timestamps add (and a run out of order moves later).
			out[k].n = satAdd(out[k].n, r.n)
			return
		}
		out = append(out, run{at, r.n})
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		if j == len(b) || i < len(a) && a[i].at <= b[j].at {
			if live(s.window, a[i].at) {
				add(a[i])
			}
			i++
			continue
		}
		if live(o.window, b[j].at) && live(s.window, b[j].at) {
			add(b[j])
		}
		j++
	}
	s.setLog(out, maxRuns, 0)
}

// logJoin makes s's log the union of s's and o's live runs, the larger
// count winning at an equal timestamp (see merge). o has s's limit and
// window.
//
// Timestamps are not rounded to the resolution (as logMerge does): copies
// with the same parameters are on the same grid already, and rounding the
// runs a state recorded under other parameters would move them each time,
// so that merge(s, s) would not be s. So that the log stays bounded all the
// same, it holds at most as many runs as the longer side, or
// min(limit, maxRuns)+1 if that is more: beyond, the oldest are folded into
// the next one.
func (s *state) logJoin(now int64, o *state, maxRuns int) {
	side := func(x *state) []run {
		out := make([]run, 0, len(x.buf))
		a, b := x.segments()
		for _, seg := range [2][]run{a, b} {
			for _, r := range seg {
				if r.n > 0 && !x.expired(r.at, now) && (len(out) == 0 || r.at > out[len(out)-1].at) {
					out = append(out, r)
				}
			}
		}
		return out
	}
	a, b := side(s), side(o)
	out := make([]run, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || i < len(a) && a[i].at < b[j].at:
			out = append(out, a[i])
			i++
		case i == len(a) || b[j].at < a[i].at:
			out = append(out, b[j])
			j++
		default:
			out = append(out, run{a[i].at, max(a[i].n, b[j].n)})
			i++
			j++
		}
	}
	s.setLog(out, maxRuns, max(len(a), len(b)))
}

// logRes returns the resolution of s's log timestamps: 1 ns, or
// ceil(window/maxRuns) when the limit is above maxRuns (see logAdd).
func (s *state) logRes(maxRuns int) int64 {
	if s.limit <= int64(maxRuns) {
		return 1
	}
	res := s.window / int64(maxRuns)
	if s.window%int64(maxRuns) != 0 {
		res++
	}
	return res
}

// setLog makes out (runs oldest first, at increasing times, each n > 0) s's
// log, keeping its newest limit+1 hits (the rule of logDecide's penalties)
// and at most max(min(limit, maxRuns)+1, most) runs, the oldest folded into
// the next one beyond that.
func (s *state) setLog(out []run, maxRuns, most int) {
	keep := satAdd(s.limit, 1)
	var used int64
	for k := len(out) - 1; k >= 0; k-- {
		if out[k].n >= keep-used {
			out[k].n = keep - used
			out = out[k:]
			used = keep
			break
		}
		used += out[k].n // < keep: no overflow
	}
	// Runs ahead of now may still exceed the bound: fold the oldest forward.
	bound := max(int(min(s.limit, int64(maxRuns)))+1, most)
	for len(out) > bound {
		out[1].n += out[0].n // the sum is at most keep
		out = out[1:]
	}
	buf := s.buf[:0]
	if cap(buf) < len(out) {
		// Sized as logAdd grows it (the allocation is rounded up to its
		// size class).
		buf = slices.Grow([]run(nil), len(out))
	}
	s.buf = append(buf, out...)
	s.head = 0
	s.cur = used
}

// roundUp returns the first multiple of res at or after at (res > 0),
// saturated at MaxInt64.
func roundUp(at, res int64) int64 {
	if res <= 1 {
		return at
	}
	q := floorDiv(at, res) * res
	if q == at {
		return at
	}
	if q > math.MaxInt64-res {
		return math.MaxInt64
	}
	return q + res
}

// windowMerge adds o's buckets to s's (see merge).
func (s *state) windowMerge(now int64, o *state) {
	s.windowAdvance(now)
	t := *o
	t.windowAdvance(now)
	if t.window == s.window {
		switch {
		case t.at == s.at:
			s.prev = satAdd(s.prev, t.prev)
			s.cur = satAdd(s.cur, t.cur)
			return
		case t.at > s.at:
			// o's clock was ahead: keep its grid, and s's estimate at now
			// joins its current bucket.
			est := s.windowEstimate(now)
			s.at, s.prev, s.cur = t.at, t.prev, satAdd(t.cur, est)
			return
		}
	}
	s.cur = satAdd(s.cur, t.windowEstimate(now))
}

// bucketMerge charges s with what o consumed (see merge).
func (s *state) bucketMerge(now int64, o *state) {
	s.bucketRefill(now)
	t := *o
	t.bucketRefill(now)
	used := float64(t.limit) - t.tokens
	if math.IsNaN(used) {
		used = float64(t.limit)
	}
	if used <= 0 {
		return
	}
	tokens := s.tokens - used
	switch {
	case !(tokens > 0): // also NaN
		tokens = 0
	case tokens > float64(s.limit):
		tokens = float64(s.limit)
	}
	s.tokens = tokens
	s.at = max(s.at, t.at)
}

// windowJoin takes per bucket the larger of s's and o's counts (see merge).
// o has s's window.
func (s *state) windowJoin(now int64, o *state) {
	s.windowAdvance(now)
	t := *o
	t.windowAdvance(now)
	switch {
	case t.at == s.at:
		s.prev, s.cur = max(s.prev, t.prev), max(s.cur, t.cur)
	case t.at > s.at:
		// o's clock was ahead: keep its grid; s's estimate at now bounds
		// what s counts at every later time.
		est := s.windowEstimate(now)
		s.at, s.prev, s.cur = t.at, t.prev, max(t.cur, est)
	default:
		s.cur = max(s.cur, t.windowEstimate(now))
	}
}

// bucketJoin keeps the fewer of s's and o's tokens, both refilled to now
// (see merge). o has s's limit and window. If a side's refill time is ahead
// of now, the merged bucket refills from that time: it holds no more tokens
// than either side at any later time.
func (s *state) bucketJoin(now int64, o *state) {
	s.bucketRefill(now)
	t := *o
	t.bucketRefill(now)
	if !(t.tokens >= s.tokens) { // fewer, or NaN
		s.tokens = t.tokens
	}
	if !(s.tokens >= 0) { // also NaN
		s.tokens = 0
	}
	s.at = max(s.at, t.at)
}
