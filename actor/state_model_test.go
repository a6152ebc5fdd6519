package actor

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// stLogModel is the reference sliding log: every recorded hit, oldest first,
// never merged or trimmed, and decisions computed by brute force.
type stLogModel struct {
	limit, window int64
	res           int64 // timestamps are rounded up to a multiple of res (1: exact)
	hits          []run
}

func (m *stLogModel) used(now int64) int64 {
	var u int64
	for _, h := range m.hits {
		if now < h.at+m.window {
			u += h.n
		}
	}
	return u
}

func (m *stLogModel) decide(now int64, c *Check) Decision {
	// Hits expired by now under the window in force stay expired, even if
	// this check brings a longer window.
	m.hits = slices.DeleteFunc(m.hits, func(h run) bool { return now >= h.at+m.window })
	m.limit, m.window = c.Limit, int64(c.Window)
	// Expired hits are forgotten at each check: a clock that goes back later
	// does not bring them back either.
	m.hits = slices.DeleteFunc(m.hits, func(h run) bool { return now >= h.at+m.window })
	d := Decision{Limit: m.limit}
	used := m.used(now)
	switch {
	case c.Refund:
		d.Allowed = true
		for n := c.Cost; n > 0 && len(m.hits) > 0; {
			last := &m.hits[len(m.hits)-1]
			take := min(n, last.n)
			last.n -= take
			n -= take
			if last.n == 0 {
				m.hits = m.hits[:len(m.hits)-1]
			}
		}
	case c.Cost == 0:
		d.Allowed = used <= m.limit
	default:
		d.Allowed = used+c.Cost <= m.limit
		if d.Allowed || c.Penalty {
			at := (now + m.res - 1) / m.res * m.res // now > 0
			if len(m.hits) > 0 {
				at = max(at, m.hits[len(m.hits)-1].at)
			}
			m.hits = append(m.hits, run{at, c.Cost})
		}
	}
	d.Remaining = max(0, m.limit-m.used(now))
	for _, h := range m.hits {
		if now < h.at+m.window {
			d.ResetAfter = max(d.ResetAfter, time.Duration(h.at+m.window-now))
		}
	}
	if !d.Allowed {
		// The used count only drops when a hit expires: try each expiry.
		var times []int64
		for _, h := range m.hits {
			if now < h.at+m.window {
				times = append(times, h.at+m.window)
			}
		}
		slices.Sort(times)
		for _, t := range times {
			if m.used(t)+c.Cost <= m.limit {
				d.RetryAfter = time.Duration(t - now)
				break
			}
		}
	}
	return d
}

// stTraffic is a random stream of checks on one key.
type stTraffic struct {
	rng           *rand.Rand
	limit, window int64
	refunds       bool // refund some hits
	penalties     bool // ask for penalties on some checks
	resizes       bool // change limit and window now and then
	costOne       bool // cost 1 only (to measure stAdmission)
	jitter        bool // let the clock go back now and then
}

// next returns the gap before the next check and the check.
func (tr *stTraffic) next(c *Check) int64 {
	r := tr.rng
	if tr.resizes && r.IntN(50) == 0 {
		tr.limit = 1 + r.Int64N(2*tr.limit+2)
		tr.window = max(1, tr.window/2+r.Int64N(tr.window+1))
	}
	*c = Check{Key: "k", Limit: tr.limit, Window: time.Duration(tr.window), Cost: 1}
	if !tr.costOne {
		c.Cost = r.Int64N(tr.limit + 1)
		if r.IntN(2) == 0 {
			c.Cost = min(c.Cost, 1+r.Int64N(3)) // mostly small
		}
	}
	c.Refund = tr.refunds && r.IntN(15) == 0
	c.Penalty = tr.penalties && r.IntN(3) == 0
	// Gaps: often none (equal timestamps), often a fraction of the time a hit
	// takes to return, sometimes longer than the window.
	mean := max(1, tr.window/tr.limit)
	if tr.jitter && r.IntN(20) == 0 {
		return -r.Int64N(2 * mean)
	}
	switch r.IntN(10) {
	case 0, 1:
		return 0
	case 2:
		return r.Int64N(2 * tr.window)
	case 3:
		return r.Int64N(10)
	default:
		return r.Int64N(mean)
	}
}

// stMaxInWindow returns the largest sum of n over hits inside any interval of
// length window (hits sorted by time).
func stMaxInWindow(hits []run, window int64) int64 {
	var most, sum int64
	j := 0
	for i, h := range hits {
		sum += h.n
		for hits[j].at <= hits[i].at-window {
			sum -= hits[j].n
			j++
		}
		most = max(most, sum)
	}
	return most
}

