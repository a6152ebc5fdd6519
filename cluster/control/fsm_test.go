package control

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// machine applies commands to a map as the state machine does, with Raft
// indexes counting from 1.
type machine struct {
	t     *testing.T
	m     *Map
	index uint64
}

func newMachine(t *testing.T, replicas int) *machine {
	mc := &machine{t: t, m: &Map{}}
	mc.must(command{Op: opInit, ClusterID: "c1", Settings: Settings{Replicas: replicas, Policy: "exact", Lease: 2 * time.Second}})
	return mc
}

// do applies c and returns its result; a refused command leaves the map.
func (mc *machine) do(c command) Result {
	mc.index++
	next, res := apply(mc.m, c, mc.index)
	if next != nil {
		mc.m = next
	}
	return res
}

func (mc *machine) must(c command) Result {
	mc.t.Helper()
	res := mc.do(c)
	if res.Err != "" {
		mc.t.Fatalf("apply %+v: %s", c, res.Err)
	}
	return res
}

func (mc *machine) member(name string) Member {
	mc.t.Helper()
	x, ok := mc.m.Member(name)
	if !ok {
		mc.t.Fatalf("no member %s in %+v", name, mc.m.Members)
	}
	return x
}

// join adds and starts members, each with ID "id-<name>", and returns
// their epochs.
func (mc *machine) join(names ...string) map[string]uint64 {
	out := make(map[string]uint64)
	for _, n := range names {
		mc.must(command{Op: opAdd, Name: n, ID: "id-" + n})
		out[n] = mc.must(command{Op: opStart, Name: n, ID: "id-" + n}).Epoch
	}
	return out
}

// syncAll records every live member's synced mark at the current change.
func (mc *machine) syncAll() {
	for _, x := range mc.m.LiveMembers() {
		mc.must(command{Op: opSynced, Name: x.Name, Epoch: x.Epoch, Version: mc.m.Changed})
	}
}

// TestReleasable: an epoch's end leaves its keys to their standbys only
// if its synced mark covers the last membership change; so when a key's
// owner and standby end one after the other, the second end is never
// releasable unless it synced again in between (the double fault that
// took keys over from no copy in the old protocol).
func TestReleasable(t *testing.T) {
	mc := newMachine(t, 2)
	e := mc.join("a", "b", "c")
	mc.syncAll()
	mc.must(command{Op: opEnd, Name: "a", Epoch: e["a"]})
	if got := mc.member("a"); got.Live || !got.Releasable {
		t.Fatalf("a after its end with a current synced mark: %+v; want ended, releasable", got)
	}
	mc.must(command{Op: opEnd, Name: "b", Epoch: e["b"]})
	if got := mc.member("b"); got.Releasable {
		t.Fatalf("b ended after a's end without syncing again: %+v; want not releasable", got)
	}

	mc = newMachine(t, 2)
	e = mc.join("a", "b", "c")
	mc.syncAll()
	mc.must(command{Op: opEnd, Name: "a", Epoch: e["a"]})
	mc.syncAll() // b and c bring their standbys up to date after a's end
	mc.must(command{Op: opEnd, Name: "b", Epoch: e["b"]})
	if got := mc.member("b"); !got.Releasable {
		t.Fatalf("b ended after syncing since a's end: %+v; want releasable", got)
	}
}

// TestReleasableOneReplica: with one replica an epoch's end is releasable
// only after the member left phase joined and handed everything over.
func TestReleasableOneReplica(t *testing.T) {
	mc := newMachine(t, 1)
	e := mc.join("a", "b")
	mc.syncAll()
	mc.must(command{Op: opEnd, Name: "a", Epoch: e["a"]})
	if mc.member("a").Releasable {
		t.Fatalf("a ended in phase joined with one replica: releasable; want not (its keys have no copy)")
	}
	e["a"] = mc.must(command{Op: opStart, Name: "a", ID: "id-a"}).Epoch
	mc.must(command{Op: opLeaving, Name: "a", Epoch: e["a"]})
	mc.must(command{Op: opSynced, Name: "a", Epoch: e["a"], Version: mc.m.Changed})
	mc.must(command{Op: opEnd, Name: "a", Epoch: e["a"], Graceful: true})
	if got := mc.member("a"); !got.Releasable || got.Phase != PhaseLeaving {
		t.Fatalf("a ended after leaving and handing over: %+v; want releasable, leaving", got)
	}
}

// TestSyncedVacuous: a synced mark made while no other member is live
// copies nothing, so it does not count: a member alone ends unreleasable.
func TestSyncedVacuous(t *testing.T) {
	mc := newMachine(t, 2)
	e := mc.join("a", "b")
	mc.syncAll()
	mc.must(command{Op: opEnd, Name: "b", Epoch: e["b"]})
	mc.must(command{Op: opSynced, Name: "a", Epoch: e["a"], Version: mc.m.Changed})
	mc.must(command{Op: opEnd, Name: "a", Epoch: e["a"]})
	if mc.member("a").Releasable {
		t.Fatalf("a, alone when it synced, ended releasable; want not")
	}
}

