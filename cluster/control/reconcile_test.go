package control

import (
	"slices"
	"testing"
	"time"
)

// withPartitions sets the cluster's partition settings on mc's map, as a
// cluster bootstrapped with them has.
func (mc *machine) withPartitions(n, minInsync int) {
	s := mc.m.Settings
	s.Partitions, s.MinInsync = n, minInsync
	mc.m.Settings = s
}

// TestPartitionsSetOnceMembersAreLive: the leader sets the partitions only
// once every member that owns keys is live, so that every replica starts
// in sync; the command spreads each partition over the replicas the
// setting asks for, and the one preferred (first) leads.
func TestPartitionsSetOnceMembersAreLive(t *testing.T) {
	mc := newMachine(t, 2)
	mc.withPartitions(8, 1)
	if why := ownersLive(mc.m); why == "" {
		t.Fatalf("a map without members is ready for partitions")
	}
	mc.must(command{Op: opAdd, Name: "a", ID: id("a")})
	if why := ownersLive(mc.m); why == "" {
		t.Fatalf("a map whose member a has not started is ready for partitions")
	}
	mc.join("a")
	mc.must(command{Op: opAdd, Name: "b", ID: id("b")})
	if why := ownersLive(mc.m); why != "b is not live" {
		t.Fatalf("ownersLive with b added, not started = %q; want b named", why)
	}
	ep := mc.join("b")
	if why := ownersLive(mc.m); why != "" {
		t.Fatalf("ownersLive with a and b live = %q; want ready", why)
	}
	// c is in the Raft configuration (it bootstrapped with a and b) but
	// not added yet: the leader waits for it, up to partitionPatience.
	var pl placer
	servers := []string{id("a"), id("c"), id("b")}
	t0 := time.Unix(1000, 0)
	for _, tt := range []struct {
		after time.Duration
		want  bool
	}{{0, false}, {partitionPatience - time.Millisecond, false}, {partitionPatience, true}} {
		ok, absent := pl.due(mc.m, servers, t0.Add(tt.after))
		if ok != tt.want || !slices.Equal(absent, []string{id("c")}) {
			t.Errorf("due %v after c was first missed = %v, %v; want %v, [%s]", tt.after, ok, absent, tt.want, id("c"))
		}
	}
	if ok, absent := pl.due(mc.m, servers[:1], t0); !ok || absent != nil {
		t.Errorf("due with every server a member = %v, %v; want true, none", ok, absent)
	}
	mc.step(partitionsCommand(mc.m))
	if mc.m.MinInsync != 1 || len(mc.m.Partitions) != 8 {
		t.Fatalf("after the partitions command: min-insync %d, %d partitions; want 1, 8", mc.m.MinInsync, len(mc.m.Partitions))
	}
	leads := map[string]int{}
	for p, rec := range mc.m.Partitions {
		if len(rec.Replicas) != 2 || len(rec.ISR) != 2 || rec.Leader != rec.Replicas[0] || rec.LeaderEpoch != 1 {
			t.Errorf("partition %d: %+v; want 2 replicas in sync, the first leading at epoch 1", p, rec)
		}
		for _, x := range rec.ISR {
			if x.Epoch != ep["b"] && x.Epoch != mc.member("a").Epoch {
				t.Errorf("partition %d: %+v admitted in no live epoch", p, x)
			}
		}
		leads[rec.Leader]++
	}
	if leads[id("a")] != 4 || leads[id("b")] != 4 {
		t.Errorf("leaders: %v; want 4 each", leads)
	}
	if res := mc.do(partitionsCommand(mc.m)); res.Err == "" {
		t.Errorf("a second partitions command applied")
	}
}