// TestModelSlidingLog runs random stTraffic through the sliding log and checks
// that every decision (allowed, remaining, retryAfter, resetAfter) equals
// the brute-force model's, and the exactness invariant: no interval as long
// as the window ever holds more allowed hits than the limit. With penalties,
// the model keeps every recorded hit while the log keeps the newest limit+1,
// which shows that trimming changes no decision (penalties and refunds are
// not mixed: a refund after trimming forgets the trimmed hits, as
// documented in logDecide).
func TestModelSlidingLog(t *testing.T) {
	type scenario struct {
		name                        string
		refunds, penalties, resizes bool
		jitter                      bool
		maxRuns                     int
		invariant                   bool
	}
	for _, sc := range []scenario{
		{name: "plain", maxRuns: stMaxRuns, invariant: true},
		{name: "penalties", penalties: true, maxRuns: stMaxRuns, invariant: true},
		{name: "refunds and resizes", refunds: true, resizes: true, maxRuns: stMaxRuns},
		{name: "clock going back, refunds", jitter: true, refunds: true, maxRuns: stMaxRuns},
		{name: "clock going back, penalties", jitter: true, penalties: true, maxRuns: stMaxRuns},
		{name: "rounded", maxRuns: 7, invariant: true},
		{name: "rounded, resizes, clock going back", maxRuns: 7, resizes: true, jitter: true},
		{name: "rounded with penalties", maxRuns: 7, penalties: true, invariant: true},
	} {
		for _, limit := range []int64{1, 3, 10, 100} {
			for _, window := range []time.Duration{stMs, 7 * stSec, stMin} {
				seed := uint64(limit)<<32 ^ uint64(window)
				rng := rand.New(rand.NewPCG(seed, 1))
				tr := stTraffic{rng: rng, limit: limit, window: int64(window), refunds: sc.refunds, penalties: sc.penalties, resizes: sc.resizes, jitter: sc.jitter}
				var s state
				m := stLogModel{res: 1}
				var allowed []run
				now := st0
				var c Check
				for i := range 3000 {
					now += tr.next(&c)
					m.res = 1
					if c.Limit > int64(sc.maxRuns) {
						m.res = (int64(c.Window) + int64(sc.maxRuns) - 1) / int64(sc.maxRuns)
					}
					var got Decision
					s.decide(now, &c, sc.maxRuns, &got)
					want := m.decide(now, &c)
					if got != want {
						t.Fatalf("%s limit %d window %v check %d: decide(cost=%d refund=%v penalty=%v limit=%d window=%v at t=%v) = %+v; want %+v",
							sc.name, limit, window, i, c.Cost, c.Refund, c.Penalty, c.Limit, c.Window, time.Duration(now-st0), got, want)
					}
					checkStateWellFormed(t, &s)
					if i%97 == 0 {
						cl := s.clone()
						if a, b := s.appendEntries(nil), cl.appendEntries(nil); !slices.Equal(a, b) {
							t.Fatalf("clone of log %v (head %d, cap %d) = %v", a, s.head, cap(s.buf), b)
						}
					}
					if n := len(s.buf); int64(n) > min(c.Limit, int64(sc.maxRuns))+1 && !sc.resizes {
						t.Fatalf("%s limit %d window %v check %d: %d runs", sc.name, limit, window, i, n)
					}
					if got.Allowed && !c.Refund && c.Cost > 0 {
						allowed = append(allowed, run{now, c.Cost})
					}
				}
				if most := stMaxInWindow(allowed, int64(window)); sc.invariant && most > limit {
					t.Errorf("%s limit %d window %v: %d hits allowed in one window", sc.name, limit, window, most)
				}
			}
		}
	}
}

// stAdmission runs stTraffic through a fresh state of algo and returns the
// allowed hits.
func stAdmission(algo Algorithm, limit int64, window time.Duration, seed uint64, n int, burstAtEnd bool) []run {
	rng := rand.New(rand.NewPCG(seed, 2))
	tr := stTraffic{rng: rng, limit: limit, window: int64(window), costOne: true}
	var s state
	var allowed []run
	now := st0
	var c Check
	var d Decision
	if burstAtEnd {
		// The adversary of the documented bound: the limit at the last ns of
		// a bucket, then as much as allowed.
		now += int64(window) - 1
		c = Check{Key: "k", Limit: limit, Window: window, Algorithm: algo, Cost: limit}
		s.decide(now, &c, stMaxRuns, &d)
		allowed = append(allowed, run{now, limit})
	}
	for range n {
		gap := tr.next(&c)
		if burstAtEnd {
			gap = max(1, int64(window)/limit/8)
		}
		now += gap
		c.Algorithm = algo
		if s.decide(now, &c, stMaxRuns, &d); d.Allowed {
			allowed = append(allowed, run{now, c.Cost})
		}
	}
	return allowed
}

