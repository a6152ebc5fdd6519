//go:build linux

package faults

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// forgetFlows are the runbook's replacement of a dead node, and a
// forgotten member's keys meeting a member that had left and came back.
// Both run with one replica: the dead node's disk holds the only copy of
// its keys, so its tombstone is all that keeps them under their limit.
// The hits the dead node acknowledged are lost with its disk (that is what
// --replicas 1 means); every hit acknowledged after it was forgotten must
// be held (lostBefore).
func forgetFlows() []scenario {
	return []scenario{
		{name: "forget-then-replace", replicas: 1, nodes: 4, expect: 3, deferred: []int{4},
			keep: ownedBy("n3", "n4"), inject: forgetThenReplace,
			event: fixed("`--replicas 1`, keys at their limit on n3: n3 paused for good; once its epoch ended, `sluice members forget n3`; a replacement n4 (ranking above n3 for half the keys) started")},
		{name: "forget-then-return", replicas: 1, nodes: 4,
			keep: ownedBy("n3", "n4"), inject: forgetThenReturn,
			event: fixed("`--replicas 1`: n4 stopped and forgotten; then n3 paused for good and forgotten with the keys at their limit; then n4 back (ranking above n3 for half the keys)")},
	}
}

// forgetThenReplace plays the runbook's "replace a dead node": node 3, the
// owner of every key, stops for good (SIGSTOP, then SIGKILL with its disk
// gone); once its epoch ended the operator forgets it and starts node 4,
// which ranks above node 3 for about half the keys.
func forgetThenReplace(t *testing.T, c *cluster, tm timing) {
	dead, repl := c.node(3), c.node(4)
	observers := c.others(dead, repl)
	forgetForGood(t, c, dead, observers)
	startAndDrive(t, c, repl, "replacement n4 started", tm)
}

// forgetThenReturn: node 4 stops (SIGTERM, handing its keys to node 3)
// and is forgotten; node 3 then stops for good and is forgotten with
// every key at its limit; node 4 comes back, as a new member, and ranks
// above node 3 for about half the keys.
func forgetThenReturn(t *testing.T, c *cluster, tm timing) {
	dead, back := c.node(3), c.node(4)
	observers := c.others(dead, back)
	f := c.beginFault(restarted, "n4 stopped and forgotten", []*node{back}, nil)
	if err := back.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := back.waitStopped(30 * time.Second); err != nil || code != 0 {
		f.problem("n4 after SIGTERM: exit %d, %v; want 0", code, err)
	}
	forget(f, c.node(1), back.name)
	f.heal()
	forgetForGood(t, c, dead, observers)
	startAndDrive(t, c, back, "n4 back", tm)
}

// startAndDrive starts n, waits until it is ready, and lets the load drive
// the keys through it for the fault's length: n must decide some of them.
func startAndDrive(t *testing.T, c *cluster, n *node, what string, tm timing) {
	f := c.beginFault(restarted, what, []*node{n}, nil)
	defer f.heal()
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
	if err := n.waitReady(time.Now().Add(60 * time.Second)); err != nil {
		f.problem("%v", err)
		return
	}
	f.note("ready")
	time.Sleep(tm.fault) // not a poll: the load drives the keys through n this long
	requireDecides(f, n)
}

// forgetForGood pauses n, waits until the others ended its epoch, kills it
// and wipes its disk (the machine is gone), and forgets it through node 1
// as docs/operations.md's runbook does. Hits acknowledged before the
// forget may be lost with its disk.
func forgetForGood(t *testing.T, c *cluster, n *node, observers []*node) {
	f := stopNode(t, c, n, observers)
	defer f.heal()
	deadline := time.Now().Add(30 * time.Second)
	for !epochEnded(c.node(1), n.name) {
		if time.Now().After(deadline) {
			f.problem("%s's epoch did not end within 30 s of its pause", n.name)
			return
		}
		time.Sleep(200 * time.Millisecond) // a poll
	}
	f.note("its epoch ended after %s", secs(time.Since(f.start).Round(100*time.Millisecond)))
	if err := n.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := n.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(n.dataDir()); err != nil {
		t.Fatal(err)
	}
	forget(f, c.node(1), n.name)
	c.mu.Lock()
	c.lostBefore = time.Now()
	c.mu.Unlock()
}

// forget forgets the member named name through node via, as `sluice
// members forget` does, trying again while the control plane answers
// Unavailable (an election under way).
func forget(f *fault, via *node, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		resp, err := via.admin.ForgetMember(ctx, &sluicepb.ForgetMemberRequest{Name: name})
		switch {
		case err == nil:
			f.note("%s forgotten (its keys from copies: %v)", name, resp.FromCopies)
			return
		case status.Code(err) != codes.Unavailable && status.Code(err) != codes.FailedPrecondition || ctx.Err() != nil:
			f.problem("ForgetMember(%s) through %s: %v", name, via.name, err)
			return
		}
		time.Sleep(200 * time.Millisecond) // a poll
	}
}

// epochEnded reports whether via lists name's epoch as ended.
func epochEnded(via *node, name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := via.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return false
	}
	for _, m := range resp.Members {
		if m.Name == name {
			return !m.Live
		}
	}
	return false
}

// requireDecides makes the fault a problem unless n, the node that joined
// or came back, decided some of the scenario's checks while the fault
// lasted: otherwise the row did not test what it is for.
func requireDecides(f *fault, n *node) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mustDecide = append(f.mustDecide, n.name)
}
