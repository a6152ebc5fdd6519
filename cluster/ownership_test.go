package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster/control"
)

// member is a map member for the tests: joined, live at epoch unless
// ended, ended ones releasable when rel.
type member struct {
	name  string
	epoch uint64
	ended bool
	rel   bool
	phase control.Phase
}

// testMap builds a cluster map at membership change changed.
func testMap(changed uint64, ms ...member) *control.Map {
	m := &control.Map{Version: changed, Changed: changed, ClusterID: "c"}
	for _, x := range ms {
		if x.phase == 0 {
			x.phase = control.PhaseJoined
		}
		m.Members = append(m.Members, control.Member{Name: x.name, ID: "id-" + x.name, Phase: x.phase, Epoch: x.epoch,
			Live: !x.ended, Releasable: x.rel})
	}
	return m
}

func live(name string, epoch uint64) member { return member{name: name, epoch: epoch} }
func ended(name string, rel bool) member    { return member{name: name, epoch: 1, ended: true, rel: rel} }

// keysOwnedBy returns n keys whose owner in c is name; it fails the test
// if there are not n in the first million.
func keysOwnedBy(t testing.TB, c *config, name string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n && i < 1_000_000; i++ {
		if k := fmt.Sprintf("k%d", i); c.owner(k) == name {
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("found %d of %d keys owned by %s", len(keys), n, name)
	}
	return keys
}

// keysOrdered returns n keys of c whose order starts with the given
// names; it fails the test if there are not n in the first million.
func keysOrdered(t testing.TB, c *config, n int, first ...string) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n && i < 1_000_000; i++ {
		k := fmt.Sprintf("k%d", i)
		o := c.order(k)
		ok := true
		for j, f := range first {
			ok = ok && o[j] == f
		}
		if ok {
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("found %d of %d keys ordered %v", len(keys), n, first)
	}
	return keys
}

// TestActingWalk: a key is decided by the first member of its order that
// is up, past the members whose epoch ended with complete copies (their
// standbys hold the keys); a member that ended without them stops the walk
// (owner down), unless the policy is available. With the owner and its
// standby both ended, the key waits: the second end came after the first
// and its copies are not complete (the map says so), whichever ended
// first.
func TestActingWalk(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   Policy
		a, b     member
		want     string // acting member, "" for none
		wantWait string
	}{
		{"owner up", PolicyExact, live("a", 1), live("b", 2), "a", ""},
		{"owner ended with copies", PolicyExact, ended("a", true), live("b", 2), "b", ""},
		{"owner ended without copies", PolicyExact, ended("a", false), live("b", 2), "", "a"},
		{"owner ended without copies, available", PolicyAvailable, ended("a", false), live("b", 2), "b", ""},
		{"owner and standby ended, standby without copies", PolicyExact, ended("a", true), ended("b", false), "", "b"},
		{"owner and standby ended, owner without copies", PolicyExact, ended("a", false), ended("b", true), "", "a"},
		{"both ended with copies", PolicyExact, ended("a", true), ended("b", true), "c", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConfig("c", tc.policy, 2, testMap(5, tc.a, tc.b, live("c", 3), live("d", 4)))
			for _, k := range keysOrdered(t, c, 10, "a", "b", "c") {
				got, wait, err := c.acting(k)
				if got != tc.want || wait != tc.wantWait {
					t.Fatalf("acting(%s) = %q, waiting on %q (%v); want %q, waiting on %q", k, got, wait, err, tc.want, tc.wantWait)
				}
				if tc.want == "" && !errors.Is(err, ErrOwnerDown) {
					t.Fatalf("acting(%s) error %v; want ErrOwnerDown", k, err)
				}
			}
		})
	}
}

// TestStandby: a key's standby is the first member up after its acting
// member, and none without standbys.
func TestStandby(t *testing.T) {
	c := newConfig("a", PolicyExact, 2, testMap(5, live("a", 1), ended("b", true), live("c", 3)))
	for _, k := range keysOrdered(t, c, 10, "a", "b", "c") {
		if got := c.standby(k); got != "c" {
			t.Fatalf("standby(%s) with b ended = %q; want c", k, got)
		}
	}
	for _, k := range keysOrdered(t, c, 10, "b", "a", "c") {
		if a, sb := c.actingName(k), c.standby(k); a != "a" || sb != "c" {
			t.Fatalf("acting, standby(%s of ended b) = %q, %q; want a, c", k, a, sb)
		}
	}
	one := newConfig("a", PolicyExact, 1, testMap(5, live("a", 1), live("c", 3)))
	if got := one.standby("k1"); got != "" {
		t.Fatalf("standby with one replica = %q; want none", got)
	}
}

