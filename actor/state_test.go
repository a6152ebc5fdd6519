package actor

import (
	"math"
	"testing"
	"time"
)

// st0 is a minute boundary (and so a multiple of every window in these tests),
// in unix ns.
var st0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano()

const stMaxRuns = 1000

// stStep is one check of a scripted test: at st0+at, Cost hits (with the case's
// limit, window and algorithm unless the stStep overrides them).
type stStep struct {
	at      time.Duration
	cost    int64
	refund  bool
	penalty bool
	limit   int64         // 0: the case's
	window  time.Duration // 0: the case's
	want    Decision
	changed bool // checked only when checkChanged
}

type stScript struct {
	name         string
	algo         Algorithm
	limit        int64
	window       time.Duration
	maxRuns      int // 0: stMaxRuns
	checkChanged bool
	steps        []stStep
}

func (sc stScript) check(st stStep) Check {
	c := Check{Key: "k", Limit: sc.limit, Window: sc.window, Algorithm: sc.algo, Cost: st.cost, Refund: st.refund, Penalty: st.penalty}
	if st.limit != 0 {
		c.Limit = st.limit
	}
	if st.window != 0 {
		c.Window = st.window
	}
	return c
}

func runStateScripts(t *testing.T, scripts []stScript) {
	t.Helper()
	for _, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) {
			maxRuns := sc.maxRuns
			if maxRuns == 0 {
				maxRuns = stMaxRuns
			}
			var s state
			for _, st := range sc.steps {
				c := sc.check(st)
				now := st0 + int64(st.at)
				var d Decision
				changed := s.decide(now, &c, maxRuns, &d)
				if d != st.want {
					t.Fatalf("decide(cost=%d refund=%v penalty=%v at t=%v) = %+v; want %+v", st.cost, st.refund, st.penalty, st.at, d, st.want)
				}
				if sc.checkChanged && changed != st.changed {
					t.Fatalf("decide(cost=%d refund=%v penalty=%v at t=%v) changed = %v; want %v", st.cost, st.refund, st.penalty, st.at, changed, st.changed)
				}
				checkStateConsistent(t, &s, now, &c, maxRuns, &d)
			}
		})
	}
}

// checkStateConsistent checks what must hold after any decision d made at now:
// the check is allowed again at now+RetryAfter and not 1ns earlier; the
// state is empty at now+ResetAfter (= deadline) and not 1ns earlier; the log
// is well formed.
func checkStateConsistent(t *testing.T, s *state, now int64, c *Check, maxRuns int, d *Decision) {
	t.Helper()
	checkStateWellFormed(t, s)
	if d.Allowed != (d.RetryAfter == 0) {
		t.Fatalf("decide(cost=%d at t=%v) = %+v: Allowed and RetryAfter disagree", c.Cost, time.Duration(now-st0), d)
	}
	if !d.Allowed && d.RetryAfter != never {
		retry := now + int64(d.RetryAfter)
		peek := *c
		peek.Penalty = false
		if got := stateTryAt(s, retry, &peek, maxRuns); !got.Allowed {
			t.Fatalf("decide(cost=%d at t=%v) = %+v; but at t+RetryAfter the same check = %+v; want allowed", c.Cost, time.Duration(now-st0), d, got)
		}
		if got := stateTryAt(s, retry-1, &peek, maxRuns); got.Allowed {
			t.Fatalf("decide(cost=%d at t=%v) = %+v; but 1ns before t+RetryAfter the same check = %+v; want denied", c.Cost, time.Duration(now-st0), d, got)
		}
	}
	dl := s.deadline()
	switch {
	case d.ResetAfter < 0:
		t.Fatalf("decide(cost=%d at t=%v) = %+v: negative ResetAfter", c.Cost, time.Duration(now-st0), d)
	case d.ResetAfter == 0:
		if !s.isEmpty(now) {
			t.Fatalf("decide(cost=%d at t=%v) = %+v, but isEmpty(now) = false (used %d)", c.Cost, time.Duration(now-st0), d, s.usedAt(now))
		}
	default:
		if dl != now+int64(d.ResetAfter) {
			t.Fatalf("decide(cost=%d at t=%v) = %+v, but deadline() = t+%v", c.Cost, time.Duration(now-st0), d, time.Duration(dl-now))
		}
		if s.isEmpty(dl - 1) {
			t.Fatalf("decide(cost=%d at t=%v) = %+v, but isEmpty(t+ResetAfter-1ns) = true", c.Cost, time.Duration(now-st0), d)
		}
	}
	if dl != 0 && !s.isEmpty(dl) {
		t.Fatalf("isEmpty(deadline()) = false after decide(cost=%d at t=%v) = %+v (used %d)", c.Cost, time.Duration(now-st0), d, s.usedAt(dl))
	}
	if d.Remaining < 0 || d.Remaining > d.Limit {
		t.Fatalf("decide(cost=%d at t=%v) = %+v: Remaining out of [0, limit]", c.Cost, time.Duration(now-st0), d)
	}
	if used := s.usedAt(now); d.Remaining != max(0, d.Limit-used) {
		t.Fatalf("decide(cost=%d at t=%v) = %+v, but usedAt(now) = %d", c.Cost, time.Duration(now-st0), d, used)
	}
}

