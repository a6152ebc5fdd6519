package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// topSection returns the table of out that follows the line starting with
// title, up to the next blank line.
func topSection(t *testing.T, out, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(out, "\n"+title)
	if !ok {
		t.Fatalf("output lacks %q:\n%s", title, out)
	}
	_, rest, _ = strings.Cut(rest, "\n") // the title's line
	table, _, _ := strings.Cut(rest, "\n\n")
	return table
}

// sendChecks sends n cost-1 checks of key against limit per minute to the
// node at addr. A check refused as UNAVAILABLE (a cluster node without its
// lease for a moment, on a loaded machine) decided nothing: it is sent
// again, for up to 30 s.
func sendChecks(t *testing.T, addr, key string, limit int64, n int) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := sluicepb.NewRateLimitServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for range n {
		// A check refused as UNAVAILABLE (no lease yet) is sent again.
		if err := testkit.Wait(time.Until(deadline), func() error {
			req := &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{Key: []byte(key), Limit: limit, Window: durationpb.New(time.Minute)}}}
			_, err := c.Check(t.Context(), req)
			if err != nil && status.Code(err) != codes.Unavailable {
				t.Fatalf("Check(%s) = %v", key, err)
			}
			return err
		}); err != nil {
			t.Fatalf("Check(%s) = %v", key, err)
		}
	}
}

// TestTopSingleNode: sluice top shows the node, its rates and the keys
// decided and denied most, with the admin token; once with -n 1, as JSON
// with -o json, and frame after frame with -n 2.
func TestTopSingleNode(t *testing.T) {
	t.Parallel()
	n := startNode(t, env{"SLUICE_ADMIN_TOKEN": "s3cret"}, "--node-name", "node-a")
	sendChecks(t, n.grpcAddr, "tenant:hot", 5, 12) // 7 denied
	sendChecks(t, n.grpcAddr, "tenant:cold", 5, 2)
	args := []string{"top", "--addr", n.grpcAddr, "--admin-token", "s3cret", "-n", "1"}

	r := mustRun(t, exitOK, nil, args...)
	if !strings.HasPrefix(r.stdout, "sluice top: via node-a at "+n.grpcAddr+", view epoch 0") ||
		!strings.Contains(r.stdout, "1 live of 1 members") {
		t.Errorf("top: header of\n%s\nwant the answering node, its address and epoch, 1 live member", r.stdout)
	}
	members := tableRows(t, strings.Join(strings.Split(r.stdout, "\n")[3:5], "\n"))
	if m := members[0]; m["NODE"] != "node-a" || m["STATE"] != "alive" || m["SHARE"] != "100.0%" || m["P50"] == "-" || m["MAX"] == "-" {
		t.Errorf("top: member row %v; want node-a alive with 100.0%% of the keys and its latencies", m)
	}
	decisions := tableRows(t, topSection(t, r.stdout, "TOP KEYS BY DECISIONS"))
	if len(decisions) != 2 || decisions[0]["KEY"] != "tenant:hot" || decisions[0]["DECISIONS"] != "12" || decisions[0]["±"] != "0" ||
		decisions[0]["OWNER"] != "node-a" || decisions[1]["KEY"] != "tenant:cold" || decisions[1]["DECISIONS"] != "2" {
		t.Errorf("top: decisions %v; want tenant:hot 12 ± 0 on node-a, then tenant:cold 2", decisions)
	}
	denials := tableRows(t, topSection(t, r.stdout, "TOP KEYS BY DENIALS"))
	if len(denials) != 1 || denials[0]["KEY"] != "tenant:hot" || denials[0]["DENIALS"] != "7" || denials[0]["SHARE"] != "100.0%" {
		t.Errorf("top: denials %v; want tenant:hot 7, all of them", denials)
	}

	r = mustRun(t, exitOK, nil, append(args, "-o", "json", "--top", "1")...)
	var tr sluicepb.GetTrafficResponse
	decodeJSON(t, r.stdout, &tr)
	if len(tr.Nodes) != 1 || tr.Node != "node-a" || len(tr.TopDecisions.GetKeys()) != 1 || tr.TopDecisions.Keys[0].Count != 12 || tr.TopDecisions.Floor != 2 {
		t.Errorf("top -o json --top 1 = %v; want node-a, tenant:hot 12, floor 2", &tr)
	}

	start := time.Now()
	r = mustRun(t, exitOK, nil, "top", "--addr", n.grpcAddr, "--admin-token", "s3cret", "-n", "2", "--interval", "100ms")
	if got := strings.Count(r.stdout, "sluice top: via node-a"); got != 2 || time.Since(start) < 100*time.Millisecond {
		t.Errorf("top -n 2 --interval 100ms printed %d frames in %v; want 2, 100ms apart:\n%s", got, time.Since(start), r.stdout)
	}

	r = mustRun(t, exitError, nil, "top", "--addr", n.grpcAddr, "-n", "1")
	if !strings.Contains(r.stderr, "Unauthenticated") {
		t.Errorf("top without the admin token: stderr %q; want Unauthenticated", r.stderr)
	}
	for _, bad := range [][]string{{"--interval", "1ms"}, {"--top", "0"}} {
		r = mustRun(t, exitError, nil, append([]string{"top", "--addr", n.grpcAddr, "-n", "1"}, bad...)...)
		if !strings.Contains(r.stderr, bad[0]) {
			t.Errorf("top %v: stderr %q; want it to name %s", bad, r.stderr, bad[0])
		}
	}
}