// TestEpochs: epochs only grow, a start ends the live epoch of the same
// member (its previous process), an end applies to the epoch it names only
// (compare-and-set), and a stale synced mark is refused.
func TestEpochs(t *testing.T) {
	mc := newMachine(t, 2)
	e := mc.join("a", "b")
	if e["b"] <= e["a"] {
		t.Fatalf("epochs %v; want increasing", e)
	}
	again := mc.must(command{Op: opStart, Name: "a", ID: "id-a"}).Epoch
	if again <= e["b"] || !mc.member("a").Live || mc.member("a").Epoch != again {
		t.Fatalf("restart of a: epoch %d, member %+v; want a new live epoch above %d", again, mc.member("a"), e["b"])
	}
	if res := mc.do(command{Op: opEnd, Name: "a", Epoch: e["a"]}); res.Err == "" || !mc.member("a").Live {
		t.Fatalf("end of a's old epoch %d: %+v, member %+v; want refused, a still live", e["a"], res, mc.member("a"))
	}
	if res := mc.do(command{Op: opSynced, Name: "b", Epoch: e["b"], Version: mc.m.Changed - 1}); res.Err == "" {
		t.Fatalf("synced at a version older than the last change: accepted; want refused")
	}
	if res := mc.do(command{Op: opStart, Name: "a", ID: "other"}); res.Err == "" {
		t.Fatalf("start under another ID: accepted; want refused")
	}
}

// TestForget: a member is forgotten only once its epoch ended; without
// complete copies it leaves a tombstone; a new ID for a name waits for the
// old epoch to end and, after an unreleasable end, is marked Lost.
func TestForget(t *testing.T) {
	mc := newMachine(t, 2)
	e := mc.join("a", "b", "c")
	if res := mc.do(command{Op: opForget, Name: "a"}); res.Err == "" {
		t.Fatalf("forget a live member: accepted; want refused")
	}
	mc.must(command{Op: opEnd, Name: "a", Epoch: e["a"]}) // never synced: not releasable
	mc.must(command{Op: opForget, Name: "a", At: 42})
	if got := mc.member("a"); got.Phase != PhaseLeft {
		t.Fatalf("a after forget: %+v; want left", got)
	}
	// The ring of the moment: b and c up, so neither passes.
	ring := []RingMember{{Name: "b"}, {Name: "c"}}
	if want := []Tombstone{{Name: "a", ID: "id-a", At: 42, Ring: ring}}; !reflect.DeepEqual(mc.m.Tombstones, want) {
		t.Fatalf("tombstones %+v; want %+v", mc.m.Tombstones, want)
	}
	if res := mc.do(command{Op: opDrop, At: 42 + int64(tombstoneLife) - 1}); len(mc.m.Tombstones) != 1 {
		t.Fatalf("drop before the tombstone's life: %+v, %d left; want 1", res, len(mc.m.Tombstones))
	}
	mc.must(command{Op: opDrop, At: 42 + int64(tombstoneLife)})
	if len(mc.m.Tombstones) != 0 {
		t.Fatalf("drop after the tombstone's life: %d left; want 0", len(mc.m.Tombstones))
	}

	if res := mc.do(command{Op: opAdd, Name: "b", ID: "new-b"}); res.Err == "" {
		t.Fatalf("a new ID for b while its epoch is live: accepted; want refused")
	}
	mc.must(command{Op: opEnd, Name: "b", Epoch: e["b"]})
	mc.must(command{Op: opAdd, Name: "b", ID: "new-b"})
	if got := mc.member("b"); got.ID != "new-b" || !got.Lost || got.Releasable {
		t.Fatalf("b back under a new ID after an unreleasable end: %+v; want the new ID, lost", got)
	}
}

// TestSnapshotRoundTrip: a snapshot restores the same map.
func TestSnapshotRoundTrip(t *testing.T) {
	mc := newMachine(t, 2)
	mc.join("a", "b")
	mc.syncAll()
	f := newFSM(nil)
	f.publish(mc.m)
	snap, _ := f.Snapshot()
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := newFSM(nil)
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if got := g.cur.Load(); !reflect.DeepEqual(got, mc.m) {
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(mc.m)
		t.Fatalf("restored %s; want %s", a, b)
	}
}

type memSink struct{ bytes.Buffer }

func (*memSink) ID() string    { return "mem" }
func (*memSink) Cancel() error { return nil }
func (*memSink) Close() error  { return nil }

var _ raft.SnapshotSink = (*memSink)(nil)
