package actor

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// leaseT0 is where the lease tests' clock starts.
const leaseT0 = int64(1_700_000_000) * int64(time.Second)

// TestLeaseCountsUntilAWindowAfterExpiry pins where a sliding log puts a
// lease's hits: at its expiry, so that they count from the grant until a
// window after it, settled or not, and a settle gives back only what was
// not spent.
func TestLeaseCountsUntilAWindowAfterExpiry(t *testing.T) {
	var s state
	at := func(d time.Duration) int64 { return leaseT0 + int64(d) }
	decide := func(d time.Duration, c Check) Decision {
		t.Helper()
		c.Key, c.Limit, c.Window, c.Algorithm = "k", 10, stSec, SlidingLog
		var dec Decision
		s.decide(at(d), &c, stMaxRuns, &dec)
		checkStateWellFormed(t, &s)
		return dec
	}
	lease := func(n int64, ttl time.Duration) Check {
		return Check{Cost: n, Reservation: &Reservation{ID: ReservationID{byte(n)}, TTL: ttl, Lease: true}}
	}
	if d := decide(0, lease(6, 3*stSec)); !d.Allowed || d.Remaining != 4 || d.ResetAfter != 4*stSec {
		t.Fatalf("lease 6 of 10 for 3 s = %+v; want allowed, 4 remaining, reset after 4 s (a window after the expiry)", d)
	}
	for _, d := range []time.Duration{0, 2 * stSec, 3999 * stMs} {
		if got := s.usedAt(at(d)); got != 6 {
			t.Fatalf("used at %v = %d; want the lease's 6 until a window after its expiry", d, got)
		}
	}
	if got := s.usedAt(at(4 * stSec)); got != 0 {
		t.Fatalf("used at 4 s = %d; want 0", got)
	}
	if d := decide(500*stMs, lease(5, stSec)); d.Allowed {
		t.Fatalf("a second lease of 5 with 4 left = %+v; want denied", d)
	}
	if d := decide(stSec, Check{Cost: 2, Reservation: &Reservation{ID: ReservationID{6}, Settle: true}}); !d.Allowed {
		t.Fatalf("settle the lease at 2 = %+v; want allowed (held)", d)
	}
	if got := s.usedAt(at(3999 * stMs)); got != 2 {
		t.Fatalf("after a settle at 2 spent, used at 3.999 s = %d; want 2 (the spent hits count as spent at the expiry)", got)
	}
	if d := decide(2*stSec, Check{Cost: 8}); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("8 more after the settle = %+v; want allowed, nothing left", d)
	}
	b := s.appendBinary(nil)
	var u state
	if err := u.decode(b); err != nil || !stSame(&s, &u) {
		t.Fatalf("a log with a lease's run ahead of now does not round-trip: %v", err)
	}
}

// TestLeaseRefusedBySlidingWindow: the approximate algorithm takes no
// leases, with a message that names the ones that do.
func TestLeaseRefusedBySlidingWindow(t *testing.T) {
	c := Check{Key: "k", Limit: 10, Window: stSec, Algorithm: SlidingWindow, Cost: 2,
		Reservation: &Reservation{ID: ReservationID{1}, TTL: stSec, Lease: true}}
	err := c.validate(0, Limits{}.withDefaults())
	if err == nil {
		t.Fatal("a lease on a sliding window was accepted")
	}
	if e, ok := err.(*InvalidCheckError); !ok || e.Field != "algorithm" {
		t.Fatalf("error %v; want an InvalidCheckError on the algorithm", err)
	}
}