func stSumHits(hits []run) (n int64) {
	for _, h := range hits {
		n += h.n
	}
	return n
}

// TestModelApproximateBounds measures the error of the two approximate
// algorithms on the same stTraffic as the exact log, and checks their
// documented bounds: the sliding window counter allows fewer than 2*limit
// hits in any interval of length window, the token bucket at most 2*limit.
func TestModelApproximateBounds(t *testing.T) {
	type figures struct {
		worst      float64 // max hits in one window / limit, over all runs
		sumRatio   float64 // sum over runs of allowed / exact log's allowed
		minRatio   float64
		maxRatio   float64
		runs       int
		worstLimit int64
	}
	for _, burst := range []bool{false, true} {
		stats := map[Algorithm]*figures{}
		for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
			stats[algo] = &figures{minRatio: 1e9}
		}
		for _, limit := range []int64{1, 2, 5, 10, 100, 1000} {
			for _, window := range []time.Duration{stMs, stSec, stMin} {
				for seed := range uint64(3) {
					seed := seed<<40 ^ uint64(limit)<<20 ^ uint64(window)
					exact := stSumHits(stAdmission(SlidingLog, limit, window, seed, 4000, burst))
					for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
						hits := stAdmission(algo, limit, window, seed, 4000, burst)
						most := stMaxInWindow(hits, int64(window))
						switch algo {
						case SlidingLog:
							if most > limit {
								t.Errorf("%v limit %d window %v: %d hits in one window; want at most %d", algo, limit, window, most, limit)
							}
						case SlidingWindow:
							if most >= 2*limit {
								t.Errorf("%v limit %d window %v: %d hits in one window; want fewer than %d", algo, limit, window, most, 2*limit)
							}
						case TokenBucket:
							if most > 2*limit {
								t.Errorf("%v limit %d window %v: %d hits in one window; want at most %d", algo, limit, window, most, 2*limit)
							}
						}
						f := stats[algo]
						if w := float64(most) / float64(limit); w > f.worst {
							f.worst, f.worstLimit = w, limit
						}
						r := float64(stSumHits(hits)) / float64(exact)
						f.sumRatio += r
						f.minRatio = min(f.minRatio, r)
						f.maxRatio = max(f.maxRatio, r)
						f.runs++
					}
				}
			}
		}
		pattern := "random traffic"
		if burst {
			pattern = "limit at the end of a bucket, then greedy"
		}
		for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
			f := stats[algo]
			t.Logf("%s, %v: worst window %.3f x limit (limit %d); allowed vs exact log: mean %.3f, min %.3f, max %.3f over %d runs",
				pattern, algo, f.worst, f.worstLimit, f.sumRatio/float64(f.runs), f.minRatio, f.maxRatio, f.runs)
		}
	}
}

// TestModelConsistency runs random traffic (random costs, refunds,
// penalties, new limits and windows, algorithm switches, a clock that goes
// back) through each algorithm and checks after every decision that the same
// check is allowed at now+RetryAfter and not 1ns earlier, that the key is
// empty at now+ResetAfter (its deadline) and not 1ns earlier, that Remaining
// matches usedAt, and that the state survives an encoding round trip.
func TestModelConsistency(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		for _, limit := range []int64{1, 3, 10, 1000} {
			for _, window := range []time.Duration{stMs, 7 * stSec, 24 * time.Hour} {
				seed := uint64(algo)<<56 ^ uint64(limit)<<32 ^ uint64(window)
				rng := rand.New(rand.NewPCG(seed, 3))
				tr := stTraffic{rng: rng, limit: limit, window: int64(window), refunds: true, penalties: true, resizes: true, jitter: true}
				var s state
				now := st0
				var c Check
				for i := range 2000 {
					now += tr.next(&c)
					c.Algorithm = algo
					if rng.IntN(100) == 0 {
						c.Algorithm = Algorithm(rng.IntN(3))
					}
					var d Decision
					s.decide(now, &c, 50, &d)
					checkStateConsistent(t, &s, now, &c, 50, &d)
					if i%13 == 0 {
						var u state
						if err := u.decode(s.appendBinary(nil)); err != nil || !stSame(&s, &u) {
							t.Fatalf("%v check %d: decode(appendBinary(%+v)) = %+v, %v", algo, i, s, u, err)
						}
					}
				}
			}
		}
	}
}
