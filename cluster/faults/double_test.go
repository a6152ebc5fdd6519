//go:build linux

package faults

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// doubleFaults returns the double faults and operator mistakes of issue
// 19: events a StatefulSet meets in its first month, which the hand-made
// control plane of today does not survive. They are the measure of the
// Raft control plane.
func doubleFaults() []scenario {
	return []scenario{
		{name: "owner-and-standby-cut", nodes: 5, keep: ownedBy("n4", "n5"), inject: ownerAndStandbyCut,
			event: func(tm timing) string {
				return fmt.Sprintf("5 nodes, `--expect 5`: the owner and the standby of every key (n4, n5) cut off together %s, reaching each other", secs(tm.fault))
			}},
		{name: "owner-killed-standby-paused", nodes: 5, keep: ownedBy("n2", "n3"), inject: ownerKilledStandbyPaused,
			event: func(tm timing) string {
				return fmt.Sprintf("5 nodes: the standby of every key (n3) paused, then its owner (n2) killed -9, both back %s later", secs(tm.fault))
			}},
		{name: "forget-during-pause", replicas: 1, inject: forgetDuringPause,
			event: func(tm timing) string {
				return fmt.Sprintf("`--replicas 1`: n2 paused %s, `sluice members forget n2` 4 s into it, then it resumes", secs(forgetPause(tm)))
			}},
		{name: "stale-expect-cut", nodeFlags: map[int][]string{3: {"--expect", "1"}}, inject: staleExpectCut,
			event: func(tm timing) string {
				return fmt.Sprintf("n3 started with `--expect 1` (a stale manifest), then cut off %s", secs(tm.fault))
			}},
		{name: "mismatched-replicas", expect: 2, deferred: []int{3}, nodeFlags: map[int][]string{3: {"--replicas", "1"}}, mayExit: []int{3}, inject: mismatchedReplicas,
			event: fixed("n3 started with `--replicas 1` beside a cluster of two with 2: it must refuse to join, naming the setting")},
		{name: "scale-during-rolling-restart", nodes: 5, expect: 3, deferred: []int{4, 5},
			nodeFlags: map[int][]string{4: {"--expect", "5"}, 5: {"--expect", "5"}}, inject: scaleDuringRollingRestart,
			event: fixed("scale 3 → 5 (`--expect 5` on the new nodes) during a rolling restart of n1–n3 to `--expect 5`")},
		{name: "wiped-disk-and-pause", inject: wipedDiskAndPause,
			event: func(tm timing) string {
				return fmt.Sprintf("n2 killed -9 and its disk wiped, back %s later, while n3 is paused %s", secs(tm.down), secs(tm.fault))
			}},
		{name: "owner-wiped-standby-lagging", keep: ownedBy("n2", "n3"), inject: wipedDiskAndPause,
			event: func(tm timing) string {
				return fmt.Sprintf("keys owned by n2 and n3: one paused %s, the other killed -9 with its disk wiped at the same moment, back %s later", secs(tm.fault), secs(tm.down))
			}},
		{name: "one-way-cut-gossip-blind", peerAddr: true, inject: gossipBlindCut,
			event: func(tm timing) string {
				return fmt.Sprintf("one-way cut of n2's peer address only (gossip on another address still flows) %s", secs(tm.fault))
			}},
		{name: "new-keys-at-partition", freshAtFault: true, inject: partition,
			event: func(tm timing) string {
				return fmt.Sprintf("node 2 cut off %s, the fresh keys first checked at the moment of the cut", secs(tm.fault))
			}},
		{name: "cut-then-wiped-disk", inject: cutThenWipedDisk,
			event: func(tm timing) string {
				return fmt.Sprintf("n2 cut off; %s later, once its keys went on from their copies, killed -9 with its disk wiped; back empty as the cut heals %s after it began", secs(tm.fault/2), secs(tm.fault))
			}},
		{name: "whole-cluster/sigterm", inject: func(t *testing.T, c *cluster, tm timing) { wholeCluster(t, c, tm, syscall.SIGTERM) },
			event: fixed("every node stopped at once with SIGTERM, all started again")},
		{name: "whole-cluster/kill9", inject: func(t *testing.T, c *cluster, tm timing) { wholeCluster(t, c, tm, syscall.SIGKILL) },
			event: func(tm timing) string {
				return fmt.Sprintf("every node killed -9 at once, all back %s later", secs(tm.down))
			}},
		{name: "non-transitive-partition", inject: nonTransitivePartition,
			event: func(tm timing) string {
				return fmt.Sprintf("n1 and n2 cut off from each other %s, both still reaching n3", secs(tm.fault))
			}},
		{name: "leader-killed-during-handoff", inject: leaderKilledDuringHandoff,
			event: func(tm timing) string {
				return fmt.Sprintf("a follower stopped with SIGTERM (handing its keys over) and the Raft leader killed -9 at once; both back %s later", secs(tm.down))
			}},
		{name: "two-processes-one-name", nodes: 4, expect: 3, deferred: []int{4}, mayExit: []int{4},
			nodeFlags: map[int][]string{4: {"--node-name", "n2"}}, inject: twoProcessesOneName,
			event: func(tm timing) string {
				return fmt.Sprintf("a second process named n2 (its own empty data directory, on a fourth host) started beside n2 for %s", secs(tm.fault))
			}},
		{name: "leader-paused", inject: leaderPaused,
			event: func(tm timing) string { return fmt.Sprintf("the Raft leader paused %s", secs(tm.fault)) }},
		{name: "leader-cut", inject: leaderCut,
			event: func(tm timing) string { return fmt.Sprintf("the Raft leader cut off %s", secs(tm.fault)) }},
	}
}

