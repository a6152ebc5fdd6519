package control

import (
	"strings"
	"testing"
	"time"
)

// TestDownNeedsALeaseOfGossipDeath: the leader takes a member for down
// when gossip has not seen it alive for longer than the lease, or when it
// has not asked for a renewal for as long; a member that gossip declares
// dead for less than a lease while it renews (a stale rumour after a
// partition heals, until the member refutes it) is not down. Before, one
// tick of gossip death ended a renewing member's epoch, which refused its
// keys and moved them for nothing.
func TestDownNeedsALeaseOfGossipDeath(t *testing.T) {
	const lease = 2 * time.Second
	g := &granter{lastAsk: map[string]time.Duration{}, seenAt: map[string]time.Duration{}}
	at := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	// The epoch was first seen at 0; the member renews every 0.5 s.
	g.seenAt["n3"] = 0
	step := func(now time.Duration, alive bool) string {
		g.lastAsk["n3"] = now - 100*time.Millisecond
		return g.downLocked("n3", now, alive, lease)
	}
	for s := 0.5; s <= 10; s += 0.5 {
		alive := s < 3 || s > 4.5 // declared dead for 1.5 s, then refuted
		if why := step(at(s), alive); why != "" {
			t.Fatalf("at %.1f s (gossip alive: %v): down (%s); want up: it renews, and gossip declared it dead for 1.5 s only (3 s to 4.5 s)", s, alive, why)
		}
	}
	// Declared dead from 10.5 s on, still renewing: down once a lease has
	// passed since gossip last saw it alive.
	for s := 10.5; s <= 12.0; s += 0.5 {
		if why := step(at(s), false); why != "" {
			t.Fatalf("at %.1f s: down (%s) %v after gossip last saw it alive; want up until a lease has passed", s, why, at(s)-at(10))
		}
	}
	if why := step(at(12.5), false); !strings.HasPrefix(why, "gossip has not seen it alive for 2.5s") {
		t.Fatalf("at 12.5 s, dead in gossip since 10.5 s: %q; want down, gossip", why)
	}
	// Alive in gossip but silent: down once a lease has passed since its
	// last renewal.
	g.seenAt["n4"], g.lastAsk["n4"] = at(20), at(20)
	if why := g.downLocked("n4", at(21.9), true, lease); why != "" {
		t.Fatalf("1.9 s after its last renewal: %q; want up", why)
	}
	if why := g.downLocked("n4", at(22.1), true, lease); !strings.HasPrefix(why, "no renewal for 2.1s") {
		t.Fatalf("2.1 s after its last renewal: %q; want down, no renewal", why)
	}
}
