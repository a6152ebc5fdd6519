package actor

import (
	"math"
	"slices"
)

// This file combines two states of the same key, for when the key's ownership
// moves between nodes: the new owner may already hold hits for the key (those
// it recorded while the old owner was unreachable, or an older copy from
// before a crash) and receives the old owner's state. The two hold different
// hits (each hit was recorded by one node), so the merged state counts their
// union, and never less than either of them: ownership moving never hands
// out a free window.

// merge folds o into s at time now (unix ns), so that from now on s counts
// at least what s and o each counted before, and as nearly as the algorithm
// can tell, the union of their hits. o is not changed (o may be s itself:
// then every hit counts twice). maxRuns bounds the sliding log as in decide.
//
// Which side decides the parameters:
//
//   - A side that is not a valid state (zero value: a key never seen) or
//     holds nothing at now (isEmpty) contributes nothing. If s holds nothing
//     and o is valid, s becomes a copy of o: algorithm, limit, window and all.
//     If o holds nothing, s is left exactly as it was.
//   - Otherwise s keeps its algorithm, limit and window, and o's hits are
//     judged against them from now on, as resize and convert do for a check
//     that brings other values; the next check applies its own anyway.
//     What expired at now under o's own window stays expired.
//
// Same algorithm: with t any time from now on, s₀ and o the states before
// the merge, and used(t) = usedAt(t) with no further hits:
//
//   - SlidingLog: the union of the live runs, sorted, equal timestamps adding
//     their counts (the same hit handed over twice therefore counts twice:
//     conservative). With equal windows and a limit at most maxRuns,
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
	defer func() { s.rewrite = true }()
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
	if o.algo != s.algo {
		used := o.usedAt(now)
		if used <= 0 {
			return
		}
		at := max(now, o.latest())
		var t state
		t.reset(at, s.algo, s.limit, s.window)
		switch s.algo {
		case SlidingLog:
			t.logAdd(at, used, maxRuns)
		case SlidingWindow:
			t.cur = used
		case TokenBucket:
			t.tokens = max(0, float64(s.limit)-float64(used))
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

// logMerge makes s's log the union of s's and o's live runs (see merge).
func (s *state) logMerge(now int64, o *state, maxRuns int) {
	var res int64 = 1
	if s.limit > int64(maxRuns) {
		res = s.window / int64(maxRuns)
		if s.window%int64(maxRuns) != 0 {
			res++
		}
	}
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
	// Keep the newest limit+1 hits (the rule of logDecide's penalties).
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
	bound := int(min(s.limit, int64(maxRuns))) + 1
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
