package actor

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// usStep is one check of a usage script: a usage report (or a peek) at
// st0+at, and the decision wanted.
type usStep struct {
	at    time.Duration
	cost  int64
	usage bool // a usage report (or usage peek); false: a plain check
	want  Decision
}

// TestUsageOverLimit is the specification of usage reports: recorded
// whatever the limit, denied once the key is at or over its limit, and a
// wait, for each algorithm, until the key is back below its limit.
func TestUsageOverLimit(t *testing.T) {
	deny := func(limit, remaining int64, retry, reset time.Duration) Decision {
		return Decision{Limit: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
	}
	for _, tc := range []struct {
		name   string
		algo   Algorithm
		limit  int64
		window time.Duration
		steps  []usStep
	}{
		{
			// The example: 900 of 1,000 spent, then a report of 500.
			name: "sliding log", algo: SlidingLog, limit: 1000, window: stMin,
			steps: []usStep{
				{at: 0, cost: 900, want: stAllow(1000, 100, stMin)},
				{at: stSec, cost: 500, usage: true, want: deny(1000, 0, 59*stSec, 60*stSec)},
				// A cost-0 check of the request path: over the limit until
				// the 900 leave (the 500 alone are under it).
				{at: 30 * stSec, cost: 0, usage: true, want: deny(1000, 0, 30*stSec, 31*stSec)},
				{at: stMin - 1, cost: 0, usage: true, want: deny(1000, 0, 1, stSec+1)},
				{at: stMin, cost: 0, usage: true, want: stAllow(1000, 500, stSec)},
				// A plain check of cost 600 still has to wait for the 500.
				{at: stMin, cost: 600, want: deny(1000, 500, stSec, stSec)},
				{at: stMin + stSec, cost: 0, usage: true, want: stAllow(1000, 1000, 0)},
			},
		},
		{
			name: "sliding log at the limit", algo: SlidingLog, limit: 10, window: stSec,
			steps: []usStep{
				{at: 0, cost: 10, usage: true, want: stAllow(10, 0, stSec)},
				// A plain peek passes at the limit; a usage peek does not.
				{at: stMs, cost: 0, want: stAllow(10, 0, stSec-stMs)},
				{at: stMs, cost: 0, usage: true, want: deny(10, 0, stSec-stMs, stSec-stMs)},
				// A report far above the limit: recorded, a window's wait
				// (only its newest 11 hits are kept: the rest change no
				// decision).
				{at: 2 * stMs, cost: 1000, usage: true, want: deny(10, 0, stSec, stSec)},
				{at: stSec + 2*stMs, cost: 0, usage: true, want: stAllow(10, 10, 0)},
			},
		},
		{
			// 150 in a bucket of 100/min starting at 0: in the next bucket
			// they weigh 150×(1-e), under 100 (99 for a usage peek) from
			// e = 1 - 99/150 = 0.34, 20.4s into it.
			name: "sliding window counter", algo: SlidingWindow, limit: 100, window: stMin,
			steps: []usStep{
				{at: 0, cost: 150, usage: true, want: deny(100, 0, stMin+20400*stMs, 2*stMin)},
				{at: stMin + 20400*stMs - 1, cost: 0, usage: true, want: deny(100, 0, 1, stMin-20400*stMs+1)},
				{at: stMin + 20400*stMs, cost: 0, usage: true, want: stAllow(100, 1, stMin-20400*stMs)},
			},
		},
		{
			// Into debt: 150 from a full bucket of 100 leaves -50; a token
			// is back after 51 × 0.6s. Debt stops at -limit.
			name: "token bucket", algo: TokenBucket, limit: 100, window: stMin,
			steps: []usStep{
				{at: 0, cost: 150, usage: true, want: deny(100, 0, 30600*stMs, 90*stSec)},
				{at: 0, cost: 1000, usage: true, want: deny(100, 0, 60600*stMs, 2*stMin)},
				{at: 60600*stMs - 1, cost: 0, usage: true, want: deny(100, 0, 1, 59400*stMs+1)},
				{at: 60600 * stMs, cost: 0, usage: true, want: stAllow(100, 1, 59400*stMs)},
				{at: 2 * stMin, cost: 100, want: stAllow(100, 0, stMin)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s state
			for _, st := range tc.steps {
				now := st0 + int64(st.at)
				c := Check{Key: "k", Limit: tc.limit, Window: tc.window, Algorithm: tc.algo, Cost: st.cost, Usage: st.usage}
				var d Decision
				s.decide(now, &c, stMaxRuns, &d)
				if d != st.want {
					t.Fatalf("decide(cost=%d usage=%v at t=%v) = %+v; want %+v", st.cost, st.usage, st.at, d, st.want)
				}
				checkStateWellFormed(t, &s)
				if s.algo == SlidingLog {
					if keep := s.logKeep(now); s.cur > keep || int64(len(s.buf)) > keep {
						t.Fatalf("after decide(cost=%d usage=%v at t=%v) the log holds %d hits in %d runs; want at most %d", st.cost, st.usage, st.at, s.cur, len(s.buf), keep)
					}
				}
				if d.RetryAfter > 0 {
					// The wait is exact: a usage peek passes at
					// now+RetryAfter and not 1ns before.
					peek := Check{Key: "k", Limit: tc.limit, Window: tc.window, Algorithm: tc.algo, Usage: true}
					if st.usage || st.cost == 0 {
						if got := stateTryAt(&s, now+int64(d.RetryAfter), &peek, stMaxRuns); !got.Allowed {
							t.Fatalf("after decide(cost=%d at t=%v) = %+v, a usage peek at t+RetryAfter = %+v; want allowed", st.cost, st.at, d, got)
						}
						if got := stateTryAt(&s, now+int64(d.RetryAfter)-1, &peek, stMaxRuns); got.Allowed {
							t.Fatalf("after decide(cost=%d at t=%v) = %+v, a usage peek 1ns before t+RetryAfter = %+v; want denied", st.cost, st.at, d, got)
						}
					}
				}
			}
		})
	}
}

// TestUsageLogBounded checks that a sliding log over its limit keeps at
// most logKeep hits (limit+1 plus what open reservations hold), whatever
// the reports, and that its decisions are those of the full log: the
// reference model keeps every hit.
func TestUsageLogBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 1))
	for i := range 200 {
		limit := 1 + rng.Int64N(20)
		window := int64(stSec)
		var s state
		var hits []run // every hit recorded, the model
		now := st0
		for range 200 {
			now += rng.Int64N(int64(50 * stMs))
			cost := rng.Int64N(2 * limit)
			usage := rng.IntN(2) == 0
			if !usage {
				cost = min(cost, limit)
			}
			c := Check{Key: "k", Limit: limit, Window: time.Duration(window), Cost: cost, Usage: usage}
			var used int64
			for _, h := range hits {
				if h.at > now-window {
					used += h.n
				}
			}
			var d Decision
			s.decide(now, &c, stMaxRuns, &d)
			fits := cost <= limit && used+cost <= limit
			if usage && cost == 0 {
				fits = used < limit
			}
			if d.Allowed != fits {
				t.Fatalf("run %d: decide(cost=%d usage=%v) with %d used of %d = %+v; want allowed=%v", i, cost, usage, used, limit, d, fits)
			}
			if (fits || usage) && cost > 0 {
				hits = append(hits, run{now, cost})
			}
			if s.cur > limit+1 || int64(len(s.buf)) > limit+1 {
				t.Fatalf("run %d: the log holds %d hits in %d runs; want at most limit+1 = %d", i, s.cur, len(s.buf), limit+1)
			}
		}
	}
}