// TestCopyOf: what a write's copies ask of each record, with the key hashed
// once, agrees with acting and standbyAfter for every member, whoever is
// down, leaving or ended.
func TestCopyOf(t *testing.T) {
	maps := []*control.Map{
		testMap(5, live("a", 1), live("b", 2), live("c", 3)),
		testMap(6, live("a", 1), ended("b", true), live("c", 3)),
		testMap(7, live("a", 1), ended("b", false), live("c", 3), live("d", 4)),
		testMap(8, live("a", 1), member{name: "b", epoch: 2, phase: control.PhaseLeaving}, live("c", 3)),
		testMap(9, live("a", 1), member{name: "b", epoch: 2, phase: control.PhaseLeaving, ended: true}, live("c", 3)),
		testMap(10, live("a", 1)),
	}
	for mi, m := range maps {
		for _, replicas := range []int{1, 2} {
			for _, policy := range []Policy{PolicyExact, PolicyAvailable} {
				for _, self := range []string{"a", "b", "c", "d"} {
					c := newConfig(self, policy, replicas, m)
					for i := range 500 {
						k := fmt.Sprintf("k%d", i)
						acting, sb := c.copyOf(k, self)
						wantActing := c.actingName(k) == self
						wantSB := ""
						if wantActing {
							wantSB = c.standbyAfter(k, self)
						}
						if acting != wantActing || sb != wantSB {
							t.Fatalf("map %d, replicas %d, %s, self %s: copyOf(%s) = %v, %q; want %v, %q",
								mi, replicas, policy, self, k, acting, sb, wantActing, wantSB)
						}
					}
				}
			}
		}
	}
}

// TestOwnershipGainWaitsForHandoff: a key a node gains (another member's
// epoch ended, its copies complete) is decided only once every live member
// sent its complete for the new configuration; keys it held all along are
// decided at once.
func TestOwnershipGainWaitsForHandoff(t *testing.T) {
	c1 := newConfig("a", PolicyExact, 1, testMap(5, live("a", 1), live("b", 2), live("c", 3)))
	o := (&ownership{}).next(c1, 1)
	for _, n := range []string{"b", "c"} {
		o = o.with(n, complete{epoch: c1.epochs[n], config: c1.id})
	}
	if !o.settled {
		t.Fatalf("settled = false after every complete; waiting for %v", o.waitingFor)
	}
	// c leaves with its keys handed over (phase leaving, then ended
	// releasable): its keys move, some to a.
	c2 := newConfig("a", PolicyExact, 1, testMap(9, live("a", 1), live("b", 2), member{name: "c", epoch: 3, phase: control.PhaseLeaving}))
	o = o.next(c2, 1)
	held := keysOwnedBy(t, c1, "a", 5)
	var gained []string
	for _, k := range keysOwnedBy(t, c1, "c", 40) {
		if c2.actingName(k) == "a" {
			gained = append(gained, k)
		}
	}
	if len(gained) == 0 {
		t.Fatal("no key of c goes to a")
	}
	for _, k := range held {
		if err := o.gate(k); err != nil {
			t.Fatalf("gate(%s, held all along) = %v; want nil", k, err)
		}
	}
	for _, step := range []struct {
		from string
		want bool // gained keys decidable after this complete
	}{{"b", false}, {"c", true}} {
		for _, k := range gained {
			if err := o.gate(k); err == nil {
				t.Fatalf("gate(%s, gained from c) before %s's complete = nil; want an error", k, step.from)
			}
		}
		o = o.with(step.from, complete{epoch: c2.epochs[step.from], config: c2.id})
		for _, k := range gained {
			if err := o.gate(k); (err == nil) != step.want {
				t.Fatalf("gate(%s) after %s's complete = %v; want decidable %v", k, step.from, err, step.want)
			}
		}
	}
	if !o.settled {
		t.Fatalf("settled = false after every complete; waiting for %v", o.waitingFor)
	}
	// A complete for another configuration, or from another epoch, counts
	// for nothing.
	o2 := (&ownership{}).next(c1, 1).next(c2, 1)
	o2 = o2.with("b", complete{epoch: 2, config: c1.id})
	o2 = o2.with("c", complete{epoch: 99, config: c2.id})
	if o2.settled {
		t.Fatal("settled with completes of another configuration and another epoch; want waiting")
	}
}