// TestDoubleFaults runs the double faults and operator mistakes of issue
// 19 as TestFaults runs the single ones, with the same checks.
func TestDoubleFaults(t *testing.T) {
	requireNetns(t)
	runScenarios(t, doubleFaults(), "what each double fault cost")
}

// ownedBy keeps the keys whose owner and standby are, in either order,
// the two nodes named.
func ownedBy(a, b string) func(order []string) bool {
	return func(order []string) bool {
		return order[0] == a && order[1] == b || order[0] == b && order[1] == a
	}
}

// ownerAndStandbyCut cuts nodes 4 and 5 (the owner and the standby of
// every key) off from nodes 1 to 3 for the fault's length; they still
// reach each other, as a zone of a 2-2-1 layout would.
func ownerAndStandbyCut(t *testing.T, c *cluster, tm timing) {
	zone, rest := c.nodes[3:], c.nodes[:3]
	if err := cutBetween(hosts(zone), hosts(rest), true); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(cutOff, "n4, n5 cut off from n1–n3", zone, rest)
	time.Sleep(tm.fault) // not a poll: the fault lasts this long
	if err := cutBetween(hosts(zone), hosts(rest), false); err != nil {
		t.Fatal(err)
	}
	f.heal()
}

// hosts returns the hosts of nodes.
func hosts(nodes []*node) []*host {
	var out []*host
	for _, n := range nodes {
		out = append(out, n.host)
	}
	return out
}

// ownerKilledStandbyPaused pauses node 3 (the standby of every key), kills
// node 2 (their owner) with SIGKILL half a second later, and brings both
// back at the end of the fault.
func ownerKilledStandbyPaused(t *testing.T, c *cluster, tm timing) {
	owner, standby := c.node(2), c.node(3)
	observers := c.others(owner, standby)
	p := stopNode(t, c, standby, observers)
	time.Sleep(500 * time.Millisecond) // not a poll: the kill comes half a second into the pause
	k := killNode(t, c, owner, false, observers)
	time.Sleep(tm.fault - 500*time.Millisecond) // not a poll: the fault lasts this long
	returnNode(t, owner, k)
	contNode(t, standby, p)
}

// forgetPause is how long forgetDuringPause pauses its node: the fault's
// length, but long enough to forget it 4 s in and wait a moment more.
func forgetPause(tm timing) time.Duration { return max(tm.fault, 6*time.Second) }