// TestReserveSettle is the specification of reservations, for each
// algorithm: a reserve takes its estimate at once; a settle gives back
// what was not used, or records the overshoot, once; an expired
// reservation is settled at its estimate; the key lives until its
// reservations expire.
func TestReserveSettle(t *testing.T) {
	id := func(n byte) ReservationID { return ReservationID{n} }
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			var s state
			check := func(at time.Duration, c Check) Decision {
				t.Helper()
				c.Key, c.Limit, c.Window, c.Algorithm = "k", 1000, stMin, algo
				var d Decision
				s.decide(st0+int64(at), &c, stMaxRuns, &d)
				checkStateWellFormed(t, &s)
				return d
			}
			used := func(at time.Duration) int64 { return s.usedAt(st0 + int64(at)) }
			reserve := func(n byte, cost int64, ttl time.Duration) Check {
				return Check{Cost: cost, Reservation: &Reservation{ID: id(n), TTL: ttl}}
			}
			settle := func(n byte, cost int64) Check {
				return Check{Cost: cost, Reservation: &Reservation{ID: id(n), Settle: true}}
			}

			if d := check(0, reserve(1, 300, 10*stSec)); !d.Allowed || d.Remaining != 700 {
				t.Fatalf("reserve 300 of 1000 = %+v; want allowed, 700 remaining", d)
			}
			if d := check(0, reserve(2, 800, 10*stSec)); d.Allowed {
				t.Fatalf("reserve 800 with 700 left = %+v; want denied", d)
			}
			if d := check(0, reserve(1, 300, 10*stSec)); !d.Allowed || used(0) != 300 {
				t.Fatalf("reserve again with the same ID = %+v, %d used; want allowed, still 300 used", d, used(0))
			}
			if d := check(0, settle(1, 100)); !d.Allowed || used(0) != 100 {
				t.Fatalf("settle 300 at 100 = %+v, %d used; want allowed, 100 used", d, used(0))
			}
			if d := check(0, settle(1, 0)); d.Allowed || used(0) != 100 {
				t.Fatalf("settle again = %+v, %d used; want not allowed, nothing changed (100 used)", d, used(0))
			}

			// Overshoot: recorded at the settle, over the limit if need be.
			check(2*stSec, reserve(3, 500, 10*stSec))
			if d := check(3*stSec, settle(3, 1200)); !d.Allowed || d.Remaining != 0 || d.RetryAfter == 0 {
				t.Fatalf("settle 500 at 1200 = %+v; want allowed (settled), nothing remaining, a wait", d)
			}
			if got := used(3 * stSec); got < 1000 {
				t.Fatalf("after an overshoot to 1300 used = %d; want at least the limit", got)
			}

			// Expiry settles at the estimate; the key lives until then,
			// even past its hits.
			s = state{}
			check(0, reserve(4, 200, 3*stMin))
			if s.isEmpty(st0+int64(2*stMin)) || s.deadline() != st0+int64(3*stMin) {
				t.Fatalf("a reservation of 3 minutes: isEmpty(2min) = %v, deadline = %v; want false, 3min", s.isEmpty(st0+int64(2*stMin)), time.Duration(s.deadline()-st0))
			}
			s = state{}
			check(0, reserve(5, 200, 10*stSec))
			if d := check(11*stSec, settle(5, 0)); d.Allowed || algo != TokenBucket && used(11*stSec) != 200 {
				t.Fatalf("settle after expiry = %+v, %d used; want not allowed, 200 used (settled at the estimate)", d, used(11*stSec))
			}
			if !s.isEmpty(st0+int64(stMin)+int64(stMs)) && algo == SlidingLog {
				t.Fatal("the key is not empty once its hits and reservations expired")
			}

			// At most MaxReservations at once.
			s = state{}
			for i := range MaxReservations {
				c := Check{Key: "k", Limit: 1 << 20, Window: stMin, Algorithm: algo, Cost: 1,
					Reservation: &Reservation{ID: ReservationID{byte(i), byte(i >> 8), 1}, TTL: time.Duration(10+i) * stSec}}
				var d Decision
				if s.decide(st0, &c, stMaxRuns, &d); !d.Allowed {
					t.Fatalf("reservation %d = %+v; want allowed", i, d)
				}
			}
			c := Check{Key: "k", Limit: 1 << 20, Window: stMin, Algorithm: algo, Cost: 1, Reservation: &Reservation{ID: id(0xff), TTL: stSec}}
			var d Decision
			if s.decide(st0, &c, stMaxRuns, &d); d.Allowed || d.RetryAfter != 10*stSec {
				t.Fatalf("reservation %d = %+v; want denied until the first expires (10s)", MaxReservations+1, d)
			}
			var u state
			if err := u.decode(s.appendBinary(nil)); err != nil || !stSame(&s, &u) {
				t.Fatalf("%d reservations do not round-trip: %v", MaxReservations, err)
			}
		})
	}
}

