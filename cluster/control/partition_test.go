package control

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// id is the Raft ID machine.join gives the member named name.
func id(name string) string { return "id-" + name }

// partitionsOf sets up n partitions over the members named, each
// partition's replicas the next `replicas` of them round the list from
// its index: partition i prefers names[i % len(names)].
func (mc *machine) partitionsOf(n, replicas, minInsync int, names ...string) {
	mc.t.Helper()
	c := command{Op: opPartitions, MinInsync: minInsync}
	for i := range n {
		ch := PartitionChange{P: i}
		for j := range replicas {
			ch.Replicas = append(ch.Replicas, id(names[(i+j)%len(names)]))
		}
		c.Partitions = append(c.Partitions, ch)
	}
	mc.must(c)
}

// step applies c as mc.do does and checks the map's invariants and the
// change's (see checkStep).
func (mc *machine) step(c command) Result {
	mc.t.Helper()
	before := mc.m
	res := mc.do(c)
	if res.Err != "" {
		if mc.m != before {
			mc.t.Fatalf("refused %s changed the map", c.Op)
		}
		return res
	}
	if err := checkStep(before, mc.m, c); err != nil {
		mc.t.Fatalf("after %s: %v", describe(c), err)
	}
	return res
}

func describe(c command) string {
	b, _ := json.Marshal(c)
	return string(b)
}

// led returns the partitions whose leader is the member named name.
func (mc *machine) led(name string) []int {
	var out []int
	for i, p := range mc.m.Partitions {
		if p.Leader == id(name) {
			out = append(out, i)
		}
	}
	return out
}

// checkStep returns an error if the map after c breaks a static invariant
// (Map.CheckPartitions) or if the change from before to after broke one of
// the transition invariants: I1 (the leader of a partition whose leader is
// live moves only by its own transfer), I3 (a new leader comes from the
// committed in-sync set, under policy exact, unless the partition was
// lost: a new tombstone), leader epochs that grow by one per change of
// leader, versions that grow with every change, and admissions in the
// admitted member's current epoch (I4).
func checkStep(before, after *Map, c command) error {
	if err := after.CheckPartitions(); err != nil {
		return err
	}
	if len(before.Partitions) == 0 {
		return nil
	}
	if len(after.Partitions) != len(before.Partitions) {
		return fmt.Errorf("the partition count changed from %d to %d", len(before.Partitions), len(after.Partitions))
	}
	exact := after.Settings.Policy != "available"
	for i := range after.Partitions {
		a, b := before.Partitions[i], after.Partitions[i]
		if reflect.DeepEqual(a, b) {
			continue
		}
		if b.Version <= a.Version {
			return fmt.Errorf("partition %d changed at version %d (was %d)", i, b.Version, a.Version)
		}
		if b.LeaderEpoch < a.LeaderEpoch {
			return fmt.Errorf("partition %d: leader epoch went back from %d to %d", i, a.LeaderEpoch, b.LeaderEpoch)
		}
		lost := b.Tombstone != a.Tombstone
		if a.Leader != "" && (a.Leader != b.Leader || a.LeaderEpoch != b.LeaderEpoch) {
			// I1: the old leader's epoch ended here, or it moved the
			// partition itself.
			x, _ := before.MemberByID(a.Leader)
			y, ok := after.MemberByID(a.Leader)
			stillLive := ok && y.Live && y.Epoch == x.Epoch
			own := (c.Op == opTransfer || c.Op == opReclaim) && c.ID == a.Leader
			if stillLive && !own {
				return fmt.Errorf("partition %d moved from live leader %s (epoch %d) by %s", i, a.Leader, x.Epoch, describe(c))
			}
		}
		if a.Leader != b.Leader {
			if b.LeaderEpoch != a.LeaderEpoch+1 {
				return fmt.Errorf("partition %d: leader %q → %q, leader epoch %d → %d; want +1", i, a.Leader, b.Leader, a.LeaderEpoch, b.LeaderEpoch)
			}
			// I3.
			if b.Leader != "" && exact && !lost && !a.inSync(b.Leader) {
				return fmt.Errorf("partition %d: new leader %s was not in sync %v", i, b.Leader, a.ISR)
			}
		}
		if exact && b.Unclean {
			return fmt.Errorf("partition %d: unclean election under policy exact", i)
		}
		for _, x := range b.ISR {
			if a.inSync(x.ID) && a.ISR[a.isrIndex(x.ID)] == x {
				continue
			}
			y, ok := after.MemberByID(x.ID)
			fresh := lost || b.Unclean && !exact
			if !fresh && (!ok || !y.Live || y.Epoch != x.Epoch) {
				return fmt.Errorf("partition %d admitted %+v, not a live epoch (%+v)", i, x, y)
			}
		}
	}
	return nil
}