// checkStateWellFormed checks the invariants of the representation.
func checkStateWellFormed(t *testing.T, s *state) {
	t.Helper()
	if int(s.head) >= max(cap(s.buf), 1) {
		t.Fatalf("head %d outside a ring of %d", s.head, cap(s.buf))
	}
	if s.algo != SlidingLog {
		if cap(s.buf) != 0 {
			t.Fatalf("%v state holds a log of capacity %d", s.algo, cap(s.buf))
		}
		if s.prev < 0 || s.cur < 0 || s.tokens < -float64(s.limit) || s.tokens > float64(s.limit) {
			t.Fatalf("%v state out of range: %+v", s.algo, *s)
		}
		return
	}
	var sum int64
	r := s.appendEntries(nil)
	for i, e := range r {
		if e.n <= 0 || (i > 0 && e.at <= r[i-1].at) {
			t.Fatalf("malformed log %v", r)
		}
		sum += e.n
	}
	if sum != s.cur {
		t.Fatalf("log %v sums to %d; cur = %d", r, sum, s.cur)
	}
}

// stateTryAt returns the decision of c at now on a copy of s.
func stateTryAt(s *state, now int64, c *Check, maxRuns int) Decision {
	t := s.clone()
	var d Decision
	t.decide(now, c, maxRuns, &d)
	return d
}

