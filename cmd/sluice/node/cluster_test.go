package node

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/clustertest"
	"github.com/sluice-io/sluice/cluster/control"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
	"github.com/sluice-io/sluice/shard"
)

// testCluster is n nodes in this process sharing one fake clock, joined
// through the first one's gossip address.
type testCluster struct {
	t      *testing.T
	clk    *clock.Fake
	nodes  []*testServer
	seed   string
	expect int
	edit   func(*Config)
}

func newTestCluster(t *testing.T, n int) *testCluster { return newTestClusterWith(t, n, nil) }

// newTestClusterWith is newTestCluster with edit applied to every node's
// config.
func newTestClusterWith(t *testing.T, n int, edit func(*Config)) *testCluster {
	tc := &testCluster{t: t, clk: clock.NewFake(epoch), expect: n, edit: edit}
	for i := 0; i < n; i++ {
		tc.add()
	}
	tc.waitMembers(n)
	tc.waitReady()
	t.Cleanup(tc.stop)
	return tc
}

// stop stops the nodes still running, the last started first, as the
// nodes' own cleanups would. The last one has no quorum left to end its
// epoch with, and would try for its whole ShutdownTimeout: it is given a
// second, which a leave through a quorum does not need.
func (tc *testCluster) stop() {
	last := slices.IndexFunc(tc.nodes, func(ts *testServer) bool { return ts.srv != nil })
	for i := len(tc.nodes) - 1; i > last; i-- {
		tc.nodes[i].stop()
	}
	if last >= 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		tc.nodes[last].stopCtx(ctx)
	}
}

// waitReady waits until every running node holds a lease and every key it
// acts for is here.
func (tc *testCluster) waitReady() {
	tc.t.Helper()
	if err := testkit.Wait(20*time.Second, func() error {
		for _, ts := range tc.nodes {
			if ts.srv != nil {
				if w := ts.srv.NotReady(); w != "" {
					return fmt.Errorf("cluster not ready: %s: %s", ts.srv.Config().NodeName, w)
				}
			}
		}
		return nil
	}); err != nil {
		tc.t.Fatal(err)
	}
}

// add starts one more node and joins it to the cluster.
func (tc *testCluster) add() *testServer {
	t := tc.t
	i := len(tc.nodes)
	gossip := "127.0.0.1:" + strconv.Itoa(clustertest.FreePort(t))
	if tc.seed == "" {
		tc.seed = gossip
	}
	ts := newTestServer(t, func(c *Config) {
		c.NodeName = fmt.Sprintf("node-%d", i)
		c.Clock = tc.clk
		cc := cluster.DefaultConfig()
		cc.GossipAddr = gossip
		cc.Join = []string{tc.seed}
		cc.Expect = tc.expect
		c.Cluster = &cc
		c.Router.HandoffWait = 2 * time.Second
		// The cluster tests exercise one copy per key (handoffs, an owner
		// that is down) unless they ask for standbys: sluice serve's
		// default with a data file is 2 (see DefaultReplicas).
		c.Router.Replicas = 1
		// These tests check what is decided and copied, not how fast a
		// standby confirms: on a loaded machine a standby starved of CPU
		// missed the default half second, failing checks the tests
		// expected allowed.
		c.Router.ReplicaTimeout = 10 * time.Second
		// Nor how fast Raft fails over: a leader steps down when it hears
		// from no quorum for half the Raft timeout (default 500 ms), and
		// with several clusters in one process under the race detector a
		// leader starved that long lost its leadership mid-test, failing
		// checks with "no Raft leader is known".
		c.Control.RaftTimeout = 2 * time.Second
		if tc.edit != nil {
			tc.edit(c)
		}
	})
	tc.nodes = append(tc.nodes, ts)
	return ts
}

// waitMembers waits until every running node sees n live members.
func (tc *testCluster) waitMembers(n int) {
	tc.t.Helper()
	testkit.Eventually(tc.t, 20*time.Second, func() bool {
		for _, ts := range tc.nodes {
			if ts.srv != nil && ts.srv.Membership().View().Len() != n {
				return false
			}
		}
		return true
	}, "members to converge to %d", n)
}

func (tc *testCluster) client(i int) sluicepb.RateLimitServiceClient {
	return sluicepb.NewRateLimitServiceClient(tc.nodes[i].conn)
}

