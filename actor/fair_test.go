package actor

import (
	"testing"
	"time"
)

func TestMaxMinShare(t *testing.T) {
	for _, tc := range []struct {
		capacity int64
		demands  []int64
		want     []int64
	}{
		{100, []int64{10, 20, 30}, []int64{10, 20, 30}},
		{60, []int64{10, 100, 100}, []int64{10, 25, 25}},
		{90, []int64{900, 300, 100}, []int64{30, 30, 30}},
		{909, []int64{3000, 600, 100}, []int64{404, 404, 100}},
		{1000, []int64{1000, 300, 100}, []int64{600, 300, 100}},
		{5, []int64{7, 7, 7}, []int64{1, 1, 1}},
	} {
		for i := range tc.demands {
			if got := maxMinShare(tc.capacity, tc.demands, i); got != tc.want[i] {
				t.Errorf("maxMinShare(%d, %v, %d) = %d; want %d", tc.capacity, tc.demands, i, got, tc.want[i])
			}
		}
	}
}

// fairHolder is a holder of TestLeaseFairShare: it spends rate hits a
// millisecond from slices it asks a key for.
type fairHolder struct {
	name        string
	perMs       float64 // hits it wants a millisecond
	demand      int64   // what it says it wants a window (0: says nothing)
	want        int64   // hits a slice asks for
	owed        float64 // hits wanted and not spent yet
	id          ReservationID
	n, used     int64
	until       int64 // it spends nothing from then on
	next        int64 // it asks for no slice before then
	spent       []int64
	fairDenials int
}

// TestLeaseFairShare: three holders that want 3,000, 600 and 100 hits a
// window of a key of 1,000 lease slices of at most 50 with a TTL of a
// tenth of the window. With their demands stated, each gets its max-min
// fair share of what leases can give out (1,000 / 1.1 = 909: 392, 392
// and the 100 it wants) in every window; without, the greediest takes
// what it can and the others starve. Every spent hit is in a ledger: no window holds more than the
// limit either way.
func TestLeaseFairShare(t *testing.T) {
	const (
		limit  = 1000
		window = int64(time.Second)
		ttl    = 100 * time.Millisecond
		ms     = int64(time.Millisecond)
		run    = 12 * window
	)
	sim := func(t *testing.T, fair bool) map[string][]int64 {
		var s state
		hs := []*fairHolder{
			{name: "a", perMs: 3, demand: 3000, want: 50},
			{name: "b", perMs: 0.6, demand: 600, want: 50},
			{name: "c", perMs: 0.1, demand: 100, want: 50},
		}
		var seq byte
		decide := func(now int64, c Check) Decision {
			c.Key, c.Limit, c.Window, c.Algorithm = "k", limit, time.Duration(window), SlidingLog
			var d Decision
			s.decide(now, &c, stMaxRuns, &d)
			return d
		}
		for now := leaseT0; now < leaseT0+run; now += ms {
			for _, h := range hs {
				h.owed += h.perMs
				for h.owed >= 1 {
					if h.n > h.used && now < h.until {
						h.used++
						h.owed--
						h.spent = append(h.spent, now)
						continue
					}
					if h.n > 0 && h.used < h.n {
						decide(now, Check{Cost: h.used, Reservation: &Reservation{ID: h.id, Settle: true}})
					}
					h.n, h.used = 0, 0
					if now < h.next {
						h.owed = 0 // denied: nothing is spent without a slice
						break
					}
					seq++
					h.id = ReservationID{seq, byte(now), byte(now >> 8), byte(now >> 16), h.name[0]}
					r := &Reservation{ID: h.id, TTL: ttl, Lease: true, Holder: h.name}
					want := h.want
					if fair {
						// As client.Lease does: a slice no larger than
						// the demand spends in a TTL.
						r.Demand = h.demand * 5 / 4 // with client.Lease's margin
						want = min(want, r.Demand*int64(ttl)/window+1)
					}
					d := decide(now, Check{Cost: want, Reservation: r})
					switch {
					case d.Allowed:
						h.n = d.Granted
						if !fair && h.n != want {
							t.Fatalf("%s: a lease without a demand granted %d of %d", h.name, h.n, want)
						}
						h.until = now + int64(ttl)*10/11
					case d.Remaining > 0:
						h.fairDenials++
						h.next = now + max(int64(d.RetryAfter), ms)
					default:
						h.next = now + int64(ttl)
					}
				}
			}
		}
		per := make(map[string][]int64)
		var all []int64
		for _, h := range hs {
			w := make([]int64, run/window)
			for _, at := range h.spent {
				w[(at-leaseT0)/window]++
			}
			per[h.name] = w
			all = append(all, h.spent...)
		}
		// The ledger: no window of spent hits holds more than the limit.
		counts := make(map[int64]int64)
		for _, at := range all {
			counts[(at-leaseT0)/ms]++
		}
		var inWindow int64
		for at := int64(0); at < run/ms; at++ {
			inWindow += counts[at]
			if at >= window/ms {
				inWindow -= counts[at-window/ms]
			}
			if inWindow > limit {
				t.Fatalf("%d hits spent in the window ending at %d ms; limit %d", inWindow, at, limit)
			}
		}
		t.Logf("fair %v: hits a window %v; fair denials a %d, b %d, c %d", fair, per, hs[0].fairDenials, hs[1].fairDenials, hs[2].fairDenials)
		return per
	}
	// The mean over the windows from the third on: a greedy holder takes
	// its share in a burst as soon as it frees, so single windows vary.
	mean := func(w []int64) int64 {
		var sum int64
		for _, n := range w[2:] {
			sum += n
		}
		return sum / int64(len(w)-2)
	}

	fair, unfair := sim(t, true), sim(t, false)
	// Each gets what it wants up to its max-min share of what leases
	// can give out (demands stated with a quarter's margin).
	capacity := int64(limit) * 10 / 11
	demands := []int64{3750, 750, 125}
	for i, want := range []struct {
		holder string
		rate   int64
	}{{"a", 3000}, {"b", 600}, {"c", 100}} {
		share := min(want.rate, maxMinShare(capacity, demands, i))
		t.Logf("holder %s: %d a window on average from the third (its fair share %d); %d without demands", want.holder, mean(fair[want.holder]), share, mean(unfair[want.holder]))
		if m := mean(fair[want.holder]); m < share*90/100 || m > share*110/100 {
			t.Errorf("holder %s: %d hits a window from the third on; want its fair share %d ± 10%%", want.holder, m, share)
		}
	}

	if m := mean(unfair["b"]); m >= 392*90/100 {
		t.Errorf("without demands b gets %d a window: the test would not notice fair shares missing", m)
	}
}