// TestTopCluster: through any node of a three-node cluster, sluice top
// lists every member with its figures and the keys checked through all of
// them, counted once per check, with their owner.
func TestTopCluster(t *testing.T) {
	t.Parallel()
	oneClusterAtATime(t)
	t.Cleanup(func() { waitMemberlistGone(t) })
	nodes, _ := startCluster(t, 3)
	// Each node decides once it holds a lease: until then checks fail.
	deadline := time.Now().Add(30 * time.Second)
	for i, n := range nodes {
		if err := testkit.Wait(time.Until(deadline), func() error {
			if r := runCLI(t, nil, "check", "probe-"+strconv.Itoa(i), "--addr", n.grpcAddr, "--limit", "100", "--window", "1m"); r.code != exitOK {
				return fmt.Errorf("node-%d decides nothing: %v", i, r)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// A node decides while another is still joining: wait until every
	// node lists all three alive, as the header below asserts.
	for _, n := range nodes {
		waitMembers(t, n.grpcAddr, 3)
	}
	for i, n := range nodes {
		sendChecks(t, n.grpcAddr, "shared", 100, 5*(i+1)) // 30 in all
	}
	for i, n := range nodes {
		r := mustRun(t, exitOK, nil, "top", "--addr", n.grpcAddr, "-n", "1", "--top", "1")
		if !strings.HasPrefix(r.stdout, "sluice top: via node-"+strconv.Itoa(i)) || !strings.Contains(r.stdout, "3 live of 3 members") {
			t.Errorf("top via node-%d: header of\n%s\nwant node-%d answering, 3 live members", i, r.stdout, i)
		}
		members := tableRows(t, strings.Join(strings.Split(r.stdout, "\n")[3:6], "\n"))
		for j, m := range members {
			if m["NODE"] != "node-"+strconv.Itoa(j) || m["STATE"] != "alive" || m["UPTIME"] == "-" || m["P50"] == "-" {
				t.Errorf("top via node-%d: member %d = %v; want node-%d alive with its figures", i, j, m, j)
			}
		}
		top := tableRows(t, topSection(t, r.stdout, "TOP KEYS BY DECISIONS"))
		if k := top[0]; k["KEY"] != "shared" || k["DECISIONS"] != "30" || k["OWNER"] == "-" {
			t.Errorf("top via node-%d: top key %v; want shared with all 30 decisions and its owner", i, k)
		}
	}
}