// TestSettleGivesBackReservedHits checks that a settle gives back the very
// hits its reservation recorded, never more, also after an overshoot took
// the log past its limit (logKeep keeps what a settle may give back).
func TestSettleGivesBackReservedHits(t *testing.T) {
	var s state
	do := func(at time.Duration, c Check) Decision {
		c.Key, c.Limit, c.Window = "k", 10, stSec
		var d Decision
		s.decide(st0+int64(at), &c, stMaxRuns, &d)
		return d
	}
	do(0, Check{Cost: 6, Reservation: &Reservation{ID: ReservationID{1}, TTL: stSec}})
	do(stMs, Check{Cost: 4, Reservation: &Reservation{ID: ReservationID{2}, TTL: stSec}})
	do(2*stMs, Check{Cost: 9, Reservation: &Reservation{ID: ReservationID{2}, Settle: true}}) // 5 over: 15
	do(3*stMs, Check{Cost: 3, Reservation: &Reservation{ID: ReservationID{1}, Settle: true}}) // 3 back: 12
	// Spent: 3 + 9 = 12 of 10: the key is over its limit until the first 3
	// (at 0) leave, then 9 remain: under.
	if d := do(4*stMs, Check{Usage: true}); d.Allowed || d.RetryAfter != stSec-4*stMs {
		t.Fatalf("usage peek after spending 12 of 10 = %+v; want denied for %v", d, stSec-4*stMs)
	}
}