// forgetDuringPause pauses node 2, and 4 s later has node 1 forget it
// (AdminService.ForgetMember, as `sluice members forget n2` does, and as
// docs/operations.md advises for a node gone for good); then node 2
// resumes.
func forgetDuringPause(t *testing.T, c *cluster, tm timing) {
	n := c.node(2)
	d := forgetPause(tm)
	start := time.Now()
	f := stopNode(t, c, n, c.others(n))
	time.Sleep(4 * time.Second) // not a poll: the operator forgets the node 4 s into its pause
	// The operator tries again while the control plane answers
	// Unavailable (no leader yet: the paused node may have led it, and a
	// loaded machine elects slowly): the error says an election may be
	// under way.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	resp, err := c.node(1).admin.ForgetMember(ctx, &sluicepb.ForgetMemberRequest{Name: n.name})
	for status.Code(err) == codes.Unavailable && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
			resp, err = c.node(1).admin.ForgetMember(ctx, &sluicepb.ForgetMemberRequest{Name: n.name})
		}
	}
	cancel()
	if err != nil {
		f.problem("ForgetMember(%s) through n1: %v", n.name, err)
	} else {
		f.note("forgotten after %s (its keys from copies: %v)", secs(time.Since(start)), resp.FromCopies)
	}
	time.Sleep(max(0, d-time.Since(start))) // not a poll: the pause lasts d
	contNode(t, n, f)
}

// staleExpectCut cuts node 3, started with --expect 1 (a stale manifest),
// off for the fault's length.
func staleExpectCut(t *testing.T, c *cluster, tm timing) {
	cutLink(t, c, c.node(3), tm.fault)
}

// refusalLine matches the line a node refused for a different --replicas
// must print: the setting, and both values.
var refusalLine = regexp.MustCompile(`replicas\D*(1\D+2|2\D+1)\b`)