// TestReplicasReplacedAfterForget: once a forgotten member left the
// replica lists, each list it was on is one short; the leader's one
// replicas command adds the member PlanReplicas puts there, as a learner
// (in the list, not in sync), keeping every member's share within one of
// the others', and then has nothing more to add.
func TestReplicasReplacedAfterForget(t *testing.T) {
	mc := newMachine(t, 2)
	mc.withPartitions(8, 1)
	ep := mc.join("a", "b", "c", "d")
	mc.step(partitionsCommand(mc.m))
	if got := replicaChanges(mc.m); got != nil {
		t.Fatalf("replicaChanges right after the partitions were set = %+v; want none", got)
	}
	var onD []int
	for p, rec := range mc.m.Partitions {
		if slices.Contains(rec.Replicas, id("d")) {
			onD = append(onD, p)
		}
	}
	if len(onD) != 4 {
		t.Fatalf("d holds %d replicas of 8 partitions × 2 over 4 members; want 4", len(onD))
	}
	mc.step(command{Op: opEnd, Name: "d", Epoch: ep["d"]})
	mc.step(command{Op: opForget, Name: "d", At: 1})
	changes := replicaChanges(mc.m)
	var changed []int
	for _, ch := range changes {
		changed = append(changed, ch.P)
	}
	if !slices.Equal(changed, onD) {
		t.Fatalf("replicaChanges after d was forgotten change partitions %v; want d's, %v", changed, onD)
	}
	before := slices.Clone(mc.m.Partitions)
	if res := mc.step(command{Op: opReplicas, Partitions: changes}); res.Err != "" {
		t.Fatalf("the replicas command: %s", res.Err)
	}
	count := map[string]int{}
	for p, rec := range mc.m.Partitions {
		for _, r := range rec.Replicas {
			count[r]++
		}
		if len(rec.Replicas) != 2 {
			t.Errorf("partition %d after the refill: replicas %v; want 2", p, rec.Replicas)
		}
		if !slices.Contains(onD, p) {
			continue
		}
		added := rec.Replicas[1]
		if !slices.Equal(rec.Replicas[:1], before[p].Replicas) || rec.inSync(added) || rec.Leader != before[p].Leader {
			t.Errorf("partition %d: %+v, was %+v; want its list kept, one learner added out of sync, its leader kept", p, rec, before[p])
		}
	}
	for _, name := range []string{"a", "b", "c"} {
		if n := count[id(name)]; n != 5 && n != 6 {
			t.Errorf("%s holds %d replicas after the refill; want 5 or 6 (16 over 3): %v", name, n, count)
		}
	}
	if got := replicaChanges(mc.m); got != nil {
		t.Errorf("replicaChanges after the refill = %+v; want none", got)
	}
}

// TestReplicasAddedWhenMembersJoin: partitions set while the cluster had
// fewer members than replicas get the next member as a learner, in
// batches of replicasBatch partitions per command.
func TestReplicasAddedWhenMembersJoin(t *testing.T) {
	const n = 2 * replicasBatch
	mc := newMachine(t, 2)
	mc.withPartitions(n, 1)
	mc.join("a")
	mc.step(partitionsCommand(mc.m))
	if got := replicaChanges(mc.m); got != nil {
		t.Fatalf("replicaChanges with one member for 2 replicas = %d changes; want none", len(got))
	}
	mc.join("b")
	for batch := range 2 {
		changes := replicaChanges(mc.m)
		if len(changes) != replicasBatch {
			t.Fatalf("batch %d: %d changes; want %d", batch, len(changes), replicasBatch)
		}
		if res := mc.do(command{Op: opReplicas, Partitions: changes}); res.Err != "" {
			t.Fatalf("batch %d: %s", batch, res.Err)
		}
	}
	if got := replicaChanges(mc.m); got != nil {
		t.Fatalf("after two batches: %d changes more; want none", len(got))
	}
	for p, rec := range mc.m.Partitions {
		if !slices.Equal(rec.Replicas, []string{id("a"), id("b")}) || rec.inSync(id("b")) || rec.Leader != id("a") {
			t.Fatalf("partition %d: %+v; want a leading, b a learner", p, rec)
		}
	}
	if err := mc.m.CheckPartitions(); err != nil {
		t.Fatal(err)
	}
}