// TestReservationsSurviveRestart checks, on a real data file, that a
// reservation survives a restart and settles once; that its record is
// gone after the settle; and that an idle key with an expired reservation
// leaves memory and disk on its alarm, with no timer left.
func TestReservationsSurviveRestart(t *testing.T) {
	h := newHarness(t, "commit", nil)
	res := &Reservation{ID: ReservationID{7, 7}, TTL: 2 * time.Minute}
	if d := h.check(Check{Key: "ai|u1", Limit: 1000, Window: time.Minute, Cost: 400, Reservation: res}); !d.Allowed {
		t.Fatalf("reserve = %+v; want allowed", d)
	}
	h.restart()
	v, err := h.eng.Inspect(context.Background(), "ai|u1")
	if err != nil || v.Reservations != 1 || v.Reserved != 400 || v.Used != 400 {
		t.Fatalf("after a restart Inspect = %+v, %v; want 1 reservation of 400, 400 used", v, err)
	}
	settle := Check{Key: "ai|u1", Limit: 1000, Window: time.Minute, Cost: 150, Reservation: &Reservation{ID: res.ID, Settle: true}}
	if d := h.check(settle); !d.Allowed || d.Remaining != 850 {
		t.Fatalf("settle at 150 = %+v; want allowed, 850 remaining", d)
	}
	h.restart()
	if d := h.check(settle); d.Allowed || d.Remaining != 850 {
		t.Fatalf("settle again after a restart = %+v; want not allowed, 850 remaining", d)
	}
	// The hits leave after a minute, the key stays for its... no
	// reservation any more: it empties with its hits.
	h.clk.Advance(61 * time.Second)
	testkit.Eventually(t, 10*time.Second, func() bool { return h.obs.keys.Load() == 0 }, "the key to leave memory")
	testkit.Eventually(t, 10*time.Second, func() bool { return h.store.NextDeadline() == 0 }, "the key to leave disk")

	// An unsettled reservation keeps the key until it expires, then the
	// key leaves with no timer armed.
	h.check(Check{Key: "ai|u2", Limit: 1000, Window: time.Minute, Cost: 10, Reservation: &Reservation{ID: ReservationID{8}, TTL: 3 * time.Minute}})
	h.clk.Advance(2 * time.Minute)
	h.settle()
	if v, _ := h.eng.Inspect(context.Background(), "ai|u2"); !v.Found || v.Reservations != 1 || v.Used != 0 {
		t.Fatalf("after its hits left Inspect = %+v; want found with 1 reservation, 0 used", v)
	}
	h.clk.Advance(time.Minute)
	testkit.Eventually(t, 10*time.Second, func() bool { return h.obs.keys.Load() == 0 && h.store.NextDeadline() == 0 }, "the key to leave memory and disk")
	testkit.Eventually(t, 10*time.Second, func() bool { return h.clk.Pending() == 0 }, "no timer armed")
}