// TestPartitionsGracefulRestart walks one node's graceful restart: its
// partitions go to their in-sync replicas, it leaves every in-sync set,
// comes back leading nothing, is admitted again by the leaders in its new
// epoch and gets its partitions back by their transfers.
func TestPartitionsGracefulRestart(t *testing.T) {
	mc := newMachine(t, 2)
	ep := mc.join("a", "b", "c")
	mc.partitionsOf(8, 2, 1, "a", "b", "c")
	if got := mc.led("c"); !slices.Equal(got, []int{2, 5}) {
		t.Fatalf("c leads %v; want [2 5]", got)
	}
	// c stops: its partitions go to their second replica, a.
	end := command{Op: opEnd, Name: "c", Epoch: ep["c"], Graceful: true}
	for _, p := range mc.led("c") {
		end.Partitions = append(end.Partitions, PartitionChange{P: p, To: id("a")})
	}
	mc.step(end)
	for _, p := range []int{2, 5} {
		rec := mc.m.Partitions[p]
		if rec.Leader != id("a") || rec.LeaderEpoch != 2 || !slices.Equal(rec.ISR, []Incarnation{{id("a"), ep["a"]}}) {
			t.Fatalf("partition %d after c stopped: %+v", p, rec)
		}
	}
	if rec := mc.m.Partitions[1]; rec.Leader != id("b") || len(rec.ISR) != 1 {
		t.Fatalf("partition 1 (b, c) after c stopped: %+v; want b alone in sync", rec)
	}
	// c starts again: it is not in sync, so it leads nothing.
	ec := mc.step(command{Op: opStart, Name: "c", ID: id("c")}).Epoch
	if got := mc.led("c"); len(got) != 0 {
		t.Fatalf("c leads %v right after its start; want none", got)
	}
	// a admits it (caught up) in its new epoch, then hands partition 2 back.
	p2 := mc.m.Partitions[2]
	isr := append(slices.Clone(p2.ISR), Incarnation{id("c"), ec})
	res := mc.step(command{Op: opISR, Name: "a", ID: id("a"), Epoch: ep["a"],
		Partitions: []PartitionChange{{P: 2, Version: p2.Version, LeaderEpoch: p2.LeaderEpoch, ISR: isr}}})
	if res.Err != "" {
		t.Fatal(res.Err)
	}
	p2 = mc.m.Partitions[2]
	mc.step(command{Op: opTransfer, Name: "a", ID: id("a"), Epoch: ep["a"],
		Partitions: []PartitionChange{{P: 2, LeaderEpoch: p2.LeaderEpoch, To: id("c")}}})
	if rec := mc.m.Partitions[2]; rec.Leader != id("c") || rec.LeaderEpoch != 3 {
		t.Fatalf("partition 2 after the transfer back: %+v", rec)
	}
}

