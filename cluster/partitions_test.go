package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/persist"
	"github.com/sluice-io/sluice/shard"
)

// partitionMap is a map of three live members a, b, c (IDs id-a...) and
// two partitions: 0 led by a, 1 led by b, each with both in sync.
func partitionMap() *control.Map {
	m := &control.Map{Version: 7, Settings: control.Settings{Replicas: 2, Partitions: 2, MinInsync: 1}, MinInsync: 1}
	for i, n := range []string{"a", "b", "c"} {
		m.Members = append(m.Members, control.Member{Name: n, ID: "id-" + n, Phase: control.PhaseJoined, Epoch: uint64(i + 1), Live: true})
	}
	m.Partitions = []control.Partition{
		{Replicas: []string{"id-a", "id-b"}, Leader: "id-a", LeaderEpoch: 1, Version: 1, ISR: []control.Incarnation{{ID: "id-a", Epoch: 1}, {ID: "id-b", Epoch: 2}}},
		{Replicas: []string{"id-b", "id-c"}, Leader: "id-b", LeaderEpoch: 1, Version: 1, ISR: []control.Incarnation{{ID: "id-b", Epoch: 2}, {ID: "id-c", Epoch: 3}}},
	}
	return m
}

// keyIn returns a key of partition p of n.
func keyIn(p, n int) string {
	for i := 0; ; i++ {
		if k := fmt.Sprintf("k%d", i); shard.Partition(shard.Hash(k), n) == p {
			return k
		}
	}
}

// TestFollowerTakesCopiesOnlyFromTheLeader: a follower refuses a call of
// copies unless its sender leads the partition of every record in the
// follower's map (I1 at the follower: a leader that lost its partition
// cannot have its writes confirmed).
func TestFollowerTakesCopiesOnlyFromTheLeader(t *testing.T) {
	own := &ownership{cur: newConfig("c", PolicyExact, 2, partitionMap())}
	r := &Router{cfg: RouterConfig{Self: "c"}}
	k0, k1 := keyIn(0, 2), keyIn(1, 2)
	rec := func(k string) persist.Record { return persist.Record{Key: k, Deadline: 1, Value: []byte{1}} }
	if err := r.checkFollower(own, "b", []persist.Record{rec(k1)}); err != nil {
		t.Fatalf("copies of partition 1 from its leader b: %v; want taken", err)
	}
	for _, tc := range []struct {
		from string
		recs []persist.Record
	}{
		{"a", []persist.Record{rec(k1)}},          // a leads partition 0, not 1
		{"b", []persist.Record{rec(k1), rec(k0)}}, // one record of a partition b does not lead
		{"z", []persist.Record{rec(k1)}},          // not a member
	} {
		if err := r.checkFollower(own, tc.from, tc.recs); err == nil || !strings.Contains(err.Error(), "wrong epoch") {
			t.Errorf("copies from %s: %v; want refused", tc.from, err)
		}
	}
}

// TestPartitionTombstoneDenies: a check on a key of a partition with a
// tombstone is denied, without recording, until one window of its limit
// after the tombstone; keys of other partitions are not.
func TestPartitionTombstoneDenies(t *testing.T) {
	m := partitionMap()
	m.Partitions[1].Tombstone = time.Now().Add(-time.Minute).UnixNano()
	own := &ownership{cur: newConfig("b", PolicyExact, 2, m)}
	r := &Router{}
	checks := []actor.Check{
		{Key: keyIn(1, 2), Limit: 5, Window: time.Hour, Cost: 1},   // within the window: denied
		{Key: keyIn(1, 2), Limit: 5, Window: time.Second, Cost: 1}, // its window passed
		{Key: keyIn(0, 2), Limit: 5, Window: time.Hour, Cost: 1},   // no tombstone
		{Key: keyIn(1, 2), Limit: 5, Window: time.Hour, Cost: 0},   // a peek records nothing
	}
	out := make([]actor.Decision, len(checks))
	denied := r.penalize(own, checks, out)
	if want := []bool{true, false, false, false}; len(denied) != len(want) || denied[0] != want[0] || denied[1] || denied[2] || denied[3] {
		t.Fatalf("denied %v; want %v", denied, want)
	}
	if d := out[0]; d.Allowed || d.RetryAfter < 58*time.Minute || d.RetryAfter > time.Hour {
		t.Fatalf("the denied check: %+v; want denied until an hour after the tombstone", d)
	}
	m.Partitions[1].Tombstone = 0
	if denied := r.penalize(&ownership{cur: newConfig("b", PolicyExact, 2, m)}, checks, out); denied != nil {
		t.Fatalf("denied %v without a tombstone; want none", denied)
	}
}
