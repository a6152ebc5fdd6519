package control

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const testLease = 2 * time.Second

// at is s seconds on the leader's boot clock.
func at(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// newTestGranter returns the granter of a leader named self that took
// office at 0, for a lease of testLease and ρ = 0.1.
func newTestGranter() *granter {
	return &granter{lease: testLease, wait: at(2.2),
		lastGrant: map[string]time.Duration{}, lastAsk: map[string]time.Duration{}, epochSeen: map[string]uint64{},
		seenAt: map[string]time.Duration{}, ending: map[string]ending{}}
}

// TestDownOnlyWhenRenewalsStop: a member is down only when its renewals
// stopped. One that renews is never down, whatever gossip says (its gossip
// port cut, or a stale rumour of its death after a partition healed).
// Gossip hastens the end of one that stopped: dead in gossip and silent
// for 3/4 of the lease, unless the leader distrusts its gossip.
func TestDownOnlyWhenRenewalsStop(t *testing.T) {
	tests := []struct {
		name string
		// alive is what gossip says at s seconds; the member renews every
		// half second until stop.
		alive func(s float64) bool
		stop  float64
		trust bool
		// down is when it is first down, 0 if never (within 30 s).
		down float64
		why  string
	}{
		{"renews, alive in gossip", func(float64) bool { return true }, 99, true, 0, ""},
		{"renews, dead in gossip for 25 s (its gossip port cut)", func(s float64) bool { return s < 5 }, 99, true, 0, ""},
		{"renews, dead in gossip for 1.5 s (a stale rumour)", func(s float64) bool { return s < 3 || s > 4.5 }, 99, true, 0, ""},
		{"stops at 10 s, alive in gossip (a one-way cut)", func(float64) bool { return true }, 10, true, 12.25, "no renewal for 2.25s"},
		{"stops at 10 s, dead in gossip from 10 s (killed)", func(s float64) bool { return s < 10 }, 10, true, 11.75, "no renewal for 1.75s, and gossip has not seen it alive for 2s"},
		{"stops at 10 s, dead in gossip from 0 s", func(float64) bool { return false }, 10, true, 11.75, "no renewal for 1.75s, and gossip has not seen it alive for 11.75s"},
		{"stops at 10 s, dead in gossip, gossip distrusted", func(s float64) bool { return s < 10 }, 10, false, 12.25, "no renewal for 2.25s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newTestGranter()
			g.seenAt["n3"] = 0
			for s := 0.25; s <= 30; s += 0.25 {
				if s <= tt.stop && int(s*4)%2 == 0 {
					g.lastAsk["n3"] = at(s)
				}
				why := g.downLocked("n3", at(s), tt.alive(s), tt.trust, testLease)
				if why == "" {
					continue
				}
				if s != tt.down || why != tt.why {
					t.Fatalf("first down at %.2f s: %q; want %s", s, why, want(tt.down, tt.why))
				}
				return
			}
			if tt.down != 0 {
				t.Fatalf("never down; want %s", want(tt.down, tt.why))
			}
		})
	}
}

func want(down float64, why string) string {
	if down == 0 {
		return "never down"
	}
	return fmt.Sprintf("down at %.2f s: %q", down, why)
}

// TestGossipAloneEndsNoEpoch plays the leader's duty of ending epochs
// (checkLocked, every 100 ms on the leader's clock) on three members, n1
// leading: cut only a follower's gossip, or only the leader's, and no
// epoch ends while its member renews; a follower that stops renewing is
// ended, hastened by gossip unless the leader sees everyone dead. The
// end is due L·(1+ρ) after the member's last grant.
func TestGossipAloneEndsNoEpoch(t *testing.T) {
	tests := []struct {
		name string
		// dead is whom gossip on n1 declares dead from 5 s on; stop is
		// when each follower stops renewing (never if absent).
		dead []string
		stop map[string]float64
		// want lists each epoch end: member, when it was marked, when due.
		want     []string
		distrust bool
	}{
		{name: "a follower's gossip cut", dead: []string{"n2"}},
		{name: "the leader's gossip cut", dead: []string{"n2", "n3"}, distrust: true},
		{name: "a follower killed at 5 s", dead: []string{"n2"}, stop: map[string]float64{"n2": 5},
			want: []string{"n2 marked at 6.6 s (no renewal for 1.6s, and gossip has not seen it alive for 1.7s), due at 7.2 s"}},
		{name: "a follower cut one way at 5 s", stop: map[string]float64{"n2": 5},
			want: []string{"n2 marked at 7.1 s (no renewal for 2.1s), due at 7.2 s"}},
		{name: "the leader's gossip cut and a follower killed at 5 s", dead: []string{"n2", "n3"}, stop: map[string]float64{"n3": 5},
			want: []string{"n3 marked at 7.1 s (no renewal for 2.1s), due at 7.2 s"}, distrust: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &Map{Members: []Member{
				{Name: "n1", Phase: PhaseJoined, Epoch: 1, Live: true},
				{Name: "n2", Phase: PhaseJoined, Epoch: 2, Live: true},
				{Name: "n3", Phase: PhaseJoined, Epoch: 3, Live: true},
			}}
			g := newTestGranter()
			var got []string
			distrusted := false
			ended := map[string]bool{}
			for tick := 1; tick <= 200; tick++ {
				s := float64(tick) / 10
				now := at(s)
				alive := func(name string) bool {
					return s < 5 || !strings.Contains(strings.Join(tt.dead, ","), name)
				}
				// Renewals arrive and are granted every half second.
				if tick%5 == 0 {
					for _, f := range []string{"n2", "n3"} {
						if stop, ok := tt.stop[f]; !ok || s <= stop {
							g.lastAsk[f], g.lastGrant[f] = now, now
						}
					}
				}
				todo, newly, distrust := g.checkLocked(m, now, "n1", alive)
				if strings.HasPrefix(distrust, "gossip shows every other member dead") {
					distrusted = true
				}
				for _, e := range newly {
					got = append(got, fmt.Sprintf("%s marked at %.1f s (%s), due at %.1f s", e.name, s, e.why, e.at.Seconds()))
				}
				for _, d := range todo {
					if ended[d.name] {
						continue
					}
					ended[d.name] = true
					if d.epoch != 2 && d.name == "n2" || d.epoch != 3 && d.name == "n3" {
						t.Errorf("at %.1f s: ends epoch %d of %s; want its own", s, d.epoch, d.name)
					}
					if e := g.ending[d.name]; now < e.at {
						t.Errorf("at %.1f s: ends %s before it is due (%v)", s, d.name, e.at)
					}
				}
			}
			if strings.Join(got, "; ") != strings.Join(tt.want, "; ") {
				t.Errorf("epoch ends over 20 s:\n got %q\nwant %q", got, tt.want)
			}
			if distrusted != tt.distrust {
				t.Errorf("leader distrusted its gossip: %v; want %v", distrusted, tt.distrust)
			}
			for _, w := range tt.want {
				if name := w[:2]; !ended[name] {
					t.Errorf("%s marked but its end never came due", name)
				}
			}
		})
	}
}
