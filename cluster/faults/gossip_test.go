//go:build linux

package faults

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// gossipFlows returns this file's rows of TestOperatorFlows: gossip cut
// while Raft and the peer service still flow, and a node of another
// cluster merging into gossip.
func gossipFlows() []scenario {
	return []scenario{
		{name: "gossip-cut-follower", gossipSecond: true, inject: gossipCutFollower,
			event: func(tm timing) string {
				return fmt.Sprintf("a follower's gossip cut both ways %s, Raft and the peer service flowing", secs(tm.fault))
			}},
		{name: "gossip-cut-leader", gossipSecond: true, inject: gossipCutLeader,
			event: func(tm timing) string {
				return fmt.Sprintf("the Raft leader's gossip cut both ways %s, Raft and the peer service flowing", secs(leaderCutFor(tm)))
			}},
		{name: "stranger-in-gossip", nodes: 4, expect: 3, joinAll: true, deferred: []int{4},
			nodeFlags: map[int][]string{4: {"--join", "", "--expect", "1", "--replicas", "1"}}, inject: strangerInGossip,
			event: func(tm timing) string {
				return fmt.Sprintf("n4, bootstrapped alone as a cluster of its own (`--expect 1 --replicas 1`), in every node's join list: its gossip merges, %s", secs(tm.fault))
			}},
	}
}

// gossipCutFollower cuts the gossip of a node that does not lead.
func gossipCutFollower(t *testing.T, c *cluster, tm timing) {
	l := agreedLeader(t, c)
	v := c.node(2)
	if v == l {
		v = c.node(3)
	}
	cutGossip(t, c, v, tm.fault, "")
}

// gossipCutLeader cuts the gossip of the node every node names its Raft
// leader.
func gossipCutLeader(t *testing.T, c *cluster, tm timing) {
	l := agreedLeader(t, c)
	cutGossip(t, c, l, leaderCutFor(tm), l.name)
}

// leaderCutFor is how long gossipCutLeader cuts the leader's gossip: the
// fault's length, but at least 15 s. Cut off from every other node's
// gossip, the leader's own failure detector slows down (memberlist's
// Lifeguard takes its failed probes for its own ill health), so it takes
// longer to declare the others dead than they take to declare it dead.
func leaderCutFor(tm timing) time.Duration { return max(tm.fault, 15*time.Second) }

// cutGossip drops, for the fault's length, what v sends to the others'
// second addresses and what they send to v's, where gossip listens (the
// scenario runs with gossipSecond): gossip is cut both ways, while Raft,
// renewals and peer calls, on the first addresses, flow. Every member
// renews all along, so no epoch may end: the member list's epochs must be
// the same after the cut, and a lease later, as before it. With leader
// set, v must still be the leader once the cut healed.
func cutGossip(t *testing.T, c *cluster, v *node, d time.Duration, leader string) {
	others := c.others(v)
	var theirs []string
	for _, o := range others {
		theirs = append(theirs, o.host.ip2)
	}
	cut := func(add bool) error {
		return errors.Join(blackholeRoutes(hosts(others), []string{v.host.ip2}, add), blackholeRoutes([]*host{v.host}, theirs, add))
	}
	before, err := liveEpochs(others[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cut(true); err != nil {
		t.Fatal(err)
	}
	what := v.name + "'s gossip cut both ways"
	if leader != "" {
		what = v.name + " (the leader)'s gossip cut both ways"
	}
	f := c.beginFault(gossipCut, what, []*node{v}, others)
	time.Sleep(d) // not a poll: the fault lasts this long
	if err := cut(false); err != nil {
		t.Fatal(err)
	}
	f.heal()
	same := true
	sameEpochs := func(when string) {
		after, err := liveEpochs(others[0])
		if err != nil {
			f.problem("%s: %v", when, err)
			same = false
			return
		}
		for _, name := range slices.Sorted(maps.Keys(before)) {
			if after[name] != before[name] {
				f.problem("%s, %s's live epoch is %d, was %d before the cut: an epoch ended while its member renewed", when, name, after[name], before[name])
				same = false
			}
		}
	}
	sameEpochs("as the cut healed")
	// An end marked during the cut is applied up to L·(1+ρ) later.
	time.Sleep(2500 * time.Millisecond) // not a poll: a lease and its margin pass
	sameEpochs("2.5 s after the cut healed")
	if same {
		f.note("every epoch the same before and after")
	}
	if leader != "" {
		if now := agreedLeader(t, c); now.name != leader {
			f.note("the leader is now %s", now.name)
		} else {
			f.note("%s led before and after", leader)
		}
	}
}

// liveEpochs returns the epoch of each member whose epoch is live, as n
// lists them.
func liveEpochs(n *node) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return nil, fmt.Errorf("%s: ListMembers: %v", n.name, err)
	}
	out := make(map[string]uint64)
	for _, m := range resp.Members {
		if m.Live {
			out[m.Name] = m.Epoch
		}
	}
	return out, nil
}

