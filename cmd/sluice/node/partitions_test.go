package node

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster/control"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// partitionCluster starts three nodes with partitions and standbys and
// waits until the map has its partitions, each led.
func partitionCluster(t *testing.T, parts int) *testCluster {
	t.Helper()
	return partitionClusterWith(t, parts, 2, 0)
}

// partitionClusterWith is partitionCluster with replicas and min-insync.
func partitionClusterWith(t *testing.T, parts, replicas, minInsync int) *testCluster {
	t.Helper()
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.Router.Replicas = replicas
		c.Router.ReplicaTimeout = 2 * time.Second
		c.Control.Settings.Partitions = parts
		c.Control.Settings.MinInsync = minInsync
	})
	// Ready means assigned: a node whose map has no partitions yet says
	// it is not ready (every call would be refused).
	for _, ts := range tc.nodes {
		if m := ts.srv.Router().Map(); len(m.Partitions) != parts {
			t.Fatalf("%s is ready with %d partitions in its map; want %d", ts.srv.Config().NodeName, len(m.Partitions), parts)
		}
	}
	tc.waitPartitions(func(m *control.Map) error { return nil })
	return tc
}

// waitPartitions waits until every running node's map has its partitions,
// each led, and ok accepts the first node's.
func (tc *testCluster) waitPartitions(ok func(*control.Map) error) {
	tc.t.Helper()
	if err := testkit.Wait(30*time.Second, func() error {
		for _, ts := range tc.nodes {
			if ts.srv == nil {
				continue
			}
			m := ts.srv.Router().Map()
			if m == nil || len(m.Partitions) == 0 {
				return fmt.Errorf("%s: no partitions yet", ts.srv.Config().NodeName)
			}
			for p, rec := range m.Partitions {
				if rec.Leader == "" {
					return fmt.Errorf("%s: partition %d has no leader", ts.srv.Config().NodeName, p)
				}
			}
		}
		for _, ts := range tc.nodes {
			if ts.srv != nil {
				return ok(ts.srv.Router().Map())
			}
		}
		return nil
	}); err != nil {
		tc.t.Fatal(err)
	}
}

// ledger counts what the callers were told, per key.
type ledger struct {
	mu      sync.Mutex
	allowed map[string]int
	errs    atomic.Int64
	calls   atomic.Int64
	first   []string // the first errors' texts
}

func (l *ledger) hit(tc *testCluster, node int, key string, limit int64) (*sluicepb.Decision, error) {
	ts := tc.nodes[node]
	if ts.srv == nil {
		return nil, fmt.Errorf("node %d is down", node)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.calls.Add(1)
	resp, err := tc.client(node).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, limit, time.Hour, 1)}})
	if err != nil {
		if l.errs.Add(1) <= 5 {
			l.mu.Lock()
			l.first = append(l.first, fmt.Sprintf("node %d, %s: %v", node, key, err))
			l.mu.Unlock()
		}
		return nil, err
	}
	d := resp.Decisions[0]
	if d.Allowed {
		l.mu.Lock()
		l.allowed[key]++
		l.mu.Unlock()
	}
	return d, nil
}

// TestPartitionsGracefulRestart: a node of three restarts gracefully while
// two others hit keys one hit from their limit. The partitions it led move
// to their in-sync replicas without a refused call; no key allows more
// than its limit, whichever node decides it; the node comes back out of
// sync, is brought up to date, admitted, and leads its preferred
// partitions again.
func TestPartitionsGracefulRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a node")
	}
	tc := partitionCluster(t, 16)
	const keys, limit = 64, 5
	l := &ledger{allowed: make(map[string]int)}
	key := func(k int) string { return fmt.Sprintf("p%d", k) }
	for k := range keys {
		for range limit - 1 {
			if d, err := l.hit(tc, 0, key(k), limit); err != nil || !d.Allowed {
				t.Fatalf("fill %s: %v, %v", key(k), d, err)
			}
		}
	}
	if l.errs.Load() != 0 {
		t.Fatalf("%d errors while filling", l.errs.Load())
	}
	// Node 2 stops while nodes 0 and 1 race for each key's last hit.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, node := range []int{0, 1} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				default:
				}
				for k := range keys {
					l.hit(tc, node, key(k), limit)
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond) // the racers are under way (not a window: the clock is fake)
	tc.nodes[2].stop()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d of %d calls failed while node-2 stopped gracefully; want none; the first: %q", n, l.calls.Load(), l.first)
	}
	for k := range keys {
		if got := l.allowed[key(k)]; got != limit {
			t.Errorf("%s: %d allowed; want exactly its limit %d", key(k), got, limit)
		}
	}

	// Back: out of sync, caught up, admitted, preferred again.
	tc.nodes[2].start()
	tc.waitMembers(3)
	tc.waitReady()
	id2 := tc.nodes[2].srv.Router().Map()
	x, _ := id2.Member("node-2")
	tc.waitPartitions(func(m *control.Map) error {
		for p, rec := range m.Partitions {
			if rec.Replicas[0] == x.ID && rec.Leader != x.ID {
				return fmt.Errorf("partition %d prefers node-2 and is led by %s", p, rec.Leader)
			}
			if !rec.InSync(x.ID) && (rec.Replicas[0] == x.ID || rec.Replicas[1] == x.ID) {
				return fmt.Errorf("partition %d: node-2 not in sync", p)
			}
		}
		return nil
	})
	before := l.errs.Load()
	for k := range keys {
		for node := range 3 {
			d, err := l.hit(tc, node, key(k), limit)
			if err != nil || d.Allowed {
				t.Fatalf("%s via node %d after node-2 came back: %v, %v; want denied", key(k), node, d, err)
			}
		}
	}
	if l.errs.Load() != before {
		t.Fatalf("calls failed after node-2 came back")
	}
}