// mismatchedReplicas starts node 3 with --replicas 1 beside a cluster of
// two nodes with 2, and expects it to refuse to join: to exit non-zero
// with one line naming the setting and both values. The others must go
// on unaffected (the ledger checks them). At a first start such a node is
// left out of the bootstrap set (docs/cluster.md, "Bootstrap"): with
// fewer than --expect nodes agreeing, none bootstraps.
func mismatchedReplicas(t *testing.T, c *cluster, tm timing) {
	n := c.node(3)
	f := c.beginFault(refused, "n3 started with --replicas 1", []*node{n}, c.others(n))
	defer f.heal()
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
	code, err := n.wait(tm.fault + 20*time.Second)
	switch {
	case err != nil:
		f.problem("n3, started with --replicas 1 beside nodes with 2, still runs: it joined instead of refusing")
		return
	case code == 0:
		f.problem("n3, started with --replicas 1 beside nodes with 2, exited 0; want a non-zero exit")
	}
	var lines []string
	for _, l := range n.logLines("replicas") {
		if refusalLine.MatchString(l) {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		f.problem("n3 exited %d without a line naming --replicas and both values (1 and 2); its last lines:\n%s", code, n.logTail(5))
		return
	}
	f.note("n3 exited %d: %s", code, strings.TrimSpace(lines[0]))
}

// scaleDuringRollingRestart starts nodes 4 and 5 (with --expect 5) and, at
// once, restarts nodes 1 to 3 in turn with --expect 5, as a StatefulSet
// scaled from 3 to 5 with a chart that ties --expect to the replicas does.
func scaleDuringRollingRestart(t *testing.T, c *cluster, tm timing) {
	added := c.nodes[3:]
	f := c.beginFault(restarted, "n4, n5 started", added, nil)
	for _, n := range added {
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
	}
	restart(t, c, tm, c.nodes[:3], []string{"--expect", "5"})
	for _, n := range added {
		if err := n.waitReady(time.Now().Add(60 * time.Second)); err != nil {
			f.problem("%v", err)
		}
	}
	f.note("ready")
	f.heal()
}

// wipedDiskAndPause kills node 2 with SIGKILL and wipes its data
// directory while node 3 is paused; node 2 comes back empty after the
// down time, node 3 at the end of the fault.
func wipedDiskAndPause(t *testing.T, c *cluster, tm timing) {
	wiped, stopped := c.node(2), c.node(3)
	observers := c.others(wiped, stopped)
	p := stopNode(t, c, stopped, observers)
	k := killNode(t, c, wiped, true, observers)
	time.Sleep(tm.down) // not a poll: the node stays down this long
	returnNode(t, wiped, k)
	time.Sleep(tm.fault - tm.down) // not a poll: the pause lasts the fault's length
	contNode(t, stopped, p)
}

// gossipBlindCut makes nodes 1 and 3 drop what they send to node 2's
// second address, where its peer service listens, for the fault's length:
// gossip, on the first address, still flows both ways, so nobody sees
// node 2 down, while nothing the others send its peer service arrives.
func gossipBlindCut(t *testing.T, c *cluster, tm timing) {
	n := c.node(2)
	if err := n.host.blackholeSecond(true); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(gossipBlind, "n2's peer address cut one way", []*node{n}, c.others(n))
	time.Sleep(tm.fault) // not a poll: the fault lasts this long
	if err := n.host.blackholeSecond(false); err != nil {
		t.Fatal(err)
	}
	f.heal()
}

// cutThenWipedDisk cuts node 2 off, kills it with SIGKILL and wipes its
// disk half way through the cut, and starts it again, empty, as the cut
// heals: every hit it acknowledged must be on its standbys, since its own
// disk is gone (it must acknowledge nothing while cut off that its
// standbys lack).
func cutThenWipedDisk(t *testing.T, c *cluster, tm timing) {
	n := c.node(2)
	if err := n.host.setLink(false); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(cutOff, "n2 cut off", []*node{n}, c.others(n))
	time.Sleep(tm.fault / 2) // not a poll: the node is killed half way through the cut
	k := killNode(t, c, n, true, c.others(n))
	time.Sleep(tm.fault / 2) // not a poll: the cut lasts the fault's length
	if err := n.host.setLink(true); err != nil {
		t.Fatal(err)
	}
	f.heal()
	returnNode(t, n, k)
}

// wholeCluster stops every node at once with sig (SIGTERM: each must exit
// 0; SIGKILL: each is down for the fault's down time), then starts every
// one again on its data directory and waits until all are ready.
func wholeCluster(t *testing.T, c *cluster, tm timing, sig syscall.Signal) {
	what := "every node stopped with SIGTERM"
	if sig == syscall.SIGKILL {
		what = "every node killed -9"
	}
	f := c.beginFault(restarted, what, c.nodes, nil)
	defer f.heal()
	for _, n := range c.nodes {
		if err := n.signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.nodes {
		code, err := n.waitStopped(60 * time.Second)
		switch {
		case err != nil:
			t.Fatal(err)
		case sig == syscall.SIGTERM && code != 0:
			f.problem("%s exited %d after SIGTERM; want 0", n.name, code)
		}
	}
	if sig == syscall.SIGKILL {
		time.Sleep(tm.down) // not a poll: the nodes stay down this long
	}
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.nodes {
		if err := n.waitReady(time.Now().Add(60 * time.Second)); err != nil {
			f.problem("%v", err)
			return
		}
	}
	f.note("all stopped and ready again")
}

// nonTransitivePartition cuts node 1 and node 2 off from each other for
// the fault's length; each still reaches node 3 (and gossip's indirect
// probes through it).
func nonTransitivePartition(t *testing.T, c *cluster, tm timing) {
	a, b := c.node(1), c.node(2)
	if err := cutBetween(hosts([]*node{a}), hosts([]*node{b}), true); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(restarted, "n1 and n2 cut off from each other", nil, nil)
	for _, p := range [][2]*node{{a, b}, {b, a}, {a, c.node(3)}, {b, c.node(3)}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := p[0].host.dial(ctx, net.JoinHostPort(p[1].host.ip, grpcPort))
		cancel()
		cut := p[1] != c.node(3)
		switch {
		case err == nil:
			conn.Close()
			if cut {
				f.problem("%s reached %s through the cut", p[0].name, p[1].name)
			}
		case !cut:
			f.problem("%s could not reach n3: %v", p[0].name, err)
		}
	}
	f.note("n1 and n2 could not reach each other, both reached n3")
	time.Sleep(tm.fault) // not a poll: the fault lasts this long
	if err := cutBetween(hosts([]*node{a}), hosts([]*node{b}), false); err != nil {
		t.Fatal(err)
	}
	f.heal()
}

// leaderKilledDuringHandoff stops a follower with SIGTERM, which hands
// its keys over and ends its epoch through the leader, and kills the Raft
// leader with SIGKILL at the same moment; both come back after the down
// time.
func leaderKilledDuringHandoff(t *testing.T, c *cluster, tm timing) {
	l := agreedLeader(t, c)
	v := c.others(l)[0]
	f := c.beginFault(restarted, v.name+" stopped with SIGTERM", []*node{v}, nil)
	if err := v.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	k := killNode(t, c, l, false, nil)
	k.note("%s was the leader", l.name)
	if code, err := v.waitStopped(60 * time.Second); err != nil {
		t.Fatal(err)
	} else {
		f.note("it exited %d", code)
	}
	time.Sleep(tm.down) // not a poll: both stay down this long
	returnNode(t, l, k)
	if err := v.start(); err != nil {
		t.Fatal(err)
	}
	f.heal()
}

// twoProcessesOneName starts node 4 under n2's name (a copy of a pod's
// manifest, a host renamed by mistake) with an empty data directory, lets
// it run for the fault's length, then kills it and wipes its disk. Its
// calls and n2's carry the same node name, so the ledger's limits, not
// the one-decider check, are what would show two deciders here.
func twoProcessesOneName(t *testing.T, c *cluster, tm timing) {
	imp := c.node(4)
	f := c.beginFault(restarted, "a second n2 started", []*node{imp}, nil)
	defer f.heal()
	if err := imp.start(); err != nil {
		t.Fatal(err)
	}
	if err := imp.waitReady(time.Now().Add(tm.fault)); err != nil {
		f.note("the second n2 did not become ready: %v", err)
	} else {
		f.note("the second n2 became ready")
	}
	time.Sleep(tm.fault) // not a poll: both run this long
	if lines := imp.logLines("conflict"); len(lines) > 0 {
		f.note("it logged: %s", strings.TrimSpace(lines[0]))
	}
	if imp.running() {
		if err := imp.signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		imp.wait(10 * time.Second)
	}
	if err := os.RemoveAll(imp.dataDir()); err != nil {
		t.Fatal(err)
	}
	if err := waitReady(c.running(), time.Now().Add(60*time.Second)); err != nil {
		f.problem("after the second n2 was gone: %v", err)
	}
}

// leaderPaused pauses the control plane's leader for the fault's length.
func leaderPaused(t *testing.T, c *cluster, tm timing) {
	l := agreedLeader(t, c)
	pauseFor(t, c, l, tm.fault, c.others(l))
}

// leaderCut cuts the control plane's leader off for the fault's length.
func leaderCut(t *testing.T, c *cluster, tm timing) {
	cutLink(t, c, agreedLeader(t, c), tm.fault)
}

// agreedLeader returns the node every running node names as the Raft
// leader, polling up to 10 s; it fails the test if they never agree (a
// row about the leader must hit the leader, not a node taken for it).
func agreedLeader(t *testing.T, c *cluster) *node {
	t.Helper()
	var leader *node
	err := testkit.Wait(10*time.Second, func() error {
		names := map[string]bool{}
		for _, n := range c.running() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := n.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
			cancel()
			if err != nil {
				return fmt.Errorf("%s: %v", n.name, err)
			}
			names[resp.Leader] = true
		}
		if len(names) != 1 || names[""] {
			return fmt.Errorf("the nodes name leaders %q", slices.Sorted(maps.Keys(names)))
		}
		for _, n := range c.nodes {
			if names[n.name] {
				leader = n
				return nil
			}
		}
		return fmt.Errorf("the leader named is none of the nodes")
	})
	if err != nil {
		t.Fatalf("find the Raft leader: %v", err)
	}
	return leader
}