// TestClusterExact: one key hit concurrently through every node allows
// exactly its limit, and so does each of 100 keys; every decision names the
// key's owner, whichever node was asked.
func TestClusterExact(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 12; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := tc.client(g % 3)
			for i := 0; i < 25; i++ {
				resp, err := client.Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("hot", 100, time.Minute, 1)}})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.Decisions[0].Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := allowed.Load(); got != 100 {
		t.Fatalf("300 hits through 3 nodes on a limit of 100: %d allowed; want 100", got)
	}

	counts := make([]atomic.Int64, 100)
	owners := make([]atomic.Value, 100)
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := tc.client(g)
			for round := 0; round < 4; round++ {
				req := &sluicepb.CheckRequest{}
				for k := 0; k < 100; k++ {
					req.Checks = append(req.Checks, nativeCheck(fmt.Sprintf("key-%d", k), 10, time.Minute, 1))
				}
				resp, err := client.Check(tc.nodes[0].ctx(), req)
				if err != nil {
					t.Error(err)
					return
				}
				for k, d := range resp.Decisions {
					if d.Allowed {
						counts[k].Add(1)
					}
					if prev := owners[k].Swap(d.Node); prev != nil && prev != d.Node {
						t.Errorf("key-%d decided by %v and %v", k, prev, d.Node)
					}
				}
			}
		}()
	}
	wg.Wait()
	nodes := map[any]int{}
	for k := range counts {
		if got := counts[k].Load(); got != 10 {
			t.Errorf("key-%d: %d allowed of 12 hits; want 10", k, got)
		}
		nodes[owners[k].Load()]++
	}
	if len(nodes) != 3 {
		t.Errorf("100 keys decided by %d nodes; want all 3: %v", len(nodes), nodes)
	}
}