// TestAllOrNothingReleasesReservation checks that a reserve undone by an
// all-or-nothing call forgets its record, and that usage reports in such a
// call stay recorded.
func TestAllOrNothingReleasesReservation(t *testing.T) {
	h := newHarness(t, "memory", nil)
	checks := []Check{
		{Key: "a", Limit: 100, Window: time.Minute, Cost: 50, Reservation: &Reservation{ID: ReservationID{1}, TTL: time.Minute}},
		{Key: "b", Limit: 100, Window: time.Minute, Cost: 30, Usage: true},
		{Key: "c", Limit: 10, Window: time.Minute, Cost: 20, Usage: true}, // over: denies the call
	}
	out := make([]Decision, len(checks))
	if err := h.eng.CheckAll(context.Background(), checks, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed {
		t.Fatalf("CheckAll = %+v; want the reserve denied", out)
	}
	// c holds its newest limit+1 hits: older ones change no decision.
	for key, want := range map[string]int64{"a": 0, "b": 30, "c": 11} {
		v, err := h.eng.Inspect(context.Background(), key)
		if err != nil || v.Used != want || v.Reservations != 0 {
			t.Errorf("Inspect(%q) = %+v, %v; want %d used, no reservation", key, v, err, want)
		}
	}
}

// TestEntrySize checks that a key in memory stays in the 176-byte
// allocation size class with the reservations pointer (docs/engine.md,
// "Memory bound").
func TestEntrySize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("64-bit platforms only")
	}
	if got := unsafe.Sizeof(entry{}); got > 176 {
		t.Errorf("an entry is %d bytes; want at most 176 (an allocation size class)", got)
	}
}

// TestMergeKeepsReservations checks that reservations travel with a
// key's state through the merges of handoffs and standbys: into an empty
// key (a copy), between copies of one history (the union: a record made
// after the other's copy is kept), and between states that counted
// different hits (the union, each ID once); expired records are dropped;
// and a reservation settles once after the merge.
func TestMergeKeepsReservations(t *testing.T) {
	reserve := func(s *state, at time.Duration, id byte, cost int64) {
		t.Helper()
		c := Check{Key: "k", Limit: 100, Window: stMin, Cost: cost, Reservation: &Reservation{ID: ReservationID{id}, TTL: 30 * stSec}}
		var d Decision
		if s.decide(st0+int64(at), &c, stMaxRuns, &d); !d.Allowed {
			t.Fatalf("reserve %d = %+v; want allowed", id, d)
		}
	}
	ids := func(s *state) (out []byte) {
		if s.res != nil {
			for _, r := range s.res.list {
				out = append(out, r.id[0])
			}
		}
		return out
	}
	var owner state
	reserve(&owner, 0, 1, 10)
	standby := owner.clone() // the standby's copy, one history
	reserve(&owner, stSec, 2, 20)

	var empty state
	empty.merge(st0+int64(2*stSec), &owner, stMaxRuns)
	if got := ids(&empty); !slices.Equal(got, []byte{1, 2}) {
		t.Errorf("merge into an empty key: reservations %v; want [1 2]", got)
	}
	joined := standby.clone()
	joined.merge(st0+int64(2*stSec), &owner, stMaxRuns)
	if got := ids(&joined); !slices.Equal(got, []byte{1, 2}) || joined.usedAt(st0+int64(2*stSec)) != 30 {
		t.Errorf("join of copies: reservations %v, %d used; want [1 2], 30 (each hit once)", got, joined.usedAt(st0+int64(2*stSec)))
	}
	var other state
	reserve(&other, stSec, 3, 5)
	summed := other.clone()
	summed.merge(st0+int64(2*stSec), &owner, stMaxRuns)
	if got := ids(&summed); !slices.Equal(got, []byte{3, 1, 2}) || summed.usedAt(st0+int64(2*stSec)) != 35 {
		t.Errorf("merge of different histories: reservations %v, %d used; want [3 1 2], 35", got, summed.usedAt(st0+int64(2*stSec)))
	}
	late := owner.clone()
	late.merge(st0+int64(30500*stMs), &other, stMaxRuns) // 1 expired at 30s; 2 and 3 expire at 31s
	if got := ids(&late); !slices.Equal(got, []byte{2, 3}) {
		t.Errorf("merge after an expiry: reservations %v; want [2 3]", got)
	}
	settle := Check{Key: "k", Limit: 100, Window: stMin, Cost: 0, Reservation: &Reservation{ID: ReservationID{2}, Settle: true}}
	var d Decision
	if summed.decide(st0+int64(3*stSec), &settle, stMaxRuns, &d); !d.Allowed || d.Remaining != 85 {
		t.Errorf("settle of 2 at 0 after the merge = %+v; want settled, 85 remaining", d)
	}
	if summed.decide(st0+int64(3*stSec), &settle, stMaxRuns, &d); d.Allowed {
		t.Errorf("second settle after the merge = %+v; want not held", d)
	}
}