func stAllow(limit, remaining int64, reset time.Duration) Decision {
	return Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func stDeny(limit, remaining int64, retry, reset time.Duration) Decision {
	return Decision{Limit: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

const (
	stMs  = time.Millisecond
	stSec = time.Second
	stMin = time.Minute
)

// TestDecideSlidingLog is the sliding log's specification, stStep by stStep.
func TestDecideSlidingLog(t *testing.T) {
	runStateScripts(t, []stScript{
		{
			name: "allows up to the limit then denies", limit: 3, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(3, 2, 60*stSec), changed: true},
				{at: 1 * stSec, cost: 1, want: stAllow(3, 1, 60*stSec), changed: true},
				{at: 2 * stSec, cost: 1, want: stAllow(3, 0, 60*stSec), changed: true},
				{at: 3 * stSec, cost: 1, want: stDeny(3, 0, 57*stSec, 59*stSec)},
				{at: 4 * stSec, cost: 0, want: stAllow(3, 0, 58*stSec)},
			},
		},
		{
			name: "no double burst across a clock-aligned boundary", limit: 3, window: stMin,
			steps: []stStep{
				{at: stMin - 3*stMs, cost: 1, want: stAllow(3, 2, stMin)},
				{at: stMin - 2*stMs, cost: 1, want: stAllow(3, 1, stMin)},
				{at: stMin - 1*stMs, cost: 1, want: stAllow(3, 0, stMin)},
				{at: stMin, cost: 1, want: stDeny(3, 0, stMin-3*stMs, stMin-1*stMs)},
				{at: stMin + 1*stMs, cost: 1, want: stDeny(3, 0, stMin-4*stMs, stMin-2*stMs)},
				{at: 2*stMin - 3*stMs, cost: 1, want: stAllow(3, 0, stMin)},
			},
		},
		{
			name: "capacity returns exactly at t+window", limit: 1, window: stMin,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(1, 0, stMin)},
				{at: stMin - 1, cost: 1, want: stDeny(1, 0, 1, 1)},
				{at: stMin, cost: 1, want: stAllow(1, 0, stMin)},
			},
		},
		{
			name: "hammering a closed door without penalty does not extend the wait", limit: 2, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 2, want: stAllow(2, 0, stMin), changed: true},
				{at: 10 * stSec, cost: 1, want: stDeny(2, 0, 50*stSec, 50*stSec)},
				{at: 30 * stSec, cost: 1, want: stDeny(2, 0, 30*stSec, 30*stSec)},
				{at: 59 * stSec, cost: 1, want: stDeny(2, 0, 1*stSec, 1*stSec)},
				{at: stMin, cost: 1, want: stAllow(2, 1, stMin), changed: true},
			},
		},
		{
			name: "with penalty, hammering extends the wait", limit: 2, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 2, penalty: true, want: stAllow(2, 0, stMin), changed: true},
				// Recorded: 2 at 0, 1 at 10s (kept: the newest limit+1 = 3).
				// Cost 1 fits when 3-(2-1) = 2 oldest have expired: at 0+1m.
				{at: 10 * stSec, cost: 1, penalty: true, want: stDeny(2, 0, 50*stSec, stMin), changed: true},
				// 2 at 0, 1 at 10s, 1 at 30s -> trimmed to 1 at 0, 1 at 10s, 1 at 30s:
				// the 2 oldest expire at 10s+1m.
				{at: 30 * stSec, cost: 1, penalty: true, want: stDeny(2, 0, 40*stSec, stMin), changed: true},
				// At 1m (where it would have been allowed without penalty):
				// 1 at 10s, 1 at 30s, 1 at 1m.
				{at: stMin, cost: 1, penalty: true, want: stDeny(2, 0, 30*stSec, stMin), changed: true},
				// 1 at 30s, 1 at 1m, 1 at 1m10s.
				{at: stMin + 10*stSec, cost: 1, penalty: true, want: stDeny(2, 0, 50*stSec, stMin), changed: true},
				{at: 3 * stMin, cost: 1, penalty: true, want: stAllow(2, 1, stMin), changed: true},
			},
		},
		{
			name: "penalty with a cost above the room records it", limit: 5, window: stMin,
			steps: []stStep{
				{at: 0, cost: 3, penalty: true, want: stAllow(5, 2, stMin)},
				// 3+4 > 5: recorded anyway (7, trimmed to the newest 6: 2 at 0, 4 at 1s).
				// Cost 4 fits when used <= 1: once the run at 0 (2) and the run at 1s expire.
				{at: 1 * stSec, cost: 4, penalty: true, want: stDeny(5, 0, stMin, stMin)},
				{at: stMin, cost: 2, want: stDeny(5, 1, 1*stSec, 1*stSec)},
				{at: stMin + 1*stSec, cost: 5, want: stAllow(5, 0, stMin)},
			},
		},
		{
			name: "retryAfter for cost 1 and cost 3", limit: 5, window: stMin,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(5, 4, stMin)},
				{at: 10 * stSec, cost: 2, want: stAllow(5, 2, stMin)},
				{at: 20 * stSec, cost: 1, want: stAllow(5, 1, stMin)},
				{at: 25 * stSec, cost: 1, want: stAllow(5, 0, stMin)},
				// Cost 1: one hit must expire, the one at 0.
				{at: 30 * stSec, cost: 1, want: stDeny(5, 0, 30*stSec, 55*stSec)},
				// Cost 3: three must expire: 1 at 0 and 2 at 10s.
				{at: 30 * stSec, cost: 3, want: stDeny(5, 0, 40*stSec, 55*stSec)},
				// Cost 4: 1+2+1.
				{at: 30 * stSec, cost: 4, want: stDeny(5, 0, 50*stSec, 55*stSec)},
				{at: stMin, cost: 2, want: stDeny(5, 1, 10*stSec, 25*stSec)},
				{at: stMin + 10*stSec, cost: 3, want: stAllow(5, 0, stMin)},
			},
		},
		{
			name: "peek records nothing", limit: 2, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 0, want: stAllow(2, 2, 0)},
				{at: 1 * stSec, cost: 1, want: stAllow(2, 1, stMin), changed: true},
				{at: 2 * stSec, cost: 0, want: stAllow(2, 1, 59*stSec)},
				{at: 3 * stSec, cost: 0, penalty: true, want: stAllow(2, 1, 58*stSec)},
				{at: 4 * stSec, cost: 1, want: stAllow(2, 0, stMin), changed: true},
				{at: 5 * stSec, cost: 0, want: stAllow(2, 0, stMin-stSec)},
			},
		},
		{
			name: "refund removes the newest hits", limit: 5, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 2, want: stAllow(5, 3, stMin), changed: true},
				{at: 10 * stSec, cost: 3, want: stAllow(5, 0, stMin), changed: true},
				{at: 20 * stSec, cost: 1, want: stDeny(5, 0, 40*stSec, 50*stSec)},
				// 1 of the 3 at 10s.
				{at: 20 * stSec, cost: 1, refund: true, want: stAllow(5, 1, 50*stSec), changed: true},
				// The other 2 at 10s, then 1 of the 2 at 0.
				{at: 20 * stSec, cost: 3, refund: true, want: stAllow(5, 4, 40*stSec), changed: true},
				// More than recorded: down to zero, allowed.
				{at: 20 * stSec, cost: 5, refund: true, want: stAllow(5, 5, 0), changed: true},
				{at: 20 * stSec, cost: 5, refund: true, want: stAllow(5, 5, 0)},
				{at: 21 * stSec, cost: 5, want: stAllow(5, 0, stMin), changed: true},
			},
		},
		{
			name: "limit lowered and raised applies without reset", limit: 4, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 3, want: stAllow(4, 1, stMin), changed: true},
				{at: 1 * stSec, cost: 1, limit: 2, want: stDeny(2, 0, 59*stSec, 59*stSec), changed: true},
				{at: 2 * stSec, cost: 0, limit: 2, want: stDeny(2, 0, 58*stSec, 58*stSec)},
				{at: 3 * stSec, cost: 1, limit: 10, want: stAllow(10, 6, stMin), changed: true},
				{at: 4 * stSec, cost: 7, limit: 10, want: stDeny(10, 6, 56*stSec, 59*stSec)},
				{at: 5 * stSec, cost: 6, limit: 10, want: stAllow(10, 0, stMin), changed: true},
			},
		},
		{
			name: "window changed applies without reset", limit: 2, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(2, 1, stMin), changed: true},
				{at: 10 * stSec, cost: 1, want: stAllow(2, 0, stMin), changed: true},
				// Longer window: the hits at 0 and 10s now count until 2m and 2m10s.
				{at: 50 * stSec, cost: 1, window: 2 * stMin, want: stDeny(2, 0, 70*stSec, 80*stSec), changed: true},
				// Shorter window: they expired at 30s and 40s.
				{at: 100 * stSec, cost: 2, window: 30 * stSec, want: stAllow(2, 0, 30*stSec), changed: true},
			},
		},
		{
			name: "a longer window does not revive expired hits", limit: 1, window: stMin,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(1, 0, stMin)},
				{at: 61 * stSec, cost: 1, window: 2 * stMin, want: stAllow(1, 0, 2*stMin)},
			},
		},
		{
			name: "equal timestamps merge", limit: 10, window: stMin,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(10, 9, stMin)},
				{at: 0, cost: 2, want: stAllow(10, 7, stMin)},
				{at: 0, cost: 3, want: stAllow(10, 4, stMin)},
				{at: 1, cost: 4, want: stAllow(10, 0, stMin)},
				{at: 2, cost: 1, want: stDeny(10, 0, stMin-2, stMin-1)},
			},
		},
		{
			name: "a clock that goes back never frees anything", limit: 2, window: stMin,
			steps: []stStep{
				{at: 10 * stSec, cost: 1, want: stAllow(2, 1, stMin)},
				// Recorded at 10s, not 5s: expires at 70s.
				{at: 5 * stSec, cost: 1, want: stAllow(2, 0, 65*stSec)},
				{at: 69 * stSec, cost: 1, want: stDeny(2, 0, 1*stSec, 1*stSec)},
				{at: 70 * stSec, cost: 2, want: stAllow(2, 0, stMin)},
			},
		},
	})
}