// TestPartitionWaitsForItsLastInSync: when the only in-sync replica of a
// partition crashes, the partition waits; the other replica, behind, does
// not lead it. The crashed node leads it again when it starts, unless its
// data may have lost acknowledged writes: then it waits for an operator
// under policy exact and leads out of sync under available.
func TestPartitionWaitsForItsLastInSync(t *testing.T) {
	for _, policy := range []string{"exact", "available"} {
		for _, lost := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/lost=%v", policy, lost), func(t *testing.T) {
				mc := newMachine(t, 2)
				mc.m.Settings.Policy = policy
				ep := mc.join("a", "b")
				mc.partitionsOf(2, 2, 1, "a", "b")
				p0 := mc.m.Partitions[0]
				// a drops b from partition 0's in-sync set (b lags).
				mc.step(command{Op: opISR, Name: "a", ID: id("a"), Epoch: ep["a"],
					Partitions: []PartitionChange{{P: 0, Version: p0.Version, LeaderEpoch: p0.LeaderEpoch, ISR: p0.ISR[:1]}}})
				mc.step(command{Op: opEnd, Name: "a", Epoch: ep["a"]})
				rec := mc.m.Partitions[0]
				if policy == "exact" && (rec.Leader != "" || rec.LeaderEpoch != 2) {
					t.Fatalf("partition 0 after its last in-sync replica crashed: %+v; want no leader at epoch 2", rec)
				}
				if policy == "available" && (rec.Leader != id("b") || !rec.Unclean) {
					t.Fatalf("partition 0 under available: %+v; want b, unclean", rec)
				}
				if rec := mc.m.Partitions[1]; rec.Leader != id("b") {
					t.Fatalf("partition 1, in sync on b: %+v; want b to lead", rec)
				}
				ea := mc.step(command{Op: opStart, Name: "a", ID: id("a"), MayHaveLost: lost}).Epoch
				rec = mc.m.Partitions[0]
				switch {
				case policy == "exact" && !lost:
					if rec.Leader != id("a") || rec.ISR[0] != (Incarnation{id("a"), ea}) {
						t.Fatalf("partition 0 after a came back: %+v; want a to lead in epoch %d", rec, ea)
					}
				case policy == "exact" && lost:
					if rec.Leader != "" {
						t.Fatalf("partition 0 after a came back from a power loss: %+v; want it to wait", rec)
					}
				default:
					if rec.Leader != id("b") {
						t.Fatalf("partition 0: %+v; b leads it on", rec)
					}
				}
			})
		}
	}
}

// TestTransferOrReclaim: a leader whose transfer's outcome it does not
// know leads again only by a reclaim on the same leader epoch, so exactly
// one of the two commits, whichever order the log puts them in.
func TestTransferOrReclaim(t *testing.T) {
	for _, reclaimFirst := range []bool{false, true} {
		mc := newMachine(t, 2)
		ep := mc.join("a", "b")
		mc.partitionsOf(1, 2, 1, "a", "b")
		e := mc.m.Partitions[0].LeaderEpoch
		transfer := command{Op: opTransfer, Name: "a", ID: id("a"), Epoch: ep["a"], Partitions: []PartitionChange{{P: 0, LeaderEpoch: e, To: id("b")}}}
		reclaim := command{Op: opReclaim, Name: "a", ID: id("a"), Epoch: ep["a"], Partitions: []PartitionChange{{P: 0, LeaderEpoch: e}}}
		first, second := transfer, reclaim
		if reclaimFirst {
			first, second = reclaim, transfer
		}
		if res := mc.step(first); res.Err != "" {
			t.Fatalf("%s first: %s", first.Op, res.Err)
		}
		if res := mc.step(second); res.Err == "" {
			t.Fatalf("%s after %s committed too: %+v", second.Op, first.Op, mc.m.Partitions[0])
		}
		want := id("b")
		if reclaimFirst {
			want = id("a")
		}
		if rec := mc.m.Partitions[0]; rec.Leader != want || rec.LeaderEpoch != e+1 {
			t.Fatalf("reclaim first %v: %+v; want %s at %d", reclaimFirst, rec, want, e+1)
		}
	}
}

