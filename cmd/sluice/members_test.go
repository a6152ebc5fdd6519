package main

import (
	"bytes"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster/clustertest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestMembersSingleNode: a node outside a cluster lists itself, alive,
// owning every key; the admin token is required when set.
func TestMembersSingleNode(t *testing.T) {
	t.Parallel()
	n := startNode(t, env{"SLUICE_ADMIN_TOKEN": "s3cret"}, "--node-name", "node-a")
	args := []string{"members", "--addr", n.grpcAddr, "--admin-token", "s3cret"}

	r := mustRun(t, exitOK, nil, args...)
	wantLines(t, r.stdout,
		"NAME    STATE  EPOCH  ROLE  COPIES  GRPC"+strings.Repeat(" ", len(n.grpcAddr)-2)+"GOSSIP  SHARE",
		"node-a  alive  0      -     -       "+n.grpcAddr+"  -       100.0%")
	if !strings.Contains(r.stderr, "as seen by node-a, which is not in a cluster") {
		t.Errorf("members: stderr %q; want the answering node, not in a cluster", r.stderr)
	}

	r = mustRun(t, exitOK, nil, append(args, "-o", "json")...)
	var got sluicepb.ListMembersResponse
	decodeJSON(t, r.stdout, &got)
	if len(got.Members) != 1 || got.Members[0].Name != "node-a" || got.Members[0].Share != 1 || got.Node != "node-a" {
		t.Errorf("members -o json = %v; want node-a alone with share 1", &got)
	}
	for _, field := range []string{`"gossip_addr": ""`, `"map_version": "0"`, `"share": 1`} {
		if !strings.Contains(r.stdout, field) {
			t.Errorf("members -o json printed\n%s\nwant the field %s (proto names, unpopulated fields too)", r.stdout, field)
		}
	}

	r = mustRun(t, exitError, nil, "members", "--addr", n.grpcAddr)
	if !strings.Contains(r.stderr, "Unauthenticated") {
		t.Errorf("members without the admin token: stderr %q; want Unauthenticated", r.stderr)
	}
	r = mustRun(t, exitError, nil, "members", "--addr", n.grpcAddr, "extra")
	if !strings.Contains(r.stderr, "unknown command") && !strings.Contains(r.stderr, "accepts 0 arg") {
		t.Errorf("members with an argument: stderr %q; want it refused", r.stderr)
	}
}

// TestMembersCluster: three nodes started with the serve flags of a
// cluster (--gossip-addr, --join) list one another, alive, with their
// addresses and about a third of the keys each, whichever is asked.
func TestMembersCluster(t *testing.T) {
	t.Parallel()
	oneClusterAtATime(t)
	// Registered first, so it runs after the nodes have stopped.
	t.Cleanup(func() { waitMemberlistGone(t) })
	nodes, gossip := startCluster(t, 3)
	for _, n := range nodes {
		n.waitReadyz()
	}
	for i, n := range nodes {
		var rows []map[string]string
		if err := testkit.Wait(20*time.Second, func() error {
			r := mustRun(t, exitOK, nil, "members", "--addr", n.grpcAddr)
			if rows = tableRows(t, r.stdout); len(rows) != 3 {
				return fmt.Errorf("members via node-%d printed\n%s\nwant 3 members", i, r.stdout)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for j, row := range rows {
			share, err := strconv.ParseFloat(strings.TrimSuffix(row["SHARE"], "%"), 64)
			if row["NAME"] != "node-"+strconv.Itoa(j) || row["STATE"] != "alive" ||
				row["GRPC"] != nodes[j].grpcAddr || row["GOSSIP"] != gossip[j] ||
				err != nil || math.Abs(share-100.0/3) > 3 {
				t.Errorf("members via node-%d: row %d = %v; want node-%d alive at gRPC %s, gossip %s, about 33.3%%",
					i, j, row, j, nodes[j].grpcAddr, gossip[j])
			}
		}
	}
	// A live member cannot be forgotten (api's TestClusterForgetMember
	// forgets one that is down). It is one that does not lead: the leader
	// is refused for that first.
	live := "node-1"
	if r := mustRun(t, exitOK, nil, "members", "--addr", nodes[0].grpcAddr); strings.Contains(r.stderr, "leader node-1\n") {
		live = "node-2"
	}
	r := mustRun(t, exitError, nil, "members", "forget", live, "--addr", nodes[0].grpcAddr)
	if !strings.Contains(r.stderr, "FailedPrecondition") || !strings.Contains(r.stderr, "stop it") {
		t.Errorf("members forget of live %s: stderr %q; want FailedPrecondition, saying to stop it first", live, r.stderr)
	}
}

// clusterTests serialises the tests that run a cluster in this process:
// each waits, once its nodes stopped, until no memberlist goroutine is left,
// which another cluster running meanwhile would prevent.
var clusterTests sync.Mutex

// oneClusterAtATime holds clusterTests until the end of the test, after
// its other cleanups: call it before registering them.
func oneClusterAtATime(t *testing.T) {
	clusterTests.Lock()
	t.Cleanup(clusterTests.Unlock)
}

// waitMemberlistGone waits until no memberlist goroutine is left, so that
// TestMain's leak check does not trip on them: memberlist's Shutdown does
// not wait for a probe in flight, which ends within a probe interval.
func waitMemberlistGone(t *testing.T) {
	buf := make([]byte, 1<<20)
	if err := testkit.Wait(10*time.Second, func() error {
		if n := runtime.Stack(buf, true); bytes.Contains(buf[:n], []byte("github.com/hashicorp/memberlist.")) {
			return fmt.Errorf("memberlist goroutines still running after the nodes stopped:\n%s", buf[:n])
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// startCluster starts n nodes of one cluster, node-0 to node-<n-1>, joined
// through node-0's gossip address, and returns them with their gossip
// addresses. They stop in reverse order at the test's end; node-0, the
// last, has no quorum left to end its epoch with and would try for the
// whole default --shutdown-timeout (10 s): it is given one second.
func startCluster(t *testing.T, n int) ([]*cliNode, []string) {
	gossip := make([]string, n)
	for i := range gossip {
		gossip[i] = gossipAddr(t)
	}
	nodes := make([]*cliNode, n)
	for i := range nodes {
		args := []string{"--node-name", "node-" + strconv.Itoa(i),
			"--gossip-addr", gossip[i], "--join", gossip[0], "--expect", strconv.Itoa(n)}
		if i == 0 {
			args = append(args, "--shutdown-timeout", "1s")
		}
		nodes[i] = startNode(t, nil, args...)
	}
	return nodes, gossip
}

// gossipAddr returns a 127.0.0.1 address for a node's gossip, whose port was
// free for both TCP and UDP.
func gossipAddr(t *testing.T) string {
	return "127.0.0.1:" + strconv.Itoa(clustertest.FreePort(t))
}
