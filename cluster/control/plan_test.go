package control

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// planMap returns a map of members named m0.. (IDs id-m0..), in zones
// zones[i%len(zones)] if any, with the partitions' replicas of plan.
func planMap(members int, zones []string, plan [][]string) *Map {
	m := &Map{}
	for i := range members {
		x := Member{Name: fmt.Sprintf("m%d", i), ID: fmt.Sprintf("id-m%d", i), Phase: PhaseJoined, Live: true}
		if len(zones) > 0 {
			x.Zone = zones[i%len(zones)]
		}
		m.put(x)
	}
	for _, l := range plan {
		m.Partitions = append(m.Partitions, Partition{Replicas: l})
	}
	return m
}

// checkPlan fails t unless plan has n lists of rf distinct members of m
// each, every member holds as many replicas as any other of its zone to
// within one (with zones of unequal size, spreading over zones comes
// first), and as many preferred leaderships as any other to within
// leaderSlack, and no list has two replicas in one zone where there are
// enough zones.
func checkPlan(t *testing.T, m *Map, plan [][]string, n, rf, leaderSlack int) (count map[string]int) {
	t.Helper()
	if len(plan) != n {
		t.Fatalf("%d lists; want %d", len(plan), n)
	}
	count, first := map[string]int{}, map[string]int{}
	zones := map[string]bool{}
	for _, x := range m.Members {
		if x.Phase == PhaseJoined {
			count[x.ID], first[x.ID] = 0, 0
			zones[x.Zone] = true
		}
	}
	for p, l := range plan {
		if len(l) != rf {
			t.Fatalf("partition %d: %v; want %d replicas", p, l, rf)
		}
		seen := map[string]bool{}
		for _, id := range l {
			x, ok := m.MemberByID(id)
			if !ok || x.Phase != PhaseJoined {
				t.Fatalf("partition %d: %v names %s, not a member that owns keys", p, l, id)
			}
			if seen[id] || len(zones) >= rf && seen["zone:"+x.Zone] {
				t.Fatalf("partition %d: %v repeats a member or a zone", p, l)
			}
			seen[id], seen["zone:"+x.Zone] = true, true
			count[id]++
		}
		first[l[0]]++
	}
	for z := range zones {
		inZone := map[string]int{}
		for id, c := range count {
			if x, _ := m.MemberByID(id); x.Zone == z {
				inZone[id] = c
			}
		}
		if lo, hi := slices.Min(slices.Collect(maps.Values(inZone))), slices.Max(slices.Collect(maps.Values(inZone))); hi-lo > 1 {
			t.Fatalf("replicas per member of zone %q range from %d to %d: %v", z, lo, hi, inZone)
		}
	}
	if lo, hi := slices.Min(slices.Collect(maps.Values(first))), slices.Max(slices.Collect(maps.Values(first))); hi-lo > leaderSlack {
		t.Fatalf("preferred leaderships per member range from %d to %d: %v", lo, hi, first)
	}
	return count
}

// moves counts the replicas of after that before did not have in the same
// partition: the copies a plan makes.
func moves(before, after [][]string) int {
	n := 0
	for p := range after {
		for _, id := range after[p] {
			if p >= len(before) || !slices.Contains(before[p], id) {
				n++
			}
		}
	}
	return n
}

// TestPlanReplicas: a first plan is balanced, spread over zones and
// stable (planning again moves nothing), and the partitions of each member
// have their other replicas spread over every other member; a join moves
// replicas only to the new member, as many as its share; a forget moves
// the forgotten member's replicas and few more.
func TestPlanReplicas(t *testing.T) {
	for _, tc := range []struct {
		members, n, rf int
		zones          []string
	}{
		{3, 64, 2, nil}, {5, 64, 2, nil}, {5, 256, 3, nil}, {6, 128, 3, []string{"z1", "z2", "z3"}},
		{7, 256, 2, []string{"z1", "z2"}}, {1, 8, 2, nil}, {2, 16, 3, nil}, {30, 4096, 3, nil},
	} {
		t.Run(fmt.Sprintf("%dx%d/rf%d/zones%d", tc.members, tc.n, tc.rf, len(tc.zones)), func(t *testing.T) {
			rf := min(tc.rf, tc.members)
			m := planMap(tc.members, tc.zones, nil)
			plan := PlanReplicas(m, tc.n, tc.rf)
			checkPlan(t, m, plan, tc.n, rf, 1)
			m = planMap(tc.members, tc.zones, plan)
			if again := PlanReplicas(m, tc.n, tc.rf); !slices.EqualFunc(again, plan, slices.Equal) {
				t.Fatalf("planning a planned map again changed it")
			}
			if tc.zones == nil && tc.members > rf {
				// The partitions of a member have their other replicas
				// on every other member, each at least half its share:
				// when it fails, its load spreads.
				for _, x := range m.Members {
					with, others := map[string]int{}, 0
					for _, l := range plan {
						if slices.Contains(l, x.ID) {
							for _, o := range l {
								if o != x.ID {
									with[o]++
									others++
								}
							}
						}
					}
					for _, o := range m.Members {
						if o.ID != x.ID && 2*with[o.ID]*(tc.members-1) < others {
							t.Errorf("%s shares %d partitions with %s, under half its share of %d", x.ID, with[o.ID], o.ID, others)
						}
					}
				}
			}

			// Join one member.
			joined := planMap(tc.members+1, tc.zones, plan)
			after := PlanReplicas(joined, tc.n, tc.rf)
			count := checkPlan(t, joined, after, tc.n, min(tc.rf, tc.members+1), 2)
			newID := fmt.Sprintf("id-m%d", tc.members)
			if got, want := moves(plan, after), count[newID]; rf == min(tc.rf, tc.members+1) && got != want {
				t.Errorf("a join moved %d replicas; want only the %d the new member takes", got, want)
			}

			// Forget one member.
			if tc.members < 2 {
				return
			}
			forgot := planMap(tc.members, tc.zones, plan)
			x := forgot.Members[1]
			x.Phase = PhaseLeft
			forgot.put(x)
			after = PlanReplicas(forgot, tc.n, tc.rf)
			checkPlan(t, forgot, after, tc.n, min(tc.rf, tc.members-1), 2)
			held := 0
			for _, l := range plan {
				if slices.Contains(l, x.ID) {
					held++
				}
			}
			if got := moves(plan, after); got > held+held/4+1 {
				t.Errorf("a forget moved %d replicas; the forgotten member held %d", got, held)
			}
		})
	}
}