// TestClusterJoinLeaveKeepsState: a fourth node joins, then one node
// leaves gracefully, while callers keep hitting 100 keys in rounds (one
// hit per key a round, through nodes 0 and 2), from two rounds before the
// join to limit+1 rounds after the leave. The fake clock does not move, so
// the whole test is one window, and each key's state moves with its
// ownership: every key allows exactly its limit, whatever node decided it
// when (a state lost in a move allows more, a state counted twice fewer),
// give or take the calls that failed after their hit may have been
// recorded. The changes cost at most one failed call per key.
func TestClusterJoinLeaveKeepsState(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3)
	const keys, limit, workers = 100, 5, 4
	// maxFailed bounds the calls the two changes may fail: a key waits for
	// its state for a moment after a move, and a caller that is refused
	// moves on to its next key.
	const maxFailed = keys
	// Phases of the run, by what the membership is doing.
	const (
		before = iota
		joining
		leaving
		after
		phases
	)
	var (
		phase      atomic.Int64
		sentIn     [phases]atomic.Int64 // calls sent in each phase
		allowed    [keys]atomic.Int64
		answered   [keys]atomic.Int64 // allowed or denied
		refused    atomic.Int64       // UNAVAILABLE, nothing recorded
		ambiguous  [keys]atomic.Int64 // failed, maybe recorded
		rounds     [workers]atomic.Int64
		changed    = make(chan struct{}) // closed once the leave is done
		stopLoad   = make(chan struct{}) // closed if the test gives up
		errMu      sync.Mutex
		firstError = map[string]error{} // by code and reason
	)
	// Callers ask nodes 0 and 2; node 1 leaves, node 3 joins and is reached
	// through forwarding.
	clients := []sluicepb.RateLimitServiceClient{tc.client(0), tc.client(2)}
	var wg sync.WaitGroup
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Worker g hits keys g, g+workers, ... once a round, until
			// limit+1 rounds after the changes (bounded: 400 rounds).
			roundsAfter := -1
			for r := 0; r < 400 && roundsAfter <= limit; r++ {
				select {
				case <-stopLoad:
					return
				case <-changed:
					roundsAfter++
				default:
				}
				for k := g; k < keys; k += workers {
					sentIn[phase.Load()].Add(1)
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					resp, err := clients[(r+k)%2].Check(ctx,
						&sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("k%d", k), limit, time.Hour, 1)}})
					cancel()
					switch reason := errorReason(err); {
					case err == nil:
						answered[k].Add(1)
						if resp.Decisions[0].Allowed {
							allowed[k].Add(1)
						}
					case reason == cluster.ReasonMoving || reason == cluster.ReasonOwnerDown:
						// Refused before anything was recorded. Not
						// NO_QUORUM: a node whose lease ran out while its
						// actors decided answers it with the hits recorded
						// (Router.decideHere).
						refused.Add(1)
					default:
						ambiguous[k].Add(1)
					}
					if err != nil {
						errMu.Lock()
						if what := status.Code(err).String() + " " + errorReason(err); firstError[what] == nil {
							firstError[what] = err
						}
						errMu.Unlock()
					}
				}
				rounds[g].Add(1)
			}
		}()
	}
	defer wg.Wait()
	defer func() {
		select {
		case <-changed:
		default:
			close(stopLoad) // the test failed before the changes were done
		}
	}()
	waitRounds := func(n int64) {
		t.Helper()
		if err := testkit.Wait(30*time.Second, func() error {
			for g := range rounds {
				if got := rounds[g].Load(); got < n {
					return fmt.Errorf("worker %d did %d rounds; want %d", g, got, n)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	roundsNow := func() int64 {
		n := rounds[0].Load()
		for g := range rounds {
			n = min(n, rounds[g].Load())
		}
		return n
	}
	// Two hits on every key, then the join and the leave under load.
	waitRounds(2)
	var at [phases]int64 // rounds every worker had done when the phase began
	at[joining] = roundsNow()
	phase.Store(joining)
	tc.add()
	tc.waitMembers(4)
	tc.waitReady()
	at[leaving] = roundsNow()
	phase.Store(leaving)
	tc.nodes[1].stop()
	tc.waitMembers(3)
	tc.waitReady()
	at[after] = roundsNow()
	phase.Store(after)
	close(changed)
	wg.Wait()

	t.Logf("rounds done when the join began: %d, when the leave began: %d, when it was done: %d; calls sent while joining: %d, while leaving: %d",
		at[joining], at[leaving], at[after], sentIn[joining].Load(), sentIn[leaving].Load())
	for what, err := range firstError {
		t.Logf("first %s: %v", what, err)
	}
	if sentIn[joining].Load() == 0 || sentIn[leaving].Load() == 0 {
		t.Errorf("calls sent while joining: %d, while leaving: %d; want load during both changes", sentIn[joining].Load(), sentIn[leaving].Load())
	}
	failed := refused.Load()
	for k := range keys {
		got, amb, ans := allowed[k].Load(), ambiguous[k].Load(), answered[k].Load()
		failed += amb
		// A failure that may have recorded its hit can take one allowed
		// hit's place; nothing else can.
		if got > limit || got+amb < limit {
			t.Errorf("k%d: %d allowed (%d answered, %d failed that may have recorded); want %d", k, got, ans, amb, limit)
		}
		if ans <= limit {
			t.Errorf("k%d: %d hits answered; want more than its limit %d", k, ans, limit)
		}
	}
	t.Logf("calls failed: %d, of which %d refused before anything was recorded", failed, refused.Load())
	if failed > maxFailed {
		t.Errorf("%d calls failed during the changes (%d refused, the others maybe recorded); want at most %d", failed, refused.Load(), maxFailed)
	}
}

// errorReason returns the reason of the errdetails.ErrorInfo of err's
// status, or "".
func errorReason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

// TestClusterUnreachableOwnerFailsFast: when a key's owner cannot be
// reached, the decision fails with Unavailable within the deadline, naming
// the owner.
func TestClusterUnreachableOwnerFailsFast(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 2)
	// Find a key node 1 owns, then cut node 1's gRPC without leaving.
	view := tc.nodes[0].srv.Membership().View()
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("k%d", i); view.Owner(k).Name == "node-1" {
			key = k
		}
	}
	tc.nodes[1].srv.StopServing()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err := tc.client(0).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 5, time.Minute, 1)}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Check(key of a dead owner) = %v; want Unavailable", err)
	}
	// The status names the owner node-0 could not reach, for the client to
	// say which node is down.
	var info *errdetails.ErrorInfo
	for _, d := range status.Convert(err).Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.Reason != cluster.ReasonOwnerUnreachable || info.Metadata["member"] != "node-1" {
		t.Errorf("Check(key of an unreachable owner): details %v; want an ErrorInfo %s naming member node-1", info, cluster.ReasonOwnerUnreachable)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("failing took %v; want well within the 3s deadline", d)
	}
}