// TestDecideSlidingLogRounding covers a limit above maxRuns: timestamps are
// rounded up to ceil(window/maxRuns).
func TestDecideSlidingLogRounding(t *testing.T) {
	runStateScripts(t, []stScript{
		func() stScript {
			// res = ceil(60s/7) = 8571428572ns; st0 rounds up to st0+off.
			const res = 8571428572
			off := time.Duration((st0+res-1)/res*res - st0)
			return stScript{
				name: "rounded up to the resolution", limit: 100, window: stMin, maxRuns: 7,
				steps: []stStep{
					{at: 0, cost: 60, want: stAllow(100, 40, off+stMin)},
					{at: 1, cost: 40, want: stAllow(100, 0, off+stMin-1)},
					{at: 2, cost: 1, want: stDeny(100, 0, off+stMin-2, off+stMin-2)},
					{at: off + stMin - 1, cost: 1, want: stDeny(100, 0, 1, 1)},
					// 1m = 7*res - 4ns: recorded 4ns later.
					{at: off + stMin, cost: 60, want: stAllow(100, 40, stMin+4)},
					{at: off + stMin + 1, cost: 40, want: stAllow(100, 0, stMin+3)},
					{at: off + stMin + 2, cost: 0, want: stAllow(100, 0, stMin+2)},
				},
			}
		}(),
	})
}

