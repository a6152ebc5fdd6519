//go:build linux

package faults

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// bootstrapFlows returns this file's rows of TestOperatorFlows.
func bootstrapFlows() []scenario {
	return []scenario{
		{name: "staggered-first-start", nodes: 5, expect: 3, joinAll: true, deferred: []int{1, 2}, inject: staggeredFirstStart,
			event: fixed("5 nodes started empty with `--expect 3`, staggered: n3–n5 first, then n2, then n1 0.7 s later; the cluster must form once")},
	}
}

// staggeredFirstStart starts the two lowest names, which the first three
// did not wait for, one after the other while the load runs on the first
// three, and checks that every node ends in the one cluster: a single
// cluster ID, on all five. (Under the rule this replaced, the lowest name
// of a node's own view bootstrapped: n2 and n1 saw five nodes without a
// cluster ID until gossip carried it.)
func staggeredFirstStart(t *testing.T, c *cluster, tm timing) {
	late := []*node{c.node(2), c.node(1)}
	f := c.beginFault(restarted, "n2, then n1, started empty", late, nil)
	defer f.heal()
	for i, n := range late {
		if i > 0 {
			time.Sleep(700 * time.Millisecond) // not a poll: the stagger
		}
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range late {
		if err := n.waitReady(time.Now().Add(60 * time.Second)); err != nil {
			f.problem("%v", err)
		}
	}
	ids := make(map[string]string)
	err := testkit.Wait(30*time.Second, func() error {
		for _, n := range c.nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := n.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
			cancel()
			if err != nil {
				return fmt.Errorf("%s: ListMembers: %v", n.name, err)
			}
			if resp.ClusterId == "" || len(resp.Members) != len(c.nodes) {
				return fmt.Errorf("%s: cluster %q with %d members; want one with %d", n.name, resp.ClusterId, len(resp.Members), len(c.nodes))
			}
			ids[n.name] = resp.ClusterId
		}
		return nil
	})
	distinct := slices.Compact(slices.Sorted(maps.Values(ids)))
	switch {
	case err != nil:
		f.problem("not one cluster of five within 30 s: %v", err)
	case len(distinct) != 1:
		var parts []string
		for _, name := range slices.Sorted(maps.Keys(ids)) {
			parts = append(parts, name+": "+ids[name])
		}
		f.problem("%d cluster IDs: %s; want one", len(distinct), strings.Join(parts, ", "))
	default:
		f.note("ready; one cluster ID on all five")
	}
}