// TestClusterCrashAndReturn: a node stops without leaving (as kill -9
// would) and comes back with its data.
//
// Under the exact policy, nobody decides its keys meanwhile: checks on them
// are UNAVAILABLE ("owner down"), and no key is ever over its limit. Under
// the available policy, once failure detection dropped it and it is
// fenced, the next node decides its keys without their state: each moved
// key, sent more than twice its limit, allows exactly its limit again (one
// window's limit of excess at most, and a limit enforced). Either way, once
// it is back and the others handed back what they recorded, nothing more
// fits in the window: the cluster counts every hit again.
func TestClusterCrashAndReturn(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for failure detection")
	}
	for _, policy := range []cluster.Policy{cluster.PolicyExact, cluster.PolicyAvailable} {
		t.Run(policy.String(), func(t *testing.T) {
			tc := newTestClusterWith(t, 3, func(c *Config) { c.Router.Policy = policy })
			const keys, limit = 60, 4
			hit := func(node int, k int) (bool, string, error) {
				t.Helper()
				resp, err := tc.client(node).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("c%d", k), limit, time.Hour, 1)}})
				if err != nil {
					return false, "", err
				}
				return resp.Decisions[0].Allowed, resp.Decisions[0].Node, nil
			}
			// One hit per key before the crash: the victim's share of that
			// lives only in the victim's data file.
			owner := make([]string, keys)
			for k := 0; k < keys; k++ {
				ok, node, err := hit(0, k)
				if err != nil || !ok {
					t.Fatalf("c%d first hit = %v, %v; want allowed", k, ok, err)
				}
				owner[k] = node
			}
			victim := tc.nodes[2]
			victim.crash()
			tc.waitMembers(2)

			// Each moved key is sent more than twice its limit: a decider
			// that enforced no limit, or half of one, would allow more than
			// the limit.
			const sent = 2*limit + 1
			moved, refused := 0, 0
			allowed := make(map[int]int) // of each moved key
			deadline := time.Now().Add(10 * time.Second)
			for k := 0; k < keys; k++ {
				if owner[k] != "node-2" {
					continue
				}
				moved++
				allowed[k] = 0
				for i := 0; i < sent; i++ {
					var ok bool
					var node string
					var err error
					// Until the deadline, retry while node-0's router
					// still forwards to the crashed owner (it follows the
					// view a moment after it) under exact, while the
					// victim is being fenced (wait for the takeover) under
					// available. The switch below judges the last answer.
					_ = testkit.Wait(time.Until(deadline), func() error {
						ok, node, err = hit(0, k)
						if err != nil && (policy == cluster.PolicyAvailable || strings.Contains(err.Error(), "owner unreachable")) {
							return err
						}
						return nil
					})
					switch {
					case err != nil && policy == cluster.PolicyExact:
						if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "owner down") {
							t.Fatalf("c%d while its owner is down = %v; want Unavailable, owner down", k, err)
						}
						refused++
					case err != nil:
						t.Fatalf("c%d under the available policy: %v", k, err)
					case ok:
						allowed[k]++
						if node == "node-2" {
							t.Fatalf("c%d decided by the crashed node", k)
						}
					}
				}
			}
			if moved == 0 {
				t.Fatal("no key of 60 was owned by node-2")
			}
			// Under exact, nothing is allowed; under available, the new
			// decider starts without the hit node-2 recorded: the whole
			// limit fits again, and no more.
			want := 0
			if policy == cluster.PolicyAvailable {
				want = limit
			}
			perKey := make(map[int]int) // allowed hits → keys
			for k, got := range allowed {
				perKey[got]++
				if got != want {
					t.Errorf("c%d (owned by the crashed node) sent %d hits: %d allowed; want %d", k, sent, got, want)
				}
			}
			if policy == cluster.PolicyExact && refused != moved*sent {
				t.Errorf("exact policy: %d checks refused on the down node's %d keys; want all %d", refused, moved, moved*sent)
			}
			t.Logf("%s: %d keys of the crashed node, %d hits each: %d refused; keys by hits allowed: %v", policy, moved, sent, refused, perKey)
			if t.Failed() {
				t.FailNow()
			}

			victim.start()
			tc.waitMembers(3)
			tc.waitReady()
			// Each moved key holds its old hit (from the victim's disk), plus
			// under the available policy the limit the others recorded:
			// under exact, limit-1 more fit; under available, none.
			for k := 0; k < keys; k++ {
				if owner[k] != "node-2" {
					continue
				}
				want := 0
				if policy == cluster.PolicyExact {
					want = limit - 1
				}
				got := 0
				for i := 0; i < limit+1; i++ {
					ok, node, err := hit(1, k)
					if err != nil {
						t.Fatalf("c%d after the return: %v", k, err)
					}
					if node != "node-2" {
						t.Fatalf("c%d decided by %s after node-2 returned", k, node)
					}
					if ok {
						got++
					}
				}
				if got != want {
					t.Errorf("c%d after the return: %d more allowed; want %d", k, got, want)
				}
			}
		})
	}
}