// TestStateLogRunsBounded checks that the log never holds more runs than
// the limit (limit+1 with penalties), nor more than maxRuns+1 when the
// limit is above maxRuns, and that these bounds are reached.
func TestStateLogRunsBounded(t *testing.T) {
	const window = 1999 * time.Microsecond // res = 1999ns for maxRuns 1000
	for _, tc := range []struct {
		limit   int64
		maxRuns int
		penalty bool
		step    func(i int) int64 // ns to the next check
		bound   int
		tight   bool // the bound must be reached
	}{
		{limit: 50, maxRuns: 1000, bound: 50, tight: true},
		{limit: 50, maxRuns: 1000, penalty: true, bound: 51, tight: true},
		{limit: 1000, maxRuns: 1000, bound: 1000, tight: true},
		{limit: 1000, maxRuns: 1000, penalty: true, bound: 1001, tight: true},
		{limit: 1001, maxRuns: 1000, bound: 1001},
		{limit: 1999, maxRuns: 1000, bound: 1001},
		{limit: 1_000_000, maxRuns: 1000, bound: 1001},
		{limit: 1_000_000, maxRuns: 1000, penalty: true, bound: 1001},
		{limit: 1_000_000, maxRuns: 1000, step: func(int) int64 { return 1000 }, bound: 1001, tight: true},
		{limit: 100, maxRuns: 7, penalty: true, bound: 8},
	} {
		step := tc.step
		if step == nil {
			// Distinct times, about 2000 checks per window.
			step = func(i int) int64 { return 1 + int64(i%7)*int64(window)/6000 }
		}
		c := Check{Key: "k", Limit: tc.limit, Window: window, Cost: 1, Penalty: tc.penalty}
		var s state
		var d Decision
		most := 0
		now := st0
		for i := range 20000 {
			now += step(i)
			s.decide(now, &c, tc.maxRuns, &d)
			most = max(most, len(s.buf))
		}
		if most > tc.bound || tc.tight && most != tc.bound {
			t.Errorf("limit %d, maxRuns %d, penalty %v: at most %d runs; want %d", tc.limit, tc.maxRuns, tc.penalty, most, tc.bound)
		}
		if cap(s.buf) > 2*tc.bound {
			t.Errorf("limit %d, maxRuns %d: ring capacity %d for at most %d runs", tc.limit, tc.maxRuns, cap(s.buf), tc.bound)
		}
	}
}