// TestLeaseLedger is the claim of leases, tried the way that breaks it:
// holders that spend their slices at the last moment before their expiry,
// settle some, abandon others, and a caller checking the key directly
// beside them, all on one clock. Every hit allowed (directly or from a
// slice) goes into a ledger at the moment it was spent, and no window of
// the ledger may hold more than the limit. A lease dated at its grant
// rather than its expiry fails it.
func TestLeaseLedger(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, TokenBucket} {
		for seed := range uint64(60) {
			rng := rand.New(rand.NewPCG(seed, 7))
			limit := 5 + rng.Int64N(30)
			window := time.Duration(200+rng.IntN(1800)) * stMs
			ttl := []time.Duration{20 * stMs, window / 2, window, 2 * window}[rng.IntN(4)]
			var s state
			var spent []int64
			type holder struct {
				id             ReservationID
				n, used        int64
				expires        int64
				open, settling bool
			}
			holders := make([]holder, 1+rng.IntN(4))
			nextID := 0
			decide := func(now int64, c Check) Decision {
				c.Key, c.Limit, c.Window, c.Algorithm = "k", limit, window, algo
				var d Decision
				s.decide(now, &c, stMaxRuns, &d)
				return d
			}
			now := leaseT0
			for step := 0; step < 3000; step++ {
				now += int64(time.Duration(1+rng.IntN(20)) * stMs)
				if rng.IntN(3) == 0 {
					if d := decide(now, Check{Cost: 1}); d.Allowed {
						spent = append(spent, now)
					}
				}
				for i := range holders {
					h := &holders[i]
					if h.open && now >= h.expires {
						h.open = false // expired: settled at its estimate
					}
					switch {
					case !h.open:
						if rng.IntN(4) != 0 {
							continue
						}
						nextID++
						h.id = ReservationID{byte(nextID), byte(nextID >> 8), byte(nextID >> 16)}
						want := 1 + rng.Int64N(max(1, limit/2))
						r := &Reservation{ID: h.id, TTL: ttl, Lease: true}
						if i%2 == 1 {
							// A holder that states a demand: granted up
							// to its fair share and the room.
							r.Holder, r.Demand = string(rune('a'+i)), 1+rng.Int64N(2*limit)
						}
						if d := decide(now, Check{Cost: want, Reservation: r}); d.Allowed {
							if d.Granted < 1 || d.Granted > want || r.Demand == 0 && d.Granted != want {
								t.Fatalf("seed %d: lease of %d (demand %d) granted %d", seed, want, r.Demand, d.Granted)
							}
							*h = holder{id: h.id, n: d.Granted, expires: now + int64(ttl), open: true}
						}
					case rng.IntN(12) == 0 && algo == SlidingLog:
						// Extend it, perhaps grown: spend until the new
						// expiry, the new size.
						want := h.n + rng.Int64N(3)
						d := decide(now, Check{Cost: want, Reservation: &Reservation{ID: h.id, TTL: ttl, Lease: true, Holder: string(rune('a' + i))}})
						switch {
						case d.Allowed:
							h.n = want
							h.expires = max(h.expires, now+int64(ttl))
						case want == h.n:
							t.Fatalf("seed %d: extending an open lease was refused: %+v", seed, d)
						}
					case rng.IntN(8) == 0 && h.used < h.n:
						// Spend what is left at the last moment of the lease.
						last := h.expires - 1
						for h.used < h.n {
							spent = append(spent, last)
							h.used++
						}
					case rng.IntN(10) == 0:
						if rng.IntN(3) != 0 { // else abandoned: expires unsettled
							decide(now, Check{Cost: h.used, Reservation: &Reservation{ID: h.id, Settle: true}})
						}
						h.open = false
					case h.used < h.n && rng.IntN(2) == 0:
						spent = append(spent, now)
						h.used++
					}
				}
			}
			slices.Sort(spent)
			for i, t0 := 0, 0; i < len(spent); i++ {
				for spent[t0] <= spent[i]-int64(window) {
					t0++
				}
				if int64(i-t0+1) > limit && algo == SlidingLog {
					t.Fatalf("%v, seed %d (limit %d, window %v, leases of %v): %d hits spent in the window ending %v; want at most %d",
						algo, seed, limit, window, ttl, i-t0+1, time.Duration(spent[i]-leaseT0), limit)
				}
				// A token bucket bounds the tokens taken in any interval by
				// its limit plus its refill over it, and a lease's tokens
				// are taken up to a TTL before they are spent: a window's
				// spending holds at most limit + rate × (window + TTL).
				if bound := limit + (limit*int64(window+ttl)+int64(window)-1)/int64(window); int64(i-t0+1) > bound && algo == TokenBucket {
					t.Fatalf("%v, seed %d: %d hits spent in one window; want at most %d (the bucket plus a window and a TTL of refill)",
						algo, seed, i-t0+1, bound)
				}
			}
		}
	}
}