// TestClusterAdminAnswersAsOne: the admin view of a key answers from
// whichever node is asked, listings cover every node, and an override set
// through one node applies on all of them.
func TestClusterAdminAnswersAsOne(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3)
	for k := 0; k < 30; k++ {
		if _, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("adm-%02d", k), 10, time.Hour, 3)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range tc.nodes {
		admin := sluicepb.NewAdminServiceClient(tc.nodes[i].conn)
		for k := 0; k < 30; k++ {
			resp, err := admin.GetKey(tc.nodes[i].ctx(), &sluicepb.GetKeyRequest{Key: []byte(fmt.Sprintf("adm-%02d", k))})
			if err != nil || !resp.State.Found || resp.State.Used != 3 {
				t.Fatalf("GetKey(adm-%02d) via node %d = %v, %v; want found with 3 used", k, i, resp, err)
			}
		}
		var keys []string
		token := ""
		for {
			resp, err := admin.ListKeys(tc.nodes[i].ctx(), &sluicepb.ListKeysRequest{Prefix: []byte("adm-"), PageSize: 7, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range resp.Keys {
				keys = append(keys, string(k.Key))
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
		if len(keys) != 30 || keys[0] != "adm-00" || keys[29] != "adm-29" {
			t.Fatalf("ListKeys via node %d: %d keys %v; want adm-00..adm-29", i, len(keys), keys)
		}
	}
	admin := sluicepb.NewAdminServiceClient(tc.nodes[1].conn)
	if _, err := admin.SetOverride(tc.nodes[1].ctx(), &sluicepb.SetOverrideRequest{Override: &sluicepb.Override{Key: []byte("adm-"), Prefix: true, Limit: 4}}); err != nil {
		t.Fatal(err)
	}
	for i := range tc.nodes {
		resp, err := tc.client(i).Check(tc.nodes[i].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("adm-%02d", i), 10, time.Hour, 1)}})
		if err != nil || resp.Decisions[0].Limit != 4 {
			t.Fatalf("check via node %d after the override = %v, %v; want limit 4", i, resp, err)
		}
	}
}

// TestClusterPeerServiceNeedsToken: with an admin token, nodes send it on
// forwarded checks and handoffs, and a caller without it cannot inject
// decisions or state through the peer service.
func TestClusterPeerServiceNeedsToken(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 2, func(c *Config) { c.AdminToken = "s3cret" })
	for k := 0; k < 20; k++ {
		resp, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("tok-%d", k), 5, time.Minute, 1)}})
		if err != nil || !resp.Decisions[0].Allowed {
			t.Fatalf("check tok-%d = %v, %v; want allowed (forwarding carries the token)", k, resp, err)
		}
	}
	peer := sluicepb.NewPeerServiceClient(tc.nodes[1].conn)
	_, err := peer.Forward(tc.nodes[1].ctx(), &sluicepb.ForwardRequest{Checks: []*sluicepb.Check{nativeCheck("x", 5, time.Minute, 1)}})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Forward without the token = %v; want Unauthenticated", err)
	}
	for name, call := range map[string]func() error{
		"Handoff": func() error {
			_, err := peer.Handoff(tc.nodes[1].ctx(), &sluicepb.HandoffRequest{FromNode: "intruder", Complete: true})
			return err
		},
		"Renew": func() error {
			_, err := peer.Renew(tc.nodes[1].ctx(), &sluicepb.RenewRequest{FromNode: "intruder", Epoch: 1})
			return err
		},
		"Propose": func() error {
			_, err := peer.Propose(tc.nodes[1].ctx(), &sluicepb.ProposeRequest{FromNode: "node-0", Command: []byte(`{"op":"forget","name":"node-1"}`)})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without the token = %v; want Unauthenticated", name, err)
		}
	}
	// With the token, a caller that names another cluster, or none, is
	// refused all the same, even by the leader, and nothing is applied.
	leader := tc.nodes[0]
	for _, ts := range tc.nodes {
		if ts.cfg.NodeName == ts.srv.Router().Leader() {
			leader = ts
		}
	}
	for _, id := range []string{"", "another-cluster"} {
		ctx := metadata.AppendToOutgoingContext(leader.ctx(), "authorization", "Bearer s3cret")
		if id != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "sluice-cluster", id)
		}
		_, err := sluicepb.NewPeerServiceClient(leader.conn).Propose(ctx, &sluicepb.ProposeRequest{FromNode: "node-1", Command: []byte(`{"op":"leaving","name":"node-1"}`)})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cluster") {
			t.Errorf("Propose from cluster %q = %v; want FailedPrecondition naming the cluster", id, err)
		}
	}
	if x, ok := tc.nodes[0].srv.Router().Map().Member("node-1"); !ok || !x.Live || x.Phase != control.PhaseJoined {
		t.Errorf("after the refused proposals, node-0's map holds node-1 as %+v (found %v); want live and joined", x, ok)
	}
}