// TestDecideSlidingWindow is the sliding window counter's specification.
func TestDecideSlidingWindow(t *testing.T) {
	runStateScripts(t, []stScript{
		{
			name: "allows up to the limit in a bucket", algo: SlidingWindow, limit: 3, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(3, 2, 2*stMin), changed: true},
				{at: 10 * stSec, cost: 2, want: stAllow(3, 0, 2*stMin-10*stSec), changed: true},
				// In the next bucket, prev=3 weighs ceil(3*(60-e)/60): 2 from e=20s.
				{at: 30 * stSec, cost: 1, want: stDeny(3, 0, 50*stSec, 90*stSec)},
				{at: 80 * stSec, cost: 1, want: stAllow(3, 0, 100*stSec), changed: true},
				{at: 90 * stSec, cost: 0, want: stAllow(3, 0, 90*stSec)},
				// Cost 2 needs ceil(3*(60-e)/60) + 1 <= 1: e = 60s, the next bucket,
				// where prev = 1: ceil((60-e)/60) <= 1 holds at once.
				{at: 90 * stSec, cost: 2, want: stDeny(3, 0, 30*stSec, 90*stSec)},
				{at: 2 * stMin, cost: 2, want: stAllow(3, 0, 2*stMin), changed: true},
				// Empty two windows later.
				{at: 4 * stMin, cost: 0, want: stAllow(3, 3, 0)},
			},
		},
		{
			name: "limit at the end of a bucket is not doubled", algo: SlidingWindow, limit: 10, window: stMin,
			steps: []stStep{
				{at: stMin - 1, cost: 10, want: stAllow(10, 0, stMin+1)},
				// prev = 10 weighs ceil(10*(60s-e)/60s): 9 from e = 6s.
				{at: stMin, cost: 1, want: stDeny(10, 0, 6*stSec, stMin)},
				{at: stMin + 6*stSec, cost: 1, want: stAllow(10, 0, 2*stMin-6*stSec)},
				// After the adversarial burst, [1m-1ns, 2m-1ns) holds 10+1+8 = 2*limit-1.
				{at: 2*stMin - 1, cost: 8, want: stAllow(10, 0, stMin+1)},
			},
		},
		{
			name: "penalty caps the bucket at the limit", algo: SlidingWindow, limit: 3, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 2, penalty: true, want: stAllow(3, 1, 2*stMin), changed: true},
				{at: 1 * stSec, cost: 3, penalty: true, want: stDeny(3, 0, 2*stMin-1*stSec, 2*stMin-1*stSec), changed: true},
				{at: 2 * stSec, cost: 3, penalty: true, want: stDeny(3, 0, 2*stMin-2*stSec, 2*stMin-2*stSec)},
			},
		},
		{
			name: "refund", algo: SlidingWindow, limit: 3, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 50 * stSec, cost: 2, want: stAllow(3, 1, 70*stSec), changed: true},
				{at: 70 * stSec, cost: 1, want: stAllow(3, 0, 110*stSec), changed: true},
				// cur 1 then prev 1.
				{at: 70 * stSec, cost: 2, refund: true, want: stAllow(3, 2, 50*stSec), changed: true},
				{at: 70 * stSec, cost: 5, refund: true, want: stAllow(3, 3, 0), changed: true},
				{at: 70 * stSec, cost: 5, refund: true, want: stAllow(3, 3, 0)},
			},
		},
		{
			name: "limit and window changes keep the count", algo: SlidingWindow, limit: 4, window: stMin, checkChanged: true,
			steps: []stStep{
				{at: 10 * stSec, cost: 4, want: stAllow(4, 0, 2*stMin-10*stSec), changed: true},
				{at: 20 * stSec, cost: 2, limit: 6, want: stAllow(6, 0, 2*stMin-20*stSec), changed: true},
				// Window 30s: the estimate 6 becomes the current bucket [0, 30s) of the new grid.
				{at: 25 * stSec, cost: 1, window: 30 * stSec, limit: 6, want: stDeny(6, 0, 10*stSec, 35*stSec), changed: true},
			},
		},
	})
}