// TestPartitionLostWithItsDisk: the only in-sync replica of a partition
// comes back under a new ID (its data directory is gone). The partition
// lost acknowledged records: it gets a tombstone, the new ID takes the old
// one's place among the replicas, out of sync, and a live replica leads.
func TestPartitionLostWithItsDisk(t *testing.T) {
	mc := newMachine(t, 2)
	ep := mc.join("a", "b")
	mc.partitionsOf(1, 2, 1, "a", "b")
	p0 := mc.m.Partitions[0]
	mc.step(command{Op: opISR, Name: "a", ID: id("a"), Epoch: ep["a"],
		Partitions: []PartitionChange{{P: 0, Version: p0.Version, LeaderEpoch: p0.LeaderEpoch, ISR: p0.ISR[:1]}}})
	mc.step(command{Op: opEnd, Name: "a", Epoch: ep["a"]})
	mc.step(command{Op: opAdd, Name: "a", ID: "id-a2", At: 42})
	rec := mc.m.Partitions[0]
	if rec.Tombstone != 42 || rec.Leader != id("b") || !slices.Equal(rec.Replicas, []string{"id-a2", id("b")}) || rec.inSync("id-a2") {
		t.Fatalf("partition 0 after its only in-sync replica lost its disk: %+v", rec)
	}
}