// keyOwnedBy returns a key with the given prefix that node name owns.
func (tc *testCluster) keyOwnedBy(prefix, name string) string {
	r := tc.nodes[0].srv.Router()
	for i := 0; ; i++ {
		if k := fmt.Sprintf("%s%d", prefix, i); func() bool { o, _ := r.Owner(k); return o == name }() {
			return k
		}
	}
}

// used peeks at key through node i and returns the hits it counts.
func (tc *testCluster) used(i int, key string, limit int64) int64 {
	tc.t.Helper()
	resp, err := tc.client(i).Check(tc.nodes[i].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, limit, time.Hour, 0)}})
	if err != nil {
		tc.t.Fatalf("peek %s via node %d: %v", key, i, err)
	}
	return limit - resp.Decisions[0].Remaining
}

// TestClusterAllOrNothingOwnerFails: an all-or-nothing call whose keys
// live on three nodes, one of which cannot be reached, fails as a whole,
// and the hits the two others reserved are released: nothing stays
// recorded for a call that was not acknowledged.
func TestClusterAllOrNothingOwnerFails(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3)
	kA, kB, kC := tc.keyOwnedBy("a", "node-0"), tc.keyOwnedBy("b", "node-1"), tc.keyOwnedBy("c", "node-2")
	tc.nodes[2].srv.StopServing() // reachable in the view, not on the wire
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := tc.client(0).Check(ctx, &sluicepb.CheckRequest{AllOrNothing: true, Checks: []*sluicepb.Check{
		nativeCheck(kA, 5, time.Hour, 2), nativeCheck(kB, 5, time.Hour, 2), nativeCheck(kC, 5, time.Hour, 2),
	}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("all-or-nothing call with an unreachable owner = %v; want Unavailable", err)
	}
	for _, k := range []struct {
		key  string
		node int
	}{{kA, 0}, {kB, 1}} {
		if got := tc.used(k.node, k.key, 5); got != 0 {
			t.Errorf("%s counts %d hits after the failed all-or-nothing call; want 0 (its reservation released)", k.key, got)
		}
	}
}

// TestClusterBatchKeepsEachDeadline: checks forwarded in one batch are not
// failed by the earliest deadline among their callers: a caller whose
// deadline passed is left out, and the others are answered.
func TestClusterBatchKeepsEachDeadline(t *testing.T) {
	t.Parallel()
	// One sender per peer that holds each batch open 200ms: the two checks
	// below share a batch.
	tc := newTestClusterWith(t, 2, func(c *Config) {
		c.Router.ForwardWait, c.Router.MaxInFlight = 200*time.Millisecond, 1
	})
	k1, k2 := tc.keyOwnedBy("p", "node-1"), tc.keyOwnedBy("q", "node-1")
	impatient := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := tc.client(0).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(k1, 5, time.Hour, 1)}})
		impatient <- err
	}()
	// Whichever of the two checks reaches the sender first, the sender
	// holds its batch open 200ms: the other joins it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := tc.client(0).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(k2, 5, time.Hour, 1)}})
	if err != nil || !resp.Decisions[0].Allowed {
		t.Fatalf("patient check batched with an impatient one = %v, %v; want allowed", resp, err)
	}
	if err := <-impatient; status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("impatient check = %v; want DeadlineExceeded", err)
	}
}

