//go:build linux

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestChurn is a soak: a seeded random nemesis over five nodes (--expect
// 3, two copies of every key) under the suite's load, for
// SLUICE_CHURN_DURATION (default 40 s; docs/cluster.md gives the 30-minute
// run). Step after step it picks a node and a fault: a cut, a one-way cut,
// a pause, a kill -9 with or without its disk, a SIGTERM restart, a
// graceful leave that an operator forgets and that comes back as a new
// member with an empty disk, or a pause of the Raft leader; it waits
// until every running node is ready between steps. Then the ledger holds
// every key as in the single rows: none over its limit in a window (edge
// keys included), no two deciders at once, every acknowledged hit on
// every copy. The steps are a function of the seed (SLUICE_CHURN_SEED,
// else drawn and logged): a failure prints the seed, and the same seed
// plays the same steps again (their timing is the machine's).
func TestChurn(t *testing.T) {
	requireNetns(t)
	t.Parallel() // beside the suites of rows, in one of their slots
	seed := churnSeed(t)
	d := churnDuration(t)
	replay := fmt.Sprintf("SLUICE_CHURN_SEED=%d SLUICE_CHURN_DURATION=%v go test -race -run TestChurn ./cluster/faults -v", seed, d)
	t.Logf("churn: seed %d for %v; replay: %s", seed, d, replay)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("churn failed; replay: %s", replay)
		}
	})
	bin := sluiceBinary(t)
	slots.once.Do(func() { slots.ch = make(chan struct{}, parallelism(t)) })
	slots.ch <- struct{}{}
	defer func() { <-slots.ch }()

	c, err := startCluster(t, clusterConfig{bin: bin, nodes: 5, extraFlags: []string{"--expect", "3", "--admin-token", suiteAdminToken}})
	if err != nil {
		t.Fatal(err)
	}
	keys := churnKeys(c.names(), d)
	ld := startLoad(c.nodes, keys, defaultLoad())
	var once sync.Once
	var calls []call
	finish := func() { once.Do(func() { calls = ld.finish() }) }
	t.Cleanup(finish)

	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	time.Sleep(2 * time.Second) // not a poll: the limited keys fill up first
	var steps []string
	for end := time.Now().Add(d); time.Now().Before(end); {
		act := churnActions[rng.IntN(len(churnActions))]
		n := c.nodes[rng.IntN(len(c.nodes))]
		length := 5*time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		start := time.Now()
		what := act.do(t, c, n, length)
		if err := waitReady(c.running(), time.Now().Add(60*time.Second)); err != nil {
			t.Fatalf("step %d (%s): the cluster did not recover: %v", len(steps)+1, what, err)
		}
		steps = append(steps, fmt.Sprintf("%s %s (%.1f s)", start.Format("15:04:05.0"), what, time.Since(start).Seconds()))
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))) // not a poll: a pause between steps
	}
	time.Sleep(2 * time.Second) // not a poll: the load runs a moment after the last step
	finish()
	t.Logf("churn: %d steps: %s", len(steps), strings.Join(steps, "; "))

	live := c.running()
	st, err := settle(live, keys, 2, time.Now().Add(60*time.Second))
	if err != nil {
		t.Errorf("after the churn: %v", err)
	}
	c.mu.Lock()
	lostBefore := c.lostBefore
	c.mu.Unlock()
	results := ledger(keys, calls, st.copies, ld.end, lostBefore)
	checked := c.verifyFaults(t, calls)
	r := newReport("churn", fmt.Sprintf("churn, seed %d, %v, %d steps", seed, d, len(steps)), calls, results, st.copies != nil,
		[]string{fmt.Sprintf("%d faults, each seen", len(checked))})
	logLoad(t, calls, ld.end.Sub(ld.start), keys, results)
	checkResults(t, results)
	r.failed = t.Failed()
	t.Logf("%s\n%s", tableHeader, r.row())
}

// churnSeed is SLUICE_CHURN_SEED, or a seed drawn now.
func churnSeed(t *testing.T) uint64 {
	s := os.Getenv("SLUICE_CHURN_SEED")
	if s == "" {
		return rand.Uint64() % 1_000_000
	}
	seed, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("SLUICE_CHURN_SEED=%q: want a number", s)
	}
	return seed
}

// churnDuration is SLUICE_CHURN_DURATION, 40 s if unset.
func churnDuration(t *testing.T) time.Duration {
	s := os.Getenv("SLUICE_CHURN_DURATION")
	if s == "" {
		return 40 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("SLUICE_CHURN_DURATION=%q: want a positive duration (30m)", s)
	}
	return d
}