// TestLeaseExtend: leasing again with the ID of an open lease moves its
// hits to the later expiry, so they count a window after it; an earlier
// one changes nothing; a settle after it gives back as before.
func TestLeaseExtend(t *testing.T) {
	var s state
	at := func(d time.Duration) int64 { return leaseT0 + int64(d) }
	decide := func(d time.Duration, c Check) Decision {
		t.Helper()
		c.Key, c.Limit, c.Window, c.Algorithm = "k", 10, stSec, SlidingLog
		var dec Decision
		s.decide(at(d), &c, stMaxRuns, &dec)
		checkStateWellFormed(t, &s)
		return dec
	}
	lease := func(ttl time.Duration) Check {
		return Check{Cost: 6, Reservation: &Reservation{ID: ReservationID{7}, TTL: ttl, Lease: true}}
	}
	decide(0, lease(stSec))
	if d := decide(500*stMs, lease(2*stSec)); !d.Allowed || d.ResetAfter != 3*stSec {
		t.Fatalf("extend at 0.5 s to 2 s = %+v; want allowed, reset after 3 s (a window after the new expiry, 2.5 s)", d)
	}
	if got := s.usedAt(at(3499 * stMs)); got != 6 {
		t.Fatalf("used at 3.499 s = %d; want the lease's 6", got)
	}
	if d := decide(stSec, lease(100*stMs)); !d.Allowed || s.usedAt(at(3499*stMs)) != 6 {
		t.Fatalf("an extension to an earlier expiry = %+v; want allowed, nothing moved", d)
	}
	grow := func(n int64) Check {
		return Check{Cost: n, Reservation: &Reservation{ID: ReservationID{7}, TTL: 100 * stMs, Lease: true}}
	}
	if d := decide(stSec, grow(11)); d.Allowed || s.usedAt(at(3499*stMs)) != 6 {
		t.Fatalf("growing the lease of 6 to 11 with 4 left = %+v; want denied, nothing changed", d)
	}
	if d := decide(stSec, grow(9)); !d.Allowed || s.usedAt(at(3499*stMs)) != 9 || d.ResetAfter != 2500*stMs {
		t.Fatalf("growing it to 9 = %+v, %d used; want allowed, 9 used, still until a window after 2.5 s", d, s.usedAt(at(3499*stMs)))
	}
	if d := decide(stSec, grow(8)); !d.Allowed || s.usedAt(at(3499*stMs)) != 8 || d.Remaining != 2 {
		t.Fatalf("shrinking it to 8 = %+v, %d used; want allowed, 8 used, 2 left", d, s.usedAt(at(3499*stMs)))
	}
	if d := decide(stSec, Check{Cost: 1, Reservation: &Reservation{ID: ReservationID{7}, Settle: true}}); !d.Allowed || s.usedAt(at(3499*stMs)) != 1 {
		t.Fatalf("settle at 1 after the extension = %+v, %d used; want settled, 1 used until a window after the new expiry", d, s.usedAt(at(3499*stMs)))
	}
}

// TestHoldersView: a key's view groups its open reservations by holder
// (leases counted apart) and counts the checks denied while a lease was
// open; a state read back from its encoding knows the reservations but not
// their holders.
func TestHoldersView(t *testing.T) {
	var s state
	decide := func(c Check) Decision {
		t.Helper()
		c.Key, c.Limit, c.Window, c.Algorithm = "k", 10, stSec, SlidingLog
		var dec Decision
		s.decide(leaseT0, &c, stMaxRuns, &dec)
		return dec
	}
	res := func(id byte, n int64, holder string, lease bool) Check {
		return Check{Cost: n, Reservation: &Reservation{ID: ReservationID{id}, TTL: stSec, Lease: lease, Holder: holder}}
	}
	for _, c := range []Check{res(1, 3, "node-2", true), res(2, 2, "node-3", true), res(3, 1, "node-2", true), res(4, 1, "", false)} {
		if d := decide(c); !d.Allowed {
			t.Fatalf("%+v denied", c.Reservation)
		}
	}
	decide(Check{Cost: 5}) // 3 left: denied
	decide(Check{Cost: 1})
	decide(Check{Cost: 9}) // denied
	var v KeyState
	s.view(leaseT0, stMaxRuns, &v)
	want := []HolderView{
		{Holder: "node-2", Leases: 2, Reservations: 2, Hits: 4, Expires: time.Unix(0, leaseT0+int64(stSec))},
		{Holder: "node-3", Leases: 1, Reservations: 1, Hits: 2, Expires: time.Unix(0, leaseT0+int64(stSec))},
		{Holder: "", Reservations: 1, Hits: 1, Expires: time.Unix(0, leaseT0+int64(stSec))},
	}
	if !slices.EqualFunc(v.Holders, want, func(a, b HolderView) bool { return a == b }) || v.LeaseDenials != 2 {
		t.Fatalf("holders %+v, lease denials %d; want %+v, 2", v.Holders, v.LeaseDenials, want)
	}
	var u state
	if err := u.decode(s.appendBinary(nil)); err != nil {
		t.Fatal(err)
	}
	var w KeyState
	u.view(leaseT0, stMaxRuns, &w)
	if len(w.Holders) != 1 || w.Holders[0].Holder != "" || w.Holders[0].Reservations != 4 || w.Holders[0].Hits != 7 || w.Holders[0].Leases != 0 {
		t.Fatalf("read back: holders %+v; want the 4 reservations (7 hits) under no holder", w.Holders)
	}
}
