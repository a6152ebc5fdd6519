package cluster

import (
	"fmt"
	"testing"

	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/shard"
)

// TestRoutesAgreeWithActing: a client that sends a key's checks to the
// first member of the key's rendezvous order, over Routes, that is up
// reaches the member acting for the key, whenever one may: with members
// ended (with or without copies), leaving, or under the available policy.
// When nobody may decide the key, the client's pick does not matter (the
// node it reaches refuses the key as any node would).
func TestRoutesAgreeWithActing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy Policy
		ms     []member
	}{
		{"all up", PolicyExact, []member{live("a", 1), live("b", 2), live("c", 3)}},
		{"one ended with copies", PolicyExact, []member{ended("a", true), live("b", 2), live("c", 3)}},
		{"one ended without copies", PolicyExact, []member{ended("a", false), live("b", 2), live("c", 3)}},
		{"one ended without copies, available", PolicyAvailable, []member{ended("a", false), live("b", 2), live("c", 3)}},
		{"one leaving", PolicyExact, []member{{name: "a", epoch: 1, phase: control.PhaseLeaving}, live("b", 2), live("c", 3)}},
		{"one left without handing its keys over", PolicyExact, []member{{name: "a", epoch: 1, ended: true, phase: control.PhaseLeaving}, live("b", 2), live("c", 3)}},
		{"two ended with copies", PolicyExact, []member{ended("a", true), ended("b", true), live("c", 3), live("d", 4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConfig("c", tc.policy, 2, testMap(7, tc.ms...))
			routes := c.routes(func(string) string { return "" })
			for i := range 2000 {
				key := fmt.Sprintf("key-%d", i)
				want, _, err := c.acting(key)
				if err != nil {
					continue
				}
				if got := clientPick(routes, key); got != want {
					t.Fatalf("client pick for %q over %+v = %q; acting member %q", key, routes, got, want)
				}
			}
		})
	}
}

// clientPick is the rule a client follows (client.routeView.acting): the
// member with the highest score among those up, the smallest name on a
// tie.
func clientPick(routes []Route, key string) string {
	h := shard.Hash(key)
	best, bestScore := "", uint64(0)
	for _, r := range routes {
		if !r.Up {
			continue
		}
		s := shard.Score(h, shard.NodeHash(r.Name))
		if best == "" || s > bestScore || s == bestScore && r.Name < best {
			best, bestScore = r.Name, s
		}
	}
	return best
}
