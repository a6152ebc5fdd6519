package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// routingClient returns a client of every node of tc, routing, whose view
// is refreshed only when an answer asks for it (RoutesRefresh of an hour),
// connected and holding a view of tc's current ownership.
func routingClient(t *testing.T, tc *nodetest.Cluster, edit func(*client.Config)) *client.Client {
	t.Helper()
	c := newClient(t, tc.Addrs(), func(cfg *client.Config) {
		cfg.RoutesRefresh = time.Hour
		if edit != nil {
			edit(cfg)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	waitView(t, tc, c, 0)
	return c
}

// waitView waits until c's view has the version of the ownership every
// running node of tc routes under, and that version is above after.
func waitView(t *testing.T, tc *nodetest.Cluster, c *client.Client, after uint64) uint64 {
	t.Helper()
	var got uint64
	err := testkit.Wait(10*time.Second, func() error {
		want := uint64(0)
		same := true
		for i, n := range tc.Running() {
			v := n.Server().Router().RoutesVersion()
			if i > 0 && v != want {
				same = false
			}
			want = v
		}
		got = c.Stats().RoutesVersion
		if same && got == want && got > after {
			return nil
		}
		return fmt.Errorf("client view at version %d; the nodes route under %d (all the same: %v), want above %d", got, want, same, after)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// owner returns the member that decides key, as the first running node
// of tc sees it.
func owner(tc *nodetest.Cluster, key string) string {
	name, _ := tc.Running()[0].Server().Router().Owner(key)
	return name
}

// forwarded returns how many checks the running nodes of tc forwarded.
func forwarded(tc *nodetest.Cluster) float64 {
	total := 0.0
	for _, n := range tc.Running() {
		total += n.Forwarded()
	}
	return total
}

// TestRoutingChecksReachOwners: through a client given every node's
// address, each check goes straight to the node that decides its key: no
// node forwards anything, every decision says it was made by the node
// called (SourceOwner) and names the key's owner, for single checks and
// batches alike. The same checks through one node's address are
// forwarded two times out of three, which the nodes count: the counter
// the first half reads is the one that would show a miss.
func TestRoutingChecksReachOwners(t *testing.T) {
	t.Parallel() // each on a cluster of its own, waiting more than computing
	tc := nodetest.StartCluster(t, 3, nil)
	c := routingClient(t, tc, nil)
	ctx := context.Background()
	keys := make([]string, 300)
	batch := make([]client.Check, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("route:%d", i)
		batch[i] = client.Check{Key: keys[i], Limit: 10, Window: time.Minute}
	}

	before := forwarded(tc)
	for _, ch := range batch {
		d, err := c.Check(ctx, ch)
		if err != nil {
			t.Fatalf("Check(%q): %v", ch.Key, err)
		}
		if want := owner(tc, ch.Key); d.Source != client.SourceOwner || d.Node != want || !d.Allowed {
			t.Fatalf("Check(%q) = %+v; want allowed by %s, SourceOwner", ch.Key, d, want)
		}
	}
	ds, err := c.CheckEach(ctx, batch)
	if err != nil {
		t.Fatalf("CheckEach: %v", err)
	}
	for i, d := range ds {
		if want := owner(tc, keys[i]); d.Source != client.SourceOwner || d.Node != want || d.Remaining != 8 {
			t.Fatalf("CheckEach: decision %d (%q) = %+v; want remaining 8 from %s, SourceOwner", i, keys[i], d, want)
		}
	}
	if got := forwarded(tc) - before; got != 0 {
		t.Errorf("the nodes forwarded %v checks sent through a routing client; want 0", got)
	}
	if s := c.Stats(); s.Forwarded != 0 || s.Routed != uint64(2*len(keys)) {
		t.Errorf("Stats: routed %d, forwarded %d; want %d routed, none forwarded", s.Routed, s.Forwarded, 2*len(keys))
	}

	// The control: one node's address, no routing.
	one := newClient(t, tc.Nodes[0].Addr, nil)
	before = forwarded(tc)
	ds, err = one.CheckEach(ctx, batch)
	if err != nil {
		t.Fatalf("CheckEach through %s: %v", tc.Nodes[0].Addr, err)
	}
	fw := 0
	for i, d := range ds {
		if d.Source == client.SourceForwarded {
			fw++
		}
		if d.Node != owner(tc, keys[i]) || d.Remaining != 7 {
			t.Fatalf("CheckEach through one node: decision %d (%q) = %+v; want remaining 7 from %s", i, keys[i], d, owner(tc, keys[i]))
		}
	}
	got := forwarded(tc) - before
	if got < float64(len(keys))/2 || int(got) != fw {
		t.Errorf("through one node: the nodes forwarded %v checks, the decisions say %d; want the same, about %d", got, fw, 2*len(keys)/3)
	}
	if s := one.Stats(); s.Routed != 0 || s.Forwarded != uint64(fw) {
		t.Errorf("Stats of the client of one node: routed %d, forwarded %d; want 0 and %d", s.Routed, s.Forwarded, fw)
	}
}

// TestRoutingSplitsBatchInOrder: a batch whose keys belong to every
// member goes out as one call per member, and its decisions come back in
// the order of the checks: each decision carries the limit of its own
// check, and a key checked twice in the batch sees its first hit in the
// second check.
func TestRoutingSplitsBatchInOrder(t *testing.T) {
	t.Parallel() // each on a cluster of its own, waiting more than computing
	tc := nodetest.StartCluster(t, 3, nil)
	c := routingClient(t, tc, nil)
	// Four keys of each member, interleaved: a, b, c, a, b, c, ...
	byOwner := map[string][]string{}
	var members []string
	for i := 0; len(members) < 3 || len(byOwner[members[0]]) < 4 || len(byOwner[members[1]]) < 4 || len(byOwner[members[2]]) < 4; i++ {
		k := fmt.Sprintf("split:%d", i)
		o := owner(tc, k)
		if _, ok := byOwner[o]; !ok {
			members = append(members, o)
		}
		byOwner[o] = append(byOwner[o], k)
	}
	var checks []client.Check
	for j := range 4 {
		for _, m := range members {
			checks = append(checks, client.Check{Key: byOwner[m][j], Limit: int64(100 + len(checks)), Window: time.Minute})
		}
	}
	// The first key once more, with a limit of 1 it already used up
	// above (its first check recorded one hit, under a limit of 100:
	// limit 1 now applies from this check on).
	checks = append(checks, client.Check{Key: checks[0].Key, Limit: 1, Window: time.Minute})

	calls := c.Stats().Calls
	ds, err := c.CheckEach(context.Background(), checks)
	if err != nil {
		t.Fatalf("CheckEach: %v", err)
	}
	if got := c.Stats().Calls - calls; got != 3 {
		t.Errorf("CheckEach of keys of 3 members made %d calls; want 3", got)
	}
	for i, d := range ds {
		ch := checks[i]
		want := client.Decision{Allowed: true, Limit: ch.Limit, Remaining: ch.Limit - 1, Node: owner(tc, ch.Key), Source: client.SourceOwner}
		if i == len(checks)-1 {
			want.Allowed, want.Remaining = false, 0
		}
		got := d
		got.RetryAfter, got.ResetAfter = 0, 0
		if got != want {
			t.Errorf("decision %d (%q, limit %d) = %+v; want %+v", i, ch.Key, ch.Limit, got, want)
		}
	}
}

// checkRound checks n fresh keys prefix0..prefix<n-1>, each twice with a
// limit of 1: every first check must be allowed and every second denied,
// both by the key's owner, whatever node the client sent them to. It
// returns how many of the decisions said they were forwarded. A key on
// which Sluice did not decide (the cluster refused for a moment: no Raft
// leader on a loaded machine, say) is left out, and logged; more than
// half of them left out fails the test.
func checkRound(t *testing.T, tc *nodetest.Cluster, c *client.Client, prefix string, n int) int {
	t.Helper()
	ctx := context.Background()
	fw, skipped := 0, 0
keys:
	for i := range n {
		ch := client.Check{Key: fmt.Sprintf("%s%d", prefix, i), Limit: 1, Window: time.Hour}
		for j, allowed := range []bool{true, false} {
			d, err := c.Check(ctx, ch)
			if d.Source == client.SourceFailure {
				t.Logf("Check(%q) #%d not decided, key left out: %v", ch.Key, j+1, err)
				skipped++
				continue keys
			}
			if want := owner(tc, ch.Key); d.Allowed != allowed || d.Node != want || d.Source != client.SourceOwner && d.Source != client.SourceForwarded {
				t.Fatalf("Check(%q) #%d = %+v; want allowed %v by %s", ch.Key, j+1, d, allowed, want)
			}
			if d.Source == client.SourceForwarded {
				fw++
			}
		}
	}
	if skipped > n/2 {
		t.Fatalf("%d keys of %d not decided", skipped, n)
	}
	return fw
}

// waitNoForwards checks rounds of fresh keys until one is decided without
// a forward, and fails after 10 s.
func waitNoForwards(t *testing.T, tc *nodetest.Cluster, c *client.Client, prefix string) {
	t.Helper()
	round := 0
	err := testkit.Wait(10*time.Second, func() error {
		before := forwarded(tc)
		fw := checkRound(t, tc, c, fmt.Sprintf("%s%d:", prefix, round), 30)
		round++
		if fw == 0 && forwarded(tc) == before {
			return nil
		}
		return fmt.Errorf("round %d: %d checks still forwarded", round-1, fw)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRoutingStaleView: the membership changes after the client took its
// view; every check is still decided exactly (a limit of 1 allows one hit)
// by its key's owner, whether the client sends it there or to a node that
// forwards it. The answers carry the new version, so the client refreshes
// its view without waiting for its periodic refresh (an hour here), and
// then the checks reach their owners again.
//
//   - A member joins: the keys it took are sent to their old owner, which
//     forwards them.
//   - A member leaves (a graceful stop): its keys are sent to it while it
//     still serves (it forwards them), and once it stopped, through the
//     address given (the connection to it is not ready, or it cannot be
//     dialed and nothing was sent).
func TestRoutingStaleView(t *testing.T) {
	t.Parallel() // each on a cluster of its own, waiting more than computing
	for _, tt := range []struct {
		name   string
		change func(*nodetest.Cluster)
	}{
		{"member added", func(tc *nodetest.Cluster) { tc.Add() }},
		{"member removed", func(tc *nodetest.Cluster) { tc.Nodes[2].Stop() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := nodetest.StartCluster(t, 3, nil)
			c := routingClient(t, tc, nil)
			v0 := c.Stats().RoutesVersion

			tt.change(tc)
			tc.WaitReady()
			fw := checkRound(t, tc, c, "stale:", 60)
			t.Logf("%d of 120 checks forwarded after the change", fw)
			waitView(t, tc, c, v0)
			waitNoForwards(t, tc, c, "stale-after:")
		})
	}
}

// TestRoutingExactWhileMembersChange: never more than a key's limit
// allowed in its window, while a member joins under load from a routing
// client whose view goes stale: 8 goroutines hit 16 keys limited to 20
// an hour, from before the join until the client's view has caught up
// with it; the decisions Sluice made allow exactly 20 per key (the
// client's failure policy, which Sluice did not decide, is not counted).
// The keys the new member takes must arrive there at their limit.
func TestRoutingExactWhileMembersChange(t *testing.T) {
	t.Parallel() // each on a cluster of its own, waiting more than computing
	tc := nodetest.StartCluster(t, 3, nil)
	// Without the denial cache, every check asks Sluice.
	c := routingClient(t, tc, func(cfg *client.Config) { cfg.CacheSize = -1 })
	v0 := c.Stats().RoutesVersion
	const keys, limit, workers = 16, 20, 8
	var mu sync.Mutex
	allowed := make(map[string]int)
	decided := make(map[string]int)
	var failures []string
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("exact:%d", (w+i)%keys)
				d, err := c.Check(context.Background(), client.Check{Key: key, Limit: limit, Window: time.Hour})
				mu.Lock()
				if d.Source == client.SourceFailure {
					if len(failures) < 3 {
						failures = append(failures, err.Error())
					}
				} else {
					decided[key]++
					if d.Allowed {
						allowed[key]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	tc.Add()
	tc.WaitReady()
	waitView(t, tc, c, v0)
	// Then until every key was decided past its limit (on a loaded
	// machine the join may be over after a few checks), or a deadline.
	err := testkit.Wait(30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for k := range keys {
			if key := fmt.Sprintf("exact:%d", k); decided[key] <= limit {
				return fmt.Errorf("key %q decided %d times, not past its limit %d", key, decided[key], limit)
			}
		}
		return nil
	})
	if err != nil { // the checks below judge what was decided
		t.Logf("%v", err)
	}
	close(stop)
	wg.Wait()
	for k := range keys {
		key := fmt.Sprintf("exact:%d", k)
		if allowed[key] > limit || allowed[key] < limit && len(failures) == 0 {
			t.Errorf("key %q: %d allowed of %d decided; want %d", key, allowed[key], decided[key], limit)
		}
	}
	t.Logf("stats: %+v; failures (first 3): %q", c.Stats(), failures)
}
