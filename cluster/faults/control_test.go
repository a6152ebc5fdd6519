//go:build linux

package faults

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// controlFlows returns this file's rows of TestOperatorFlows: the leader
// frozen while a node starts its epoch, and a standby's copy lane stalled
// across an epoch change of the keys' owner.
func controlFlows() []scenario {
	return []scenario{
		{name: "leader-frozen-at-epoch-start", peerAddr: true, inject: leaderFrozenAtEpochStart,
			event: func(tm timing) string {
				return fmt.Sprintf("a follower's calls to the Raft leader's peer address dropped until its epoch ends and its proposal of a new one waits on the leader; then the leader paused (SIGSTOP) %s and the drop lifted", secs(max(tm.fault, frozenBound)))
			}},
		{name: "standby-lane-stalled-across-epoch", peerAddr: true, keep: ownedBy2("n2", "n3"), inject: standbyLaneStalledAcrossEpoch,
			event: func(tm timing) string {
				return fmt.Sprintf("n2's copies to n3, the standby of every key, dropped; n2 paused %s (its epoch ends) and given a new one while the lane still stalls, which lifts 1 s later", secs(tm.fault))
			}},
	}
}

// frozenBound is how long after the leader froze a node waiting for its
// epoch may take to get one from the new leader: an election (about
// RaftTimeout to twice that), the new leader's barrier, the proposal.
const frozenBound = 10 * time.Second

// ownedBy2 keeps the keys whose owner is a and standby b, in that order.
func ownedBy2(a, b string) func(order []string) bool {
	return func(order []string) bool { return order[0] == a && order[1] == b }
}

// leaderSeenBy is the leader n names, "" if it names none or does not
// answer.
func leaderSeenBy(n *node) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := n.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return ""
	}
	return resp.Leader
}

// waitLines waits up to d until n's log holds more than before lines with
// s, and reports whether it does.
func waitLines(n *node, s string, before int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		if len(n.logLines(s)) > before {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// leaderFrozenAtEpochStart freezes the Raft leader while a follower's
// proposal of its new epoch waits on it. The follower's calls to the
// leader's peer address are dropped (Raft from the leader still reaches
// it): its renewals go unanswered, the leader ends its epoch, and its
// proposal of a new one leaves on its connection to the leader and waits.
// Then the leader is paused and the drop lifted, so that the proposal
// reaches a leader that never answers. The follower must get its epoch
// from the new leader within frozenBound.
func leaderFrozenAtEpochStart(t *testing.T, c *cluster, tm timing) {
	l := agreedLeader(t, c)
	others := c.others(l)
	v, third := others[0], others[1]
	started, ended := len(v.logLines("epoch started")), len(v.logLines("this node's epoch ended"))
	if err := blackholeRoutes([]*host{v.host}, []string{l.host.ip2}, true); err != nil {
		t.Fatal(err)
	}
	cut := c.beginFault(cutOff, fmt.Sprintf("%s's calls to the leader %s dropped", v.name, l.name), []*node{v}, []*node{third})
	if !waitLines(v, "this node's epoch ended", ended, 20*time.Second) {
		cut.problem("%s's epoch did not end within 20 s of its calls to the leader being dropped", v.name)
	}
	time.Sleep(500 * time.Millisecond) // not a poll: its proposal of a new epoch is on its way to the leader
	if len(v.logLines("epoch started")) > started {
		cut.problem("%s started an epoch while its calls to the leader were dropped", v.name)
	}
	cut.note("%s's epoch ended, its proposal of a new one waits on %s", v.name, l.name)
	p := stopNode(t, c, l, others)
	frozen := time.Now()
	if err := blackholeRoutes([]*host{v.host}, []string{l.host.ip2}, false); err != nil {
		t.Fatal(err)
	}
	cut.heal()
	p.note("%s was the leader all nodes named", l.name)
	if waitLines(v, "epoch started", started, frozenBound) {
		p.note("%s got its epoch %s after the leader froze, from %s", v.name, secs(time.Since(frozen).Round(100*time.Millisecond)), leaderSeenBy(v))
	} else {
		p.problem("%s has no epoch %s after the leader %s froze (its proposal waits on the frozen leader); want one from the new leader", v.name, secs(frozenBound), l.name)
	}
	if nl := leaderSeenBy(third); nl == l.name || nl == "" {
		p.problem("%s names %q the leader %s after %s froze; want another", third.name, nl, secs(time.Since(frozen).Round(100*time.Millisecond)), l.name)
	}
	time.Sleep(max(0, max(tm.fault, frozenBound)-time.Since(frozen))) // not a poll: the leader stays frozen this long
	contNode(t, l, p)
}

// standbyLaneStalledAcrossEpoch stalls node 2's copies to node 3, the
// standby of every key, by dropping what node 2 sends to node 3's peer
// address; pauses node 2 until its epoch has ended; continues it, waits
// for its new epoch while the lane still stalls, and lifts the drop a
// second later. Copies written under the ended epoch must not reach the
// standby as the new epoch's.
func standbyLaneStalledAcrossEpoch(t *testing.T, c *cluster, tm timing) {
	owner, standby := c.node(2), c.node(3)
	// The owner reaches the leader through its peer address, which the
	// stall cuts on the standby: the leader must be the third node. While
	// it is not, a short pause of the leader (under a lease, so no epoch
	// ends) makes Raft elect again.
	for i := 0; ; i++ {
		l := agreedLeader(t, c)
		if l == c.node(1) {
			break
		}
		if i == 10 {
			t.Fatalf("n1 was not elected Raft leader in %d elections", i)
		}
		if err := l.signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1200 * time.Millisecond) // not a poll: longer than an election timeout, shorter than a lease
		if err := l.signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := waitReady(c.running(), time.Now().Add(30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	started := len(owner.logLines("epoch started"))
	if err := blackholeRoutes([]*host{owner.host}, []string{standby.host.ip2}, true); err != nil {
		t.Fatal(err)
	}
	stall := c.beginFault(gossipBlind, fmt.Sprintf("%s's copies to %s dropped", owner.name, standby.name), []*node{standby}, []*node{owner})
	time.Sleep(time.Second) // not a poll: copies queue on the stalled lane
	p := stopNode(t, c, owner, c.others(owner))
	time.Sleep(tm.fault) // not a poll: the pause outlasts the owner's lease, and its epoch ends
	contNode(t, owner, p)
	if waitLines(owner, "epoch started", started, 20*time.Second) {
		stall.note("%s got a new epoch while the lane stalled", owner.name)
	} else {
		stall.problem("%s got no new epoch within 20 s of its pause", owner.name)
	}
	time.Sleep(time.Second) // not a poll: the new epoch writes while the lane stalls
	if err := blackholeRoutes([]*host{owner.host}, []string{standby.host.ip2}, false); err != nil {
		t.Fatal(err)
	}
	stall.heal()
}