// TestDecideTokenBucket is the token bucket's specification.
func TestDecideTokenBucket(t *testing.T) {
	runStateScripts(t, []stScript{
		{
			name: "burst then refill", algo: TokenBucket, limit: 3, window: 3 * stSec, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 0, want: stAllow(3, 3, 0)},
				{at: 0, cost: 3, want: stAllow(3, 0, 3*stSec), changed: true},
				{at: 0, cost: 1, want: stDeny(3, 0, 1*stSec, 3*stSec)},
				{at: 500 * stMs, cost: 2, want: stDeny(3, 0, 1500*stMs, 2500*stMs)},
				{at: 1 * stSec, cost: 1, want: stAllow(3, 0, 3*stSec), changed: true},
				{at: 2500 * stMs, cost: 1, want: stAllow(3, 0, 2500*stMs), changed: true},
				{at: 10 * stSec, cost: 0, want: stAllow(3, 3, 0)},
			},
		},
		{
			name: "three refills of a third make one", algo: TokenBucket, limit: 1, window: 3 * stMs,
			steps: []stStep{
				{at: 0, cost: 1, want: stAllow(1, 0, 3*stMs)},
				{at: 1 * stMs, cost: 0, want: stAllow(1, 0, 2*stMs)},
				{at: 2 * stMs, cost: 0, want: stAllow(1, 0, 1*stMs)},
				{at: 3 * stMs, cost: 1, want: stAllow(1, 0, 3*stMs)},
			},
		},
		{
			name: "penalty drains to zero", algo: TokenBucket, limit: 4, window: 4 * stSec, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 3, want: stAllow(4, 1, 3*stSec), changed: true},
				{at: 0, cost: 2, penalty: true, want: stDeny(4, 0, 2*stSec, 4*stSec), changed: true},
				{at: 1 * stSec, cost: 2, penalty: true, want: stDeny(4, 0, 2*stSec, 4*stSec), changed: true},
			},
		},
		{
			name: "refund", algo: TokenBucket, limit: 4, window: 4 * stSec, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 4, want: stAllow(4, 0, 4*stSec), changed: true},
				{at: 0, cost: 1, refund: true, want: stAllow(4, 1, 3*stSec), changed: true},
				{at: 0, cost: 9, refund: true, want: stAllow(4, 4, 0), changed: true},
				{at: 0, cost: 1, refund: true, want: stAllow(4, 4, 0)},
			},
		},
		{
			name: "limit and window changes keep what was used", algo: TokenBucket, limit: 10, window: 10 * stSec, checkChanged: true,
			steps: []stStep{
				{at: 0, cost: 10, want: stAllow(10, 0, 10*stSec), changed: true},
				// 2 refilled, 8 used; limit 20: 12 tokens, refilled at 2 per s.
				{at: 2 * stSec, cost: 12, limit: 20, want: stAllow(20, 0, 10*stSec), changed: true},
				// 4 refilled at 2 per s, 16 used; limit 5: 0 tokens, refilled at 0.5 per s.
				{at: 4 * stSec, cost: 1, limit: 5, want: stDeny(5, 0, 2*stSec, 10*stSec), changed: true},
				// 0.5 refilled; window 1s: refill 5 per s.
				{at: 5 * stSec, cost: 1, limit: 5, window: 1 * stSec, want: stDeny(5, 0, 100*stMs, 900*stMs), changed: true},
				{at: 5*stSec + 100*stMs, cost: 1, limit: 5, window: 1 * stSec, want: stAllow(5, 0, 1*stSec), changed: true},
			},
		},
	})
}

