package node

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster/control"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestClusterHandoffSentAgainCountsOnce: a Handoff part that reaches its
// receiver twice, and then a newer version of it (the sender did not get
// the first answer: a timeout, a round cancelled by a newer ownership, the
// receiver's standby failing to confirm after the import committed; or
// the key changed at the sender after it was read), counts its hits once
// on a receiver that holds hits of its own, of another lineage, for every
// algorithm.
func TestClusterHandoffSentAgainCountsOnce(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 2, func(c *Config) { c.Router.Replicas = 2 })
	const limit = 100
	window := 24 * time.Hour // what a bucket refills while the test runs is below one hit
	for i, algo := range []sluicepb.Algorithm{sluicepb.Algorithm_ALGORITHM_SLIDING_LOG, sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW, sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET} {
		t.Run(algo.String(), func(t *testing.T) {
			key := tc.keyOwnedBy("again-"+string(rune('a'+i)), "node-0")
			check := func(cost int64) *sluicepb.Check {
				c := nativeCheck(key, limit, window, cost)
				c.Algorithm = algo
				return c
			}
			used := func() int64 {
				t.Helper()
				resp, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{check(0)}})
				if err != nil {
					t.Fatalf("peek %s: %v", key, err)
				}
				return limit - resp.Decisions[0].Remaining
			}
			// node-0 decides the key from nothing (its own lineage).
			if resp, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{check(5)}}); err != nil || !resp.Decisions[0].Allowed {
				t.Fatalf("5 hits on %s = %v, %v; want allowed", key, resp, err)
			}

			// The hits another node recorded meanwhile (another lineage),
			// read as a handoff round reads them.
			other, err := actor.New(actor.Config{Clock: tc.clk})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			otherHits := func(cost int64) actor.Exported {
				t.Helper()
				d := make([]actor.Decision, 1)
				algos := map[sluicepb.Algorithm]actor.Algorithm{
					sluicepb.Algorithm_ALGORITHM_SLIDING_LOG:    actor.SlidingLog,
					sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW: actor.SlidingWindow,
					sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET:   actor.TokenBucket,
				}
				c := actor.Check{Key: key, Limit: limit, Window: window, Algorithm: algos[algo], Cost: cost}
				if err := other.Check(context.Background(), []actor.Check{c}, d); err != nil || !d[0].Allowed {
					t.Fatalf("%d hits on the other node = %+v, %v", cost, d[0], err)
				}
				var got []actor.Exported
				if _, err := other.Collect(context.Background(), func(k string) bool { return k == key }, func(x actor.Exported) error {
					got = append(got, x)
					return nil
				}); err != nil || len(got) != 1 {
					t.Fatalf("Collect on the other node = %d states, %v; want 1", len(got), err)
				}
				return got[0]
			}

			m := tc.nodes[0].srv.Router().Map()
			to, _ := m.Member("node-0")
			from, _ := m.Member("node-1")
			peer := sluicepb.NewPeerServiceClient(tc.nodes[0].conn)
			send := func(x actor.Exported) {
				t.Helper()
				ctx := metadata.AppendToOutgoingContext(tc.nodes[0].ctx(), control.ClusterHeader, m.ClusterID)
				_, err := peer.Handoff(ctx, &sluicepb.HandoffRequest{
					FromNode: from.Name, FromEpoch: from.Epoch, ToNode: to.Name, ToEpoch: to.Epoch,
					MapVersion: m.Version, Config: m.Changed, Sequence: 1,
					Keys: []*sluicepb.KeyRecord{{Key: []byte(key), State: x.State}},
				})
				if err != nil {
					t.Fatalf("Handoff of %s to node-0: %v", key, err)
				}
			}

			x := otherHits(3)
			send(x)
			if got := used(); got != 8 {
				t.Fatalf("after the handoff %s counts %d; want 5 + 3", key, got)
			}
			send(x)
			if got := used(); got != 8 {
				t.Fatalf("after the same handoff sent again %s counts %d; want 8 (the 3 hits once)", key, got)
			}
			send(otherHits(2)) // the sender's newer version of the same state
			if got := used(); got != 10 {
				t.Fatalf("after a newer version of the handed-over state %s counts %d; want 10", key, got)
			}
		})
	}
}