// TestOwnershipHolderDownWaits: a node that gains a key from a member whose
// epoch ended without complete copies (it crashed before handing the key
// over) does not decide it: the key waits for that member, under the exact
// policy. With copies complete, it goes on once the live members complete.
func TestOwnershipHolderDownWaits(t *testing.T) {
	c1 := newConfig("a", PolicyExact, 2, testMap(5, live("a", 1), live("b", 2), live("c", 3)))
	o := (&ownership{}).next(c1, 1)
	for _, n := range []string{"b", "c"} {
		o = o.with(n, complete{epoch: c1.epochs[n], config: c1.id})
	}
	o.promoted = c1.id
	for _, rel := range []bool{false, true} {
		c2 := newConfig("a", PolicyExact, 2, testMap(9, live("a", 1), ended("b", rel), live("c", 3)))
		o2 := o.next(c2, 1)
		o2 = o2.with("c", complete{epoch: 3, config: c2.id})
		o2.promoted = c2.id
		var gained string
		for _, k := range keysOrdered(t, c1, 50, "b", "a") {
			gained = k
			break
		}
		_, err := o2.gateHistory(gained)
		if rel && err != nil {
			t.Fatalf("b ended with copies: gate(%s) = %v; want nil", gained, err)
		}
		if !rel {
			// b ended without copies: its keys wait for it, so a does not
			// act for them at all.
			if name := c2.actingName(gained); name != "" {
				t.Fatalf("b ended without copies: %s acts for its key %s; want nobody", name, gained)
			}
		}
	}
}

// TestOwnershipFreshEpoch: a node in a new epoch held nothing: every key it
// acts for waits for every live member's complete, and for a member down
// without copies that may hold it.
func TestOwnershipFreshEpoch(t *testing.T) {
	c := newConfig("a", PolicyExact, 1, testMap(9, live("a", 4), live("b", 2), ended("c", false)))
	o := (&ownership{}).next(c, 4)
	keys := keysOrdered(t, c, 5, "a", "b")
	for _, k := range keys {
		if err := o.gate(k); err == nil {
			t.Fatalf("fresh epoch: gate(%s) before b's complete = nil; want an error", k)
		}
	}
	o = o.with("b", complete{epoch: 2, config: c.id})
	for _, k := range keys {
		if err := o.gate(k); err != nil {
			t.Fatalf("fresh epoch: gate(%s) after b's complete = %v; want nil", k, err)
		}
	}
	for _, k := range keysOrdered(t, c, 5, "a", "c") {
		if err := o.gate(k); !errors.Is(err, ErrOwnerDown) {
			t.Fatalf("fresh epoch: gate(%s), which c may hold (down, no copies) = %v; want ErrOwnerDown", k, err)
		}
	}
	if o.settled {
		t.Fatal("settled while c, down without copies, may hold keys; want waiting")
	}
}

// TestOwnershipLost: a node back under a new ID after an epoch that ended
// without complete copies waits for every member of the ring, which may
// keep a copy of its keys.
func TestOwnershipLost(t *testing.T) {
	m := testMap(9, live("a", 5), live("b", 2), ended("c", true))
	m.Members[0].Lost = true
	c := newConfig("a", PolicyExact, 2, m)
	o := (&ownership{}).next(c, 5)
	o = o.with("b", complete{epoch: 2, config: c.id})
	o.promoted = c.id
	k := keysOrdered(t, c, 1, "a", "b")[0]
	if _, err := o.gateHistory(k); !errors.Is(err, ErrOwnerDown) {
		t.Fatalf("lost node, c down: gate(%s) = %v; want ErrOwnerDown (waiting for c)", k, err)
	}
}