// TestPartitionsCrash: a node of three is killed; the partitions it led go
// on from their in-sync replicas once its lease is over, with every
// acknowledged hit.
func TestPartitionsCrash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for failure detection")
	}
	tc := partitionCluster(t, 16)
	const keys, limit = 64, 3
	l := &ledger{allowed: make(map[string]int)}
	key := func(k int) string { return fmt.Sprintf("c%d", k) }
	for k := range keys {
		for range limit {
			if d, err := l.hit(tc, 0, key(k), limit); err != nil || !d.Allowed {
				t.Fatalf("fill %s: %v, %v", key(k), d, err)
			}
		}
	}
	tc.nodes[2].crash()
	start := time.Now()
	for k := range keys {
		var d *sluicepb.Decision
		if err := testkit.Wait(20*time.Second, func() (err error) {
			d, err = l.hit(tc, 1, key(k), limit)
			return err
		}); err != nil {
			t.Fatalf("%s still refused %v after node-2 crashed: %v", key(k), time.Since(start).Round(time.Millisecond), err)
		}
		if d.Allowed {
			t.Fatalf("%s after node-2 crashed: allowed; want denied (its %d hits kept)", key(k), limit)
		}
	}
	t.Logf("every key decided again %v after the crash", time.Since(start).Round(time.Millisecond))
}

// TestPartitionsLeaderMovesBackAndForth: node-2's partitions go to node-0
// or node-1 and back twice, with hits recorded by every leader in turn.
// A leader that took a partition back without dropping what its actors
// held of its keys since it last led it would decide from those older
// states and allow more than the limit.
func TestPartitionsLeaderMovesBackAndForth(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a node twice")
	}
	tc := partitionCluster(t, 8)
	const keys, limit = 32, 9
	l := &ledger{allowed: make(map[string]int)}
	key := func(k int) string { return fmt.Sprintf("b%d", k) }
	hits := func(node, n int) {
		t.Helper()
		for k := range keys {
			for range n {
				if _, err := l.hit(tc, node, key(k), limit); err != nil {
					t.Fatalf("hit %s via node %d: %v", key(k), node, err)
				}
			}
		}
	}
	backHome := func() {
		t.Helper()
		tc.waitMembers(3)
		tc.waitReady()
		x, _ := tc.nodes[0].srv.Router().Map().Member("node-2")
		tc.waitPartitions(func(m *control.Map) error {
			for p, rec := range m.Partitions {
				if rec.Replicas[0] == x.ID && rec.Leader != x.ID {
					return fmt.Errorf("partition %d prefers node-2 and is led by %s", p, rec.Leader)
				}
			}
			return nil
		})
	}
	hits(0, 2) // every leader, node-2 included
	for range 2 {
		tc.nodes[2].stop()
		hits(0, 2) // node-0 and node-1 lead node-2's partitions: their actors load the keys
		tc.nodes[2].start()
		backHome()
		hits(1, 2) // node-2 leads its partitions again and records hits on their keys
	}
	tc.nodes[2].stop()
	hits(0, 3) // node-0 and node-1 again: from the store, not from what they held
	for k := range keys {
		if got := l.allowed[key(k)]; got != limit {
			t.Errorf("%s: %d allowed of %d hits; want exactly its limit %d", key(k), got, 2+4*2+3, limit)
		}
	}
}

// TestPartitionsMinInsync: with --min-insync 3 of 3 replicas, a partition
// whose in-sync set lost a member decides nothing, with a reason that
// names the setting, and decides again once the member is back in sync.
func TestPartitionsMinInsync(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("restarts a node")
	}
	tc := partitionClusterWith(t, 4, 3, 3)
	l := &ledger{allowed: make(map[string]int)}
	if d, err := l.hit(tc, 0, "m", 5); err != nil || !d.Allowed {
		t.Fatalf("first hit: %v, %v", d, err)
	}
	tc.nodes[2].stop()
	if err := testkit.Wait(10*time.Second, func() error {
		_, err := l.hit(tc, 0, "m", 5)
		if err == nil || !strings.Contains(err.Error(), "min-insync") {
			return fmt.Errorf("hit with one replica of three stopped: %v; want refused for --min-insync", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The metrics say so: node-0 and node-1 lead the four partitions, each
	// under-replicated.
	if err := testkit.Wait(10*time.Second, func() error {
		led, under := 0.0, 0.0
		for _, ts := range tc.nodes[:2] {
			_, body := httpGet(t, "http://"+ts.srv.HTTPAddr()+"/metrics")
			led += metricValue(body, "sluice_partitions_led")
			under += metricValue(body, "sluice_partitions_under_replicated")
		}
		if led != 4 || under != 4 {
			return fmt.Errorf("node-0 and node-1 lead %v partitions, %v under-replicated; want 4 and 4", led, under)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tc.nodes[2].start()
	tc.waitMembers(3)
	tc.waitReady()
	if err := testkit.Wait(20*time.Second, func() error {
		d, err := l.hit(tc, 0, "m", 5)
		if err != nil {
			return err
		}
		if !d.Allowed {
			return fmt.Errorf("denied: %v", d)
		}
		return nil
	}); err != nil {
		t.Fatalf("after the replica came back: %v", err)
	}
}

// metricValue returns the value of the unlabelled metric name in a
// Prometheus text body, 0 if absent.
func metricValue(body, name string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}