// TestPartitionCommandsRefused: commands that would break an invariant,
// or that were based on a stale read, are refused with a reason and
// change nothing.
func TestPartitionCommandsRefused(t *testing.T) {
	mc := newMachine(t, 3)
	ep := mc.join("a", "b", "c")
	mc.do(command{Op: opAdd, Name: "d", ID: id("d")}) // added, never started
	if res := mc.do(command{Op: opTransfer, Name: "a", ID: id("a"), Epoch: ep["a"]}); !strings.Contains(res.Err, "no partitions") {
		t.Fatalf("transfer before partitions: %q", res.Err)
	}
	for _, n := range []int{0, 3} {
		c := command{Op: opPartitions, MinInsync: 1}
		for i := range n {
			c.Partitions = append(c.Partitions, PartitionChange{P: i, Replicas: []string{id("a")}})
		}
		if res := mc.do(c); res.Err == "" {
			t.Fatalf("%d partitions accepted", n)
		}
	}
	mc.partitionsOf(4, 3, 2, "a", "b", "c")
	p0 := mc.m.Partitions[0] // a, b, c; a leads
	lead := func(op string, ch PartitionChange) command {
		return command{Op: op, Name: "a", ID: id("a"), Epoch: ep["a"], Partitions: []PartitionChange{ch}}
	}
	bad := []struct {
		name string
		c    command
		want string
	}{
		{"partitions twice", command{Op: opPartitions, MinInsync: 1, Partitions: []PartitionChange{{P: 0, Replicas: []string{id("a")}}}}, "already"},
		{"transfer by a non-leader", command{Op: opTransfer, Name: "b", ID: id("b"), Epoch: ep["b"], Partitions: []PartitionChange{{P: 0, LeaderEpoch: p0.LeaderEpoch, To: id("c")}}}, "does not lead"},
		{"transfer at an old leader epoch", lead(opTransfer, PartitionChange{P: 0, LeaderEpoch: p0.LeaderEpoch - 1, To: id("b")}), "does not lead"},
		{"transfer from an ended epoch", command{Op: opTransfer, Name: "a", ID: id("a"), Epoch: ep["a"] - 1, Partitions: []PartitionChange{{P: 0, LeaderEpoch: p0.LeaderEpoch, To: id("b")}}}, "not live"},
		{"transfer to a replica never started", lead(opTransfer, PartitionChange{P: 0, LeaderEpoch: p0.LeaderEpoch, To: id("d")}), "not in sync"},
		{"transfer to itself", lead(opTransfer, PartitionChange{P: 0, LeaderEpoch: p0.LeaderEpoch, To: id("a")}), "no target"},
		{"transfer out of range", lead(opTransfer, PartitionChange{P: 9, LeaderEpoch: 1, To: id("b")}), "out of range"},
		{"isr without the leader", lead(opISR, PartitionChange{P: 0, Version: p0.Version, LeaderEpoch: p0.LeaderEpoch, ISR: p0.ISR[1:]}), "leader"},
		{"isr at a stale version", lead(opISR, PartitionChange{P: 0, Version: p0.Version - 1, LeaderEpoch: p0.LeaderEpoch, ISR: p0.ISR[:2]}), "version"},
		{"isr re-stamping an entry", lead(opISR, PartitionChange{P: 0, Version: p0.Version, LeaderEpoch: p0.LeaderEpoch, ISR: []Incarnation{p0.ISR[0], {id("b"), ep["b"] + 7}}}), "admitted in epoch"},
		{"isr naming a member twice", lead(opISR, PartitionChange{P: 0, Version: p0.Version, LeaderEpoch: p0.LeaderEpoch, ISR: []Incarnation{p0.ISR[0], p0.ISR[0]}}), "twice"},
		{"replicas dropping an in-sync member", command{Op: opReplicas, Partitions: []PartitionChange{{P: 0, Version: p0.Version, Replicas: []string{id("a"), id("b")}}}}, "would leave"},
		{"replicas naming a stranger", command{Op: opReplicas, Partitions: []PartitionChange{{P: 0, Version: p0.Version, Replicas: []string{id("a"), id("b"), id("c"), "id-x"}}}}, "no member"},
		{"replicas over the setting", command{Op: opReplicas, Partitions: []PartitionChange{{P: 0, Version: p0.Version, Replicas: []string{id("a"), id("b"), id("c"), id("d"), id("a")}}}}, "want 1 to 4"},
	}
	for _, tt := range bad {
		before := mc.m
		res := mc.do(tt.c)
		if !strings.Contains(res.Err, tt.want) {
			t.Errorf("%s: %q; want a refusal naming %q", tt.name, res.Err, tt.want)
		}
		if mc.m != before {
			t.Errorf("%s changed the map", tt.name)
		}
	}
	// A learner: d joins partition 0's replicas (out of sync), then is
	// admitted once started.
	mc.step(command{Op: opReplicas, Partitions: []PartitionChange{{P: 0, Version: p0.Version, Replicas: []string{id("a"), id("b"), id("c"), id("d")}}}})
	ed := mc.step(command{Op: opStart, Name: "d", ID: id("d")}).Epoch
	p0 = mc.m.Partitions[0]
	if res := mc.step(lead(opISR, PartitionChange{P: 0, Version: p0.Version, LeaderEpoch: p0.LeaderEpoch, ISR: append(slices.Clone(p0.ISR), Incarnation{id("d"), ed})})); res.Err != "" {
		t.Fatalf("admit the learner: %s", res.Err)
	}
}