// TestClusterForgetMember: with one replica, the keys of a node that
// crashed wait for it; an operator who knows it will not come back forgets
// it: its epoch is ended once its lease is over, it leaves the map and
// Raft, and its keys go to the others, which deny them for one window of
// their limit (its state is gone: the hits it allowed in the last window
// are unknown). A member that is alive cannot be forgotten, nor one that
// does not exist.
func TestClusterForgetMember(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for failure detection")
	}
	tc := newTestCluster(t, 3)
	key := tc.keyOwnedBy("f", "node-2")
	admin := tc.nodes[0].admin()
	if _, err := admin.ForgetMember(tc.nodes[0].ctx(), &sluicepb.ForgetMemberRequest{Name: "node-2"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("ForgetMember(node-2, alive) = %v; want FailedPrecondition", err)
	}
	if _, err := admin.ForgetMember(tc.nodes[0].ctx(), &sluicepb.ForgetMemberRequest{Name: "node-9"}); status.Code(err) != codes.NotFound {
		t.Fatalf("ForgetMember(node-9, unknown) = %v; want NotFound", err)
	}
	tc.nodes[2].crash()
	tc.waitMembers(2)
	// Until the leader ends node-2's epoch the check goes to node-2 and
	// finds it unreachable; then its keys wait for it.
	if err := testkit.Wait(15*time.Second, func() error {
		_, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 5, time.Hour, 1)}})
		if status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "owner down") {
			return nil
		}
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("check on node-2's key while it is down = %v; want Unavailable, owner down", err)
		}
		return fmt.Errorf("check on node-2's key while it is down = %v; want Unavailable, owner down", err)
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.ForgetMember(tc.nodes[0].ctx(), &sluicepb.ForgetMemberRequest{Name: "node-2"})
	if err != nil || resp.FromCopies {
		t.Fatalf("ForgetMember(node-2, down) = %v, %v; want done, its keys without copies", resp, err)
	}
	// Each node moves the key once it applied the change, then denies it
	// for one window: node-2 may have allowed its limit in the last hour.
	for i := 0; i < 2; i++ {
		if err := testkit.Wait(10*time.Second, func() error {
			resp, err := tc.client(i).Check(tc.nodes[i].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 5, time.Hour, 1)}})
			if err == nil && resp.Decisions[0].Node != "node-2" {
				if d := resp.Decisions[0]; d.Allowed || d.RetryAfter.AsDuration() < 59*time.Minute {
					t.Fatalf("check on the forgotten node's key via node %d = %v; want denied for about an hour", i, d)
				}
				return nil
			}
			return fmt.Errorf("check on the forgotten node's key via node %d = %v, %v; want decided by a live node", i, resp, err)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range tc.nodes[1].listMembers().Members {
		if m.Name == "node-2" && (m.State != "left" || m.Share != 0) {
			t.Errorf("node-1 lists the forgotten node as %v; want left, no share", m)
		}
	}
	// Two servers are left, and two voters would need both: the leader
	// demotes the other one.
	if err := testkit.Wait(10*time.Second, func() error {
		var voters []string
		for _, m := range tc.nodes[1].listMembers().Members {
			if m.Voter {
				voters = append(voters, m.Name)
			}
		}
		if len(voters) != 1 {
			return fmt.Errorf("voters after forgetting node-2 of three: %v; want one", voters)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestClusterLeaveHandsOverInParallel: a leaving node hands its keys to
// every member at once, so a member that cannot be reached (one of node-1
// and node-2 that does not lead, its gRPC server stopped but its gossip
// alive) delays nobody else: the other gets its share, with its state, at
// once. The keys meant for the unreachable one stay on the leaving node,
// which then stops without leaving (its keys wait for it) rather than lose
// them.
func TestClusterLeaveHandsOverInParallel(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 3, func(c *Config) { c.ShutdownTimeout = 3 * time.Second })
	// The unreachable member must not lead: the others reach the leader
	// through its gRPC server.
	cut, gets := 1, 2
	if tc.nodes[0].srv.Router().Leader() == "node-1" {
		cut, gets = 2, 1
	}
	receiver := tc.nodes[gets].cfg.NodeName
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("h%d", i); slices.Equal(order(k, "node-0", "node-1", "node-2")[:2], []string{"node-0", receiver}) {
			key = k
		}
	}
	for i := 0; i < 3; i++ {
		if resp, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 5, time.Hour, 1)}}); err != nil || !resp.Decisions[0].Allowed {
			t.Fatalf("hit %d on %s = %v, %v", i, key, resp, err)
		}
	}
	tc.nodes[cut].srv.StopServing()
	start := time.Now()
	leaver := tc.nodes[0]
	stopped := make(chan struct{})
	go func() {
		leaver.stop()
		close(stopped)
	}()
	// Until node-0 hears that it leaves, it may still decide the key
	// (nobody else does): wait for the receiver to answer it.
	if err := testkit.Wait(time.Until(start.Add(2*time.Second)), func() error {
		resp, err := tc.client(gets).Check(tc.nodes[gets].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 5, time.Hour, 0)}})
		if err == nil && resp.Decisions[0].Node == receiver {
			if d := resp.Decisions[0]; d.Remaining != 2 {
				t.Fatalf("peek at %s via %s after node-0 left = %v; want 2 remaining (node-0's 3 hits handed over)", key, receiver, d)
			}
			t.Logf("%s decided %s with its state %v after node-0 started leaving", receiver, key, time.Since(start).Round(time.Millisecond))
			return nil
		}
		return fmt.Errorf("%s still refuses %s after node-0 started leaving (2s at most): %v", receiver, key, err)
	}); err != nil {
		t.Fatal(err)
	}
	<-stopped
}

