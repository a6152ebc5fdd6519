package cluster

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRosterMergeConverges: every order of merging the same entries gives
// the same roster: the newest incarnation of each member wins, and within
// an incarnation the furthest phase.
func TestRosterMergeConverges(t *testing.T) {
	es := []RosterEntry{
		{Name: "a", Incarnation: 1, Phase: PhaseJoined, GossipAddr: "10.0.0.1:7946"},
		{Name: "a", Incarnation: 1, Phase: PhaseLeaving, GossipAddr: "10.0.0.1:7946"},
		{Name: "a", Incarnation: 1, Phase: PhaseLeft, GossipAddr: "10.0.0.1:7946"},
		{Name: "a", Incarnation: 2, Phase: PhaseJoined, GossipAddr: "10.0.0.9:7946"},
		{Name: "b", Incarnation: 5, Phase: PhaseJoined},
		{Name: "b", Incarnation: 4, Phase: PhaseLeft},
		{Name: "c", Incarnation: 3, Phase: PhaseLeaving},
		{Name: "", Incarnation: 9, Phase: PhaseJoined}, // ignored
		{Name: "d", Incarnation: 9, Phase: Phase(42)},  // ignored
	}
	want := []RosterEntry{es[3], es[4], es[6]}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		shuffled := slices.Clone(es)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		var ro *Roster
		for _, e := range shuffled {
			ro, _ = ro.Merge(e)
		}
		if got := ro.Entries(); !slices.Equal(got, want) {
			t.Fatalf("merging %v gave %v; want %v", shuffled, got, want)
		}
		if got := ro.Owners(); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("Owners() = %v; want [a b] (c is leaving)", got)
		}
	}
	// Merging what it holds changes nothing.
	var ro *Roster
	ro, _ = ro.Merge(es...)
	if again, changed := ro.Merge(ro.Entries()...); changed || again != ro {
		t.Fatalf("merging a roster into itself changed it")
	}
}

// TestRosterEncoding: a roster survives its encoding.
func TestRosterEncoding(t *testing.T) {
	ro, _ := (&Roster{}).Merge(
		RosterEntry{Name: "a", Incarnation: 1, Phase: PhaseJoined, GossipAddr: "10.0.0.1:7946", GRPCAddr: "10.0.0.1:8081"},
		RosterEntry{Name: "b", Incarnation: 2, Phase: PhaseLeft},
	)
	es, err := decodeRoster(ro.encode())
	if err != nil || !slices.Equal(es, ro.Entries()) {
		t.Fatalf("decode(encode(%v)) = %v, %v", ro.Entries(), es, err)
	}
	if _, err := decodeRoster([]byte("{not json")); err == nil {
		t.Fatal("decodeRoster(garbage) = nil error")
	}
}