// TestPartitionInvariantsUnderRandomCommands applies long random runs of
// every command that moves members and partitions, well formed or stale,
// and checks the map's invariants and every change's after each (see
// checkStep). Replaying a run's log gives the same map (the state machine
// reads nothing else), and a snapshot keeps it.
func TestPartitionInvariantsUnderRandomCommands(t *testing.T) {
	runs, steps := 40, 1500
	if testing.Short() {
		runs = 8
	}
	names := []string{"a", "b", "c", "d", "e"}
	for run := range runs {
		rng := rand.New(rand.NewPCG(uint64(run), 7))
		policy := "exact"
		if run%4 == 3 {
			policy = "available"
		}
		replicas := 2 + run%2
		mc := newMachine(t, replicas)
		mc.m.Settings.Policy = policy
		mc.join(names[:3]...)
		mc.partitionsOf(8, replicas, 1, names[:3]...)
		var log []command
		ids := map[string]string{}
		for _, n := range names {
			ids[n] = id(n)
		}
		pick := func() string { return names[rng.IntN(len(names))] }
		for s := range steps {
			var c command
			name := pick()
			x, found := mc.m.Member(name)
			switch k := rng.IntN(10); {
			case k == 0:
				c = command{Op: opAdd, Name: name, ID: ids[name], At: int64(s)}
				if found && !x.Live && rng.IntN(4) == 0 {
					ids[name] = fmt.Sprintf("id-%s-%d", name, s) // lost its disk
					c.ID = ids[name]
				}
			case k <= 2:
				c = command{Op: opStart, Name: name, ID: x.ID, MayHaveLost: rng.IntN(6) == 0}
			case k == 3:
				c = command{Op: opEnd, Name: name, Epoch: x.Epoch, Graceful: rng.IntN(2) == 0}
				for p := range mc.m.Partitions {
					if rng.IntN(2) == 0 {
						c.Partitions = append(c.Partitions, PartitionChange{P: p, To: ids[pick()]})
					}
				}
			case k == 4:
				c = command{Op: opForget, Name: name, At: int64(s)}
			case k == 5:
				c = command{Op: opReplicas}
				p := rng.IntN(len(mc.m.Partitions))
				rec := mc.m.Partitions[p]
				r := slices.Clone(rec.Replicas)
				if rng.IntN(2) == 0 && len(r) > 1 {
					r = r[:len(r)-1]
				} else {
					r = append(r, ids[pick()])
				}
				c.Partitions = []PartitionChange{{P: p, Version: rec.Version - uint64(rng.IntN(2)), Replicas: r}}
			default:
				// A leader's command on some of the partitions it
				// leads, mostly fresh, sometimes stale.
				c = command{Op: []string{opTransfer, opReclaim, opISR, opISR}[rng.IntN(4)], Name: name, ID: x.ID, Epoch: x.Epoch}
				for p, rec := range mc.m.Partitions {
					if rec.Leader != x.ID && rng.IntN(8) != 0 {
						continue
					}
					ch := PartitionChange{P: p, Version: rec.Version, LeaderEpoch: rec.LeaderEpoch - uint64(rng.IntN(5)/4), To: ids[pick()]}
					if c.Op == opISR {
						for _, rid := range rec.Replicas {
							y, _ := mc.m.MemberByID(rid)
							switch {
							case rec.inSync(rid) && (rid == rec.Leader || rng.IntN(3) > 0):
								ch.ISR = append(ch.ISR, rec.ISR[rec.isrIndex(rid)])
							case !rec.inSync(rid) && rng.IntN(2) == 0:
								// Sometimes an earlier epoch's progress.
								ch.ISR = append(ch.ISR, Incarnation{rid, y.Epoch - uint64(rng.IntN(3)/2)})
							}
						}
					}
					c.Partitions = append(c.Partitions, ch)
				}
			}
			mc.step(c)
			log = append(log, c)
		}
		// Replay.
		re := newMachine(t, replicas)
		re.m.Settings.Policy = policy
		re.join(names[:3]...)
		re.partitionsOf(8, replicas, 1, names[:3]...)
		for _, c := range log {
			re.do(c)
		}
		if !reflect.DeepEqual(re.m, mc.m) {
			t.Fatalf("run %d: replaying the log gave another map", run)
		}
		// A Raft snapshot keeps every record.
		b, err := json.Marshal(mc.m)
		if err != nil {
			t.Fatal(err)
		}
		var back Map
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.Partitions, mc.m.Partitions) {
			t.Fatalf("run %d: the map's partitions do not survive a snapshot (%v)", run, err)
		}
	}
}