// churnKeys are the scenario keys without the fresh ones (they are sized
// for one fault), their ledger keys' window long enough that no hit of
// the run expires before the ledger is read.
func churnKeys(names []string, d time.Duration) []testKey {
	var keys []testKey
	for _, k := range scenarioKeys(names, 1, nil) {
		switch k.kind {
		case freshKey:
			continue
		case ledgerKey:
			k.window = max(k.window, 2*d+10*time.Minute)
		}
		keys = append(keys, k)
	}
	return keys
}

// churnAction is one kind of step: do injects it on n (or on the Raft
// leader) for about length, heals it, and says what it did.
type churnAction struct {
	name string
	do   func(t *testing.T, c *cluster, n *node, length time.Duration) string
}

var churnActions = []churnAction{
	{"cut", func(t *testing.T, c *cluster, n *node, length time.Duration) string {
		cutLink(t, c, n, length)
		return n.name + " cut off"
	}},
	{"one-way cut", func(t *testing.T, c *cluster, n *node, length time.Duration) string {
		if err := n.host.blackhole(true); err != nil {
			t.Fatal(err)
		}
		f := c.beginFault(cutOff, n.name+" cut one way", []*node{n}, c.others(n))
		time.Sleep(length) // not a poll: the fault lasts this long
		if err := n.host.blackhole(false); err != nil {
			t.Fatal(err)
		}
		f.heal()
		return n.name + " cut one way"
	}},
	{"pause", func(t *testing.T, c *cluster, n *node, length time.Duration) string {
		pauseFor(t, c, n, length, c.others(n))
		return n.name + " paused"
	}},
	{"kill -9", func(t *testing.T, c *cluster, n *node, length time.Duration) string {
		f := killNode(t, c, n, false, c.others(n))
		time.Sleep(length) // not a poll: the node stays down this long
		returnNode(t, n, f)
		return n.name + " killed -9"
	}},
	{"kill -9, disk wiped", func(t *testing.T, c *cluster, n *node, length time.Duration) string {
		f := killNode(t, c, n, true, c.others(n))
		time.Sleep(length) // not a poll: the node stays down this long
		returnNode(t, n, f)
		return n.name + " killed -9, its disk wiped"
	}},
	{"restart", func(t *testing.T, c *cluster, n *node, length time.Duration) string {
		f := c.beginFault(restarted, n.name+" restarted", []*node{n}, nil)
		defer f.heal()
		stopGracefully(t, f, n)
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
		return n.name + " restarted (SIGTERM)"
	}},
	{"leave, forget, return empty", func(t *testing.T, c *cluster, n *node, length time.Duration) string {
		f := c.beginFault(restarted, n.name+" left, forgotten, back empty", []*node{n}, nil)
		defer f.heal()
		stopGracefully(t, f, n)
		via := c.others(n)[0]
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		resp, err := via.admin.ForgetMember(ctx, &sluicepb.ForgetMemberRequest{Name: n.name})
		cancel()
		switch {
		case err != nil:
			f.problem("ForgetMember(%s) through %s: %v", n.name, via.name, err)
		case !resp.FromCopies:
			// Its keys had no complete copy: what it acknowledged may be
			// gone with it.
			c.mu.Lock()
			c.lostBefore = time.Now()
			c.mu.Unlock()
		}
		if err := os.RemoveAll(n.dataDir()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(length) // not a poll: the node stays away this long
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%s left, forgotten (from copies: %v), back empty", n.name, err == nil && resp.FromCopies)
	}},
	{"leader paused", func(t *testing.T, c *cluster, _ *node, length time.Duration) string {
		l := agreedLeader(t, c)
		pauseFor(t, c, l, length, c.others(l))
		return l.name + " (the leader) paused"
	}},
}

// stopGracefully stops n with SIGTERM and reports whether it exited 0;
// any other exit is a problem of the fault f.
func stopGracefully(t *testing.T, f *fault, n *node) bool {
	if err := n.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := n.waitStopped(60 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		f.problem("%s exited %d after SIGTERM; want 0", n.name, code)
	}
	return code == 0
}

// waitReady waits until every one of nodes is ready, or deadline.
func waitReady(nodes []*node, deadline time.Time) error {
	for _, n := range nodes {
		if err := n.waitReady(deadline); err != nil {
			return err
		}
	}
	return nil
}
