package control

import (
	"slices"
	"strings"
)

// PlanReplicas returns the replica list each of n partitions should have
// over the members of m that own keys (phase joined, up or down): rf
// replicas each (fewer if there are fewer members), spread over zones,
// every member holding as many replicas as any other to within one, and
// as many preferred leaderships (a list's first replica). Starting from
// the lists m has, it moves as few replicas as that takes: a replica of a
// member that is gone is replaced, then replicas move from the fullest
// members to the emptiest, one at a time. Reordering a list (who is
// preferred) moves no data and is free. The plan is a pure function of m:
// every node computes the same.
//
// The Raft leader commits a plan's changes as replicas commands, a
// replica added before the one it replaces leaves (it catches up first).
func PlanReplicas(m *Map, n, rf int) [][]string {
	var ids []string
	zone := make(map[string]string)
	for _, x := range m.members() {
		if x.Phase == PhaseJoined {
			ids = append(ids, x.ID)
			zone[x.ID] = x.Zone
		}
	}
	if len(ids) == 0 || n <= 0 {
		return nil
	}
	slices.Sort(ids)
	rf = min(max(rf, 1), len(ids))
	count := make(map[string]int, len(ids))
	plan := make([][]string, n)
	for p := range n {
		if p < len(m.Partitions) {
			for _, id := range m.Partitions[p].Replicas {
				if _, ok := zone[id]; ok && len(plan[p]) < rf && !slices.Contains(plan[p], id) {
					plan[p] = append(plan[p], id)
					count[id]++
				}
			}
		}
	}
	zones := make(map[string]bool)
	for _, id := range ids {
		zones[zone[id]] = true
	}
	// spread reports whether id may join list l without two of its
	// replicas sharing a zone that need not.
	spread := func(l []string, id string) bool {
		if len(zones) < len(l)+1 {
			return true
		}
		return !slices.ContainsFunc(l, func(o string) bool { return zone[o] == zone[id] })
	}
	// pairs counts the partitions two members share: a new replica goes
	// where it shares the fewest with the list's others, so that the
	// partitions of a member that fails have their other replicas on every
	// member, not on one.
	pairs := make(map[[2]string]int)
	pair := func(a, b string) [2]string {
		if a > b {
			a, b = b, a
		}
		return [2]string{a, b}
	}
	shared := func(l []string, id string) int {
		s := 0
		for _, o := range l {
			s += pairs[pair(o, id)]
		}
		return s
	}
	for _, l := range plan {
		for i := range l {
			for j := range i {
				pairs[pair(l[i], l[j])]++
			}
		}
	}
	// Fill: the emptiest member that spreads, then the one that shares
	// the fewest partitions with the list, then by a rotation.
	for p := range n {
		for len(plan[p]) < rf {
			best := ""
			for k := range ids {
				id := ids[(p+k)%len(ids)]
				if slices.Contains(plan[p], id) {
					continue
				}
				if best == "" || better(
					pick{spread(plan[p], id), count[id], shared(plan[p], id)},
					pick{spread(plan[p], best), count[best], shared(plan[p], best)}) {
					best = id
				}
			}
			for _, o := range plan[p] {
				pairs[pair(o, best)]++
			}
			plan[p] = append(plan[p], best)
			count[best]++
		}
	}
	// Balance: while some member holds two replicas more than another
	// that may take one of them (not in the list, spreading), move one,
	// fullest to emptiest first. Each move lowers the sum of the squared
	// counts, so it ends; a join moves replicas only to the new member.
	for {
		byCount := slices.Clone(ids)
		slices.SortStableFunc(byCount, func(a, b string) int { return count[a] - count[b] })
		moved := false
	search:
		for f := len(byCount) - 1; f >= 0; f-- {
			from := byCount[f]
			for _, to := range byCount {
				if count[from] <= count[to]+1 {
					break
				}
				for p := range n {
					i := slices.Index(plan[p], from)
					if i < 0 || slices.Contains(plan[p], to) || !spread(slices.Delete(slices.Clone(plan[p]), i, i+1), to) {
						continue
					}
					plan[p][i] = to
					count[from]--
					count[to]++
					moved = true
					break search
				}
			}
		}
		if !moved {
			break
		}
	}
	balanceLeaders(plan, ids)
	return plan
}

// pick is how a candidate for a list's next replica compares.
type pick struct {
	spreads        bool // no zone twice in the list that need not be
	count, sharing int  // replicas it holds, partitions it shares with the list
}

// better reports whether candidate a is a better pick than b: spreading
// first, then holding fewer replicas, then sharing fewer partitions.
func better(a, b pick) bool {
	switch {
	case a.spreads != b.spreads:
		return a.spreads
	case a.count != b.count:
		return a.count < b.count
	}
	return a.sharing < b.sharing
}

// balanceLeaders reorders lists so that every member is the preferred
// leader (first) of as many partitions as any other to within one where
// the lists allow it, changing the order of as few lists as it can.
func balanceLeaders(plan [][]string, ids []string) {
	first := make(map[string]int, len(ids))
	for _, l := range plan {
		first[l[0]]++
	}
	for swapped := true; swapped; {
		swapped = false
		for _, l := range plan {
			j := 0
			for k := 1; k < len(l); k++ {
				if first[l[k]]+1 < first[l[0]] && (j == 0 || first[l[k]] < first[l[j]] || first[l[k]] == first[l[j]] && strings.Compare(l[k], l[j]) < 0) {
					j = k
				}
			}
			if j > 0 {
				first[l[0]]--
				first[l[j]]++
				l[0], l[j] = l[j], l[0]
				swapped = true
			}
		}
	}
}