// TestClusterStandbyTakesOver: with a standby per key (--replicas 2) and
// the exact policy, a node's crash costs its keys nothing but time: once
// failure detection dropped it and it is fenced, each key's standby
// decides it from its copy, which holds every acknowledged hit (exactly
// one more hit fits where one was left); when the node comes back, it gets
// the keys back with what was recorded meanwhile, each hit counted once
// (nothing more fits).
func TestClusterStandbyTakesOver(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for failure detection")
	}
	tc := newTestClusterWith(t, 3, func(c *Config) { c.Router.Replicas = 2 })
	const keys, limit = 40, 4
	hit := func(node int, key string) (*sluicepb.Decision, error) {
		resp, err := tc.client(node).Check(tc.nodes[node].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, limit, time.Hour, 1)}})
		if err != nil {
			return nil, err
		}
		return resp.Decisions[0], nil
	}
	var victims []string
	for k := 0; len(victims) < keys; k++ {
		key := fmt.Sprintf("s%d", k)
		for i := 0; i < limit-1; i++ {
			d, err := hit(0, key)
			if err != nil || !d.Allowed {
				t.Fatalf("hit %d on %s = %v, %v; want allowed", i, key, d, err)
			}
			if d.Node == "node-2" {
				victims = append(victims[:len(victims):len(victims)], key)
			}
		}
	}
	victims = slices.Compact(victims)
	tc.nodes[2].crash()
	start := time.Now()
	deadline := start.Add(15 * time.Second)
	for _, key := range victims {
		var d *sluicepb.Decision
		if err := testkit.Wait(time.Until(deadline), func() (err error) {
			d, err = hit(0, key)
			return err
		}); err != nil {
			t.Fatalf("%s still refused %v after node-2 crashed: %v", key, time.Since(start).Round(time.Millisecond), err)
		}
		if !d.Allowed || d.Remaining != 0 || d.Node == "node-2" {
			t.Fatalf("first hit on %s after node-2 crashed = %v; want allowed by its standby with 0 remaining (its %d hits kept)", key, d, limit-1)
		}
		if d, err := hit(1, key); err != nil || d.Allowed {
			t.Fatalf("second hit on %s after the takeover = %v, %v; want denied", key, d, err)
		}
	}
	t.Logf("%d keys of node-2 taken over by their standbys %v after the crash", len(victims), time.Since(start).Round(time.Millisecond))

	tc.nodes[2].start()
	tc.waitMembers(3)
	tc.waitReady()
	for _, key := range victims {
		if err := testkit.Wait(10*time.Second, func() error {
			d, err := hit(2, key)
			if err == nil && d.Node == "node-2" {
				if d.Allowed {
					t.Fatalf("%s after node-2 came back = %v; want denied (%d hits recorded)", key, d, limit)
				}
				return nil
			}
			return fmt.Errorf("%s not decided by node-2 after it came back: %v, %v", key, d, err)
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// order returns names in key's rendezvous order, best first.
func order(key string, names ...string) []string {
	h := shard.Hash(key)
	out := slices.Clone(names)
	slices.SortFunc(out, func(a, b string) int {
		sa, sb := shard.Score(h, shard.NodeHash(a)), shard.Score(h, shard.NodeHash(b))
		if sa != sb {
			if sa > sb {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return out
}