// strangerInGossip starts node 4 cut off from the others, with an empty
// join list, --expect 1 and --replicas 1: it bootstraps a cluster of its
// own. Its address is in the join list of nodes 1 to 3 (joinAll), as a
// reused pod address or a mislabelled pod behind a headless Service would
// be: once the cut is lifted their rejoin loop merges its gossip with
// theirs. For the fault's length after the merge, nodes 1 to 3 must keep
// running, none may list node 4 as a member, and one must have logged a
// warning that names it. Node 4 is killed at the end; its client sends no
// load (a cluster of its own decides the keys apart).
func strangerInGossip(t *testing.T, c *cluster, tm timing) {
	s, others := c.node(4), c.nodes[:3]
	if err := cutBetween([]*host{s.host}, hosts(others), true); err != nil {
		t.Fatal(err)
	}
	if err := startWithoutLoad(s); err != nil {
		t.Fatal(err)
	}
	if err := s.waitReady(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatalf("the stranger never bootstrapped its own cluster: %v", err)
	}
	theirs, ours := clusterID(s), clusterID(others[0])
	if theirs == "" || ours == "" || theirs == ours {
		t.Fatalf("cluster IDs: the stranger's %q, the others' %q; want two, different", theirs, ours)
	}
	f := c.beginFault(refused, "n4 (another cluster) merged into gossip", []*node{s}, others)
	defer s.kill()
	if err := cutBetween([]*host{s.host}, hosts(others), false); err != nil {
		t.Fatal(err)
	}
	exited := func() []string {
		var out []string
		for _, o := range others {
			if !o.running() {
				out = append(out, fmt.Sprintf("%s exited (%v): %s", o.name, o.cmd.ProcessState, lastLine(o.logTail(3))))
			}
		}
		return out
	}
	// The rejoin loop contacts the join list every 10 s.
	merged := time.Now()
	err := testkit.Wait(25*time.Second, func() error {
		if gone := exited(); len(gone) > 0 {
			return nil
		}
		for _, o := range others {
			st, err := o.members(time.Second)
			if err == nil && st[s.name].gossip == "alive" {
				return nil
			}
		}
		return fmt.Errorf("no node sees %s in gossip", s.name)
	})
	if err != nil {
		f.problem("the stranger's gossip never merged: %v", err)
		f.heal()
		return
	}
	f.note("merged %s after the cut was lifted", secs(time.Since(merged).Round(100*time.Millisecond)))
	end := time.Now().Add(tm.fault)
	admitted := map[string]bool{}
	for time.Now().Before(end) {
		if gone := exited(); len(gone) > 0 {
			// The ledger cannot be read without them: stop here.
			f.heal()
			t.Fatalf("a stranger in gossip stopped running nodes: %s", strings.Join(gone, "; "))
		}
		for _, o := range others {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := o.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
			cancel()
			if err != nil {
				continue
			}
			for _, m := range resp.Members {
				if m.Name == s.name && m.Phase != "" && !admitted[o.name] {
					admitted[o.name] = true
					f.problem("%s lists the stranger %s as a member (phase %s, state %s)", o.name, s.name, m.Phase, m.State)
				}
			}
		}
		time.Sleep(200 * time.Millisecond) // not a poll: the stranger stays this long
	}
	var warned []string
	for _, o := range others {
		for _, l := range o.logLines("another cluster") {
			if strings.Contains(l, s.name) && strings.Contains(l, theirs) {
				warned = append(warned, o.name+": "+strings.TrimSpace(l))
				break
			}
		}
	}
	if len(warned) == 0 {
		f.problem("no running node logged a warning naming the stranger %s and its cluster %s", s.name, theirs)
	} else {
		f.note("%d of %d warned, e.g. %s", len(warned), len(others), warned[0])
	}
	s.kill()
	f.heal()
}

// lastLine returns the last line of s.
func lastLine(s string) string { return s[strings.LastIndexByte(s, '\n')+1:] }

// clusterID returns the cluster ID n's map holds, "" if it cannot tell.
func clusterID(n *node) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return ""
	}
	return resp.ClusterId
}

// startWithoutLoad runs n as node.start does, but its client sends no
// load: n is not part of the cluster under test.
func startWithoutLoad(n *node) error {
	if err := os.Remove(n.readyFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	n.runs++
	fmt.Fprintf(n.log, "=== run %d of %s (no load) at %s\n", n.runs, n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("ip", n.args...)
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = n.log, n.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %v", n.name, err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(n.exited)
	return nil
}