// TestPenalties: a tombstone bears on the keys its forgotten member held
// when it was forgotten, judged on the ring of that moment, whoever
// decides them: a member below it, a member that joined since and ranks
// above it, or one that had left and came back. Keys that a member up
// then acted for carry no penalty, and neither do the forgotten member's
// keys on the forgotten member itself, back with its old data.
func TestPenalties(t *testing.T) {
	seen := func(m *control.Map) map[control.TombstoneKey]time.Time {
		return map[control.TombstoneKey]time.Time{m.Tombstones[0].Key(): time.Unix(100, 0)}
	}
	// z forgotten beside a (up), b (up) and p (down with complete copies:
	// keys walk past it). n joins later; it was not in the ring.
	ring := []control.RingMember{{Name: "a"}, {Name: "b"}, {Name: "p", Passes: true}}
	all := newConfig("a", PolicyExact, 1, testMap(9, live("a", 5), live("b", 2), live("n", 8), live("p", 3), live("z", 7)))
	for _, tc := range []struct {
		order []string // the key's order starts so
		want  bool
	}{
		{[]string{"z", "a"}, true},
		{[]string{"z", "n"}, true},
		{[]string{"n", "z"}, true},       // a member that joined later and ranks above z
		{[]string{"p", "z"}, true},       // the order walked past p to z
		{[]string{"n", "p", "z"}, true},  // both
		{[]string{"a", "z"}, false},      // a acted for it
		{[]string{"n", "b", "z"}, false}, // b acted for it
		{[]string{"p", "a", "z"}, false}, // past p, a acted for it
		{[]string{"n", "a", "p"}, false}, // a acted for it; z ranks lower still
	} {
		keys := keysOrdered(t, all, 5, tc.order...)
		for _, self := range []string{"a", "b", "n"} {
			m := testMap(11, live("a", 5), live("b", 2), live("n", 8), ended("p", true))
			m.Tombstones = []control.Tombstone{{Name: "z", ID: "id-z", At: 1, Ring: ring}}
			c := newConfig(self, PolicyExact, 1, m)
			for _, k := range keys {
				got := c.penalties(k, seen(m))
				if held := len(got) == 1 && got[0].name == "z" && got[0].from.Equal(time.Unix(100, 0)); held != tc.want || len(got) > 1 {
					t.Fatalf("on %s, penalties(%s, ordered %v) = %+v; want z's: %v", self, k, tc.order, got, tc.want)
				}
			}
		}
	}

	// z back under its old ID, with its data: it holds its own hits.
	m := testMap(11, live("a", 5), live("z", 12))
	m.Tombstones = []control.Tombstone{{Name: "z", ID: "id-z", At: 1, Ring: []control.RingMember{{Name: "a"}}}}
	for _, k := range keysOrdered(t, newConfig("z", PolicyExact, 1, m), 5, "z", "a") {
		if got := newConfig("z", PolicyExact, 1, m).penalties(k, seen(m)); len(got) != 0 {
			t.Fatalf("on z back with its data, penalties(%s) = %+v; want none", k, got)
		}
		if got := newConfig("a", PolicyExact, 1, m).penalties(k, seen(m)); len(got) != 1 {
			t.Fatalf("on a, penalties(%s, z first) = %+v; want z's", k, got)
		}
	}

	// A tombstone written without its ring: z must rank before this node.
	m = testMap(9, live("a", 5), live("b", 2))
	m.Tombstones = []control.Tombstone{{Name: "z", ID: "id-z", At: 1}}
	c := newConfig("a", PolicyExact, 1, m)
	withZ := newConfig("a", PolicyExact, 1, testMap(9, live("a", 5), live("b", 2), live("z", 7)))
	for _, k := range keysOrdered(t, withZ, 5, "z", "a") {
		if got := c.penalties(k, seen(m)); len(got) != 1 || got[0].name != "z" {
			t.Fatalf("penalties(%s, z before a, no ring) = %+v; want z's", k, got)
		}
	}
	for _, k := range keysOrdered(t, withZ, 5, "a", "z") {
		if got := c.penalties(k, seen(m)); len(got) != 0 {
			t.Fatalf("penalties(%s, a before z, no ring) = %+v; want none", k, got)
		}
	}
}

// TestStandbyFlipFlop: a standby that lost a key to a member that started,
// and gets it back when that member's epoch ends again, missed every write
// meanwhile: it is not up to date for the key, whatever its earlier mark.
func TestStandbyFlipFlop(t *testing.T) {
	c1 := newConfig("a", PolicyExact, 2, testMap(5, live("a", 1), ended("y", true), live("x", 3)))
	k := keysOrdered(t, c1, 1, "a", "y", "x")[0]
	o := (&ownership{}).next(c1, 1)
	o.synced = map[string]syncMark{"x": {cfg: c1, epoch: 3}}
	if !o.syncedFor(k, "x") {
		t.Fatalf("x brought up to date in c1: syncedFor(%s, x) = false; want true", k)
	}
	c2 := newConfig("a", PolicyExact, 2, testMap(7, live("a", 1), live("y", 4), live("x", 3)))
	o = o.next(c2, 1)
	if sb := c2.standby(k); sb != "y" {
		t.Fatalf("standby(%s) once y started = %q; want y", k, sb)
	}
	c3 := newConfig("a", PolicyExact, 2, testMap(9, live("a", 1), ended("y", true), live("x", 3)))
	o = o.next(c3, 1)
	if o.syncedFor(k, "x") {
		t.Fatalf("x got %s back after y's second end: syncedFor = true; want false (it missed y's stint)", k)
	}
}
