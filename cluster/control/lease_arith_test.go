package control

import (
	"testing"
	"time"
)

// manualClock is a Clock a test sets by hand.
type manualClock struct{ now time.Duration }

func (c *manualClock) Now() time.Duration { return c.now }

// TestHolderExpiry: a lease granted on a renewal sent at s runs until
// s + L on the holder's clock, and not a nanosecond longer; a later grant
// of an earlier renewal never shortens it; a grant for another epoch, or
// after a reset, gives nothing.
func TestHolderExpiry(t *testing.T) {
	const L = 2 * time.Second
	clk := &manualClock{}
	h := &holder{clock: clk, length: L}
	h.reset(7)
	if h.valid(7) {
		t.Fatalf("valid before any grant; want not")
	}
	s := 10 * time.Second
	h.extend(7, s)
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{{s, true}, {s + L - time.Nanosecond, true}, {s + L, false}, {s + L + time.Second, false}} {
		clk.now = tc.at
		if got := h.valid(7); got != tc.want {
			t.Errorf("renewal sent at %v, L %v: valid at %v = %v; want %v", s, L, tc.at, got, tc.want)
		}
		if got := h.valid(8); got {
			t.Errorf("valid(8) at %v for a lease of epoch 7 = true; want false", tc.at)
		}
	}
	clk.now = s + L/2
	if got, want := h.remaining(7), L/2; got != want {
		t.Errorf("remaining at s + L/2 = %v; want %v", got, want)
	}
	h.extend(7, s-time.Second) // an older renewal granted late
	if got, want := h.remaining(7), L/2; got != want {
		t.Errorf("after a late grant of an older renewal: remaining %v; want %v (never shortened, never extended by it)", got, want)
	}
	h.extend(8, s+time.Second) // another epoch's grant
	if got, want := h.remaining(7), L/2; got != want {
		t.Errorf("after a grant for epoch 8: remaining %v; want %v", got, want)
	}
	h.reset(8)
	if h.valid(8) || h.valid(7) {
		t.Errorf("valid right after reset(8); want no lease")
	}
}

// TestEndWaitsForTheLease: the leader ends an epoch at max(last grant,
// its leadership start) + L·(1+ρ) on its own clock. For a holder whose
// clock runs slower than the leader's by up to ρ/(1+ρ), the lease that
// the last grant gave has ended (on the leader's clock) by then, whenever
// in [its leadership start, last grant] the renewal was sent; a holder
// slower than that outlives the wait, which is why ρ bounds clock rates.
func TestEndWaitsForTheLease(t *testing.T) {
	const (
		L   = 2 * time.Second
		rho = 0.1
	)
	wait := time.Duration(float64(L) * (1 + rho))
	for _, tc := range []struct {
		name             string
		since, lastGrant time.Duration
		wantAt           time.Duration
	}{
		{"granted since it leads", 5 * time.Second, 9 * time.Second, 9*time.Second + wait},
		{"nothing granted since it leads", 5 * time.Second, 0, 5*time.Second + wait},
		{"a grant older than its leadership", 5 * time.Second, 3 * time.Second, 5*time.Second + wait},
	} {
		g := &granter{since: tc.since, wait: wait, lastGrant: map[string]time.Duration{}, ending: map[string]ending{}}
		if tc.lastGrant > 0 {
			g.lastGrant["n2"] = tc.lastGrant
		}
		g.forceEnd("n2", 4, "test")
		if got := g.ending["n2"]; got.at != tc.wantAt || got.epoch != 4 {
			t.Errorf("%s: ending %+v; want epoch 4 at %v", tc.name, got, tc.wantAt)
		}
		g.forceEnd("n2", 4, "again")
		if got := g.ending["n2"]; got.why != "test" {
			t.Errorf("%s: a second forceEnd of the same epoch changed its ending to %+v", tc.name, got)
		}

		// The renewal behind the last grant was sent at most at the
		// grant; under a previous leader, at most at this one's start.
		sent := max(tc.lastGrant, tc.since)
		for _, rate := range []float64{1, 1 / (1 + rho), 1 / (1 + 2*rho)} {
			// The holder's clock runs at rate against the leader's: its
			// lease of L ends L/rate later on the leader's clock.
			end := sent + time.Duration(float64(L)/rate)
			safe := end <= g.ending["n2"].at
			if want := rate >= 1/(1+rho); safe != want {
				t.Errorf("%s, holder's clock at %.3f of the leader's: lease ends at %v, epoch ended at %v: safe %v; want %v",
					tc.name, rate, end, g.ending["n2"].at, safe, want)
			}
		}
	}
}

// TestRateClock: a clock at rate r advances r times as far as its base.
func TestRateClock(t *testing.T) {
	base := &manualClock{now: 10 * time.Second}
	c := NewRateClock(base, 0.5)
	if got := c.Now(); got != 10*time.Second {
		t.Fatalf("at its origin: %v; want 10s", got)
	}
	base.now = 14 * time.Second
	if got, want := c.Now(), 12*time.Second; got != want {
		t.Fatalf("4 s of its base later at rate 0.5: %v; want %v", got, want)
	}
	if got := NewRateClock(base, 0).Now(); got != base.now {
		t.Fatalf("rate 0 (taken as 1): %v; want %v", got, base.now)
	}
}