// TestDecideAlgorithmChange checks that switching algorithms never hands out
// a free window: the used count carries over, as hits recorded at now.
func TestDecideAlgorithmChange(t *testing.T) {
	for _, from := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		for _, to := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
			if from == to {
				continue
			}
			var s state
			c := Check{Key: "k", Limit: 10, Window: stMin, Algorithm: from, Cost: 7}
			var d Decision
			s.decide(st0, &c, stMaxRuns, &d)
			c.Algorithm, c.Cost = to, 4
			if changed := s.decide(st0+int64(stSec), &c, stMaxRuns, &d); !changed || d.Allowed || d.Remaining != 3 {
				t.Errorf("%v -> %v: decide(cost=4) = %+v, changed %v; want denied with 3 remaining, changed", from, to, d, changed)
			}
			checkStateConsistent(t, &s, st0+int64(stSec), &c, stMaxRuns, &d)
			c.Cost = 3
			if s.decide(st0+int64(stSec), &c, stMaxRuns, &d); !d.Allowed || d.Remaining != 0 {
				t.Errorf("%v -> %v: decide(cost=3) = %+v; want allowed with 0 remaining", from, to, d)
			}
			checkStateConsistent(t, &s, st0+int64(stSec), &c, stMaxRuns, &d)
		}
	}
}

// TestDecideNeverPanics feeds checks that validation would reject.
func TestDecideNeverPanics(t *testing.T) {
	bad := []Check{
		{Limit: 0, Window: stMin, Cost: 1},
		{Limit: -1, Window: stMin, Cost: 1},
		{Limit: 1, Window: 0, Cost: 1},
		{Limit: 1, Window: -1, Cost: 1},
		{Limit: 1, Window: stMin, Cost: -1},
		{Limit: 1, Window: stMin, Cost: 2},
		{Limit: 1, Window: stMin, Cost: 2, Penalty: true},
		{Limit: 1, Window: stMin, Cost: math.MaxInt64, Refund: true},
		{Limit: 1, Window: stMin, Algorithm: 9, Cost: 1},
		{Limit: math.MaxInt64, Window: math.MaxInt64, Cost: math.MaxInt64},
		{Limit: math.MaxInt64, Window: 1, Cost: math.MaxInt64, Penalty: true, Algorithm: SlidingWindow},
		{Limit: math.MaxInt64, Window: 1, Cost: math.MaxInt64, Algorithm: TokenBucket},
	}
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		for _, maxRuns := range []int{-1, 0, 1, math.MaxInt} {
			var s state
			var d Decision
			for i, now := range []int64{math.MinInt64, -1, 0, st0, st0, st0 + 1, math.MaxInt64, st0} {
				for _, c := range bad {
					c.Algorithm += algo
					s.decide(now, &c, maxRuns, &d)
					s.deadline()
					s.isEmpty(now)
					s.usedAt(now)
					var u state
					if err := u.decode(s.appendBinary(nil)); err != nil && s.limit > 0 {
						t.Fatalf("stStep %d: decode(appendBinary(%+v)): %v", i, s, err)
					}
				}
			}
		}
	}
}