// TestGracefulEndGoesToTargets: a graceful end hands each partition the
// member led to the target it names, when that target may lead (a live
// in-sync replica), and else to the first live in-sync replica.
func TestGracefulEndGoesToTargets(t *testing.T) {
	mc := newMachine(t, 3)
	ep := mc.join("a", "b", "c")
	mc.partitionsOf(4, 3, 1, "a", "b", "c")
	led := mc.led("a") // 0 (a, b, c) and 3 (a, b, c)
	if !slices.Equal(led, []int{0, 3}) {
		t.Fatalf("a leads %v; want [0 3]", led)
	}
	// Partition 0 goes to its last replica, c, which the order alone
	// would not pick; partition 3 names a target that is not a replica.
	end := command{Op: opEnd, Name: "a", Epoch: ep["a"], Graceful: true, Partitions: []PartitionChange{
		{P: 0, To: id("c")}, {P: 3, To: "id-x"}}}
	mc.step(end)
	for _, tt := range []struct {
		p    int
		want string
	}{{0, id("c")}, {3, id("b")}} {
		rec := mc.m.Partitions[tt.p]
		if rec.Leader != tt.want || rec.LeaderEpoch != 2 || rec.inSync(id("a")) {
			t.Errorf("partition %d after a's graceful end: %+v; want %s to lead at epoch 2, a out of sync", tt.p, rec, tt.want)
		}
	}
}

// TestMapReaders: the data plane's reads of the map name the leader of a
// key's partition and the partitions a member leads, and say when a
// partition has none (it waits) or the map has no partitions.
func TestMapReaders(t *testing.T) {
	mc := newMachine(t, 1)
	var none *Map
	if _, _, ok := none.LeaderOf("k"); ok {
		t.Errorf("LeaderOf on a nil map: ok")
	}
	ep := mc.join("a", "b")
	if p, name, ok := mc.m.LeaderOf("k"); ok || p != 0 || name != "" {
		t.Errorf("LeaderOf(k) without partitions = %d, %q, %v; want 0, \"\", false", p, name, ok)
	}
	mc.partitionsOf(8, 1, 1, "a", "b") // even partitions on a, odd ones on b
	for p := range 8 {
		want := []string{"a", "b"}[p%2]
		if name, ok := mc.m.PartitionLeader(p); !ok || name != want {
			t.Errorf("PartitionLeader(%d) = %q, %v; want %s", p, name, ok, want)
		}
	}
	for _, p := range []int{-1, 8} {
		if name, ok := mc.m.PartitionLeader(p); ok {
			t.Errorf("PartitionLeader(%d) of 8 = %q, true; want false", p, name)
		}
	}
	if got := mc.m.Led(id("b")); !slices.Equal(got, []int{1, 3, 5, 7}) {
		t.Errorf("Led(b) = %v; want [1 3 5 7]", got)
	}
	if got := mc.m.Led(id("x")); len(got) != 0 {
		t.Errorf("Led of a stranger = %v; want none", got)
	}
	seen := make(map[int]bool)
	for i := range 200 {
		key := fmt.Sprintf("key-%d", i)
		p, name, ok := mc.m.LeaderOf(key)
		q, _, _ := mc.m.Partition(key)
		if !ok || p != q || name != []string{"a", "b"}[p%2] {
			t.Fatalf("LeaderOf(%q) = %d, %q, %v; want partition %d and its leader", key, p, name, ok, q)
		}
		seen[p] = true
	}
	if len(seen) != 8 {
		t.Errorf("200 keys fell in %d partitions of 8", len(seen))
	}
	// a crashes: its partitions, in sync on a alone, wait.
	mc.step(command{Op: opEnd, Name: "a", Epoch: ep["a"]})
	if name, ok := mc.m.PartitionLeader(0); ok {
		t.Errorf("PartitionLeader(0) while it waits for a = %q, true; want false", name)
	}
	for i := range 200 {
		key := fmt.Sprintf("key-%d", i)
		if p, name, ok := mc.m.LeaderOf(key); p%2 == 0 && ok {
			t.Fatalf("LeaderOf(%q), partition %d waiting for a = %q, true; want false", key, p, name)
		}
	}
	if got := mc.m.Led(id("a")); len(got) != 0 {
		t.Errorf("Led(a) after its epoch ended = %v; want none", got)
	}
}
