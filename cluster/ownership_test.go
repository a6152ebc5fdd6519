package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// testView builds a view whose roster holds the named owners (incarnation
// 1, joined), with the members in up alive and those in leaving live but
// leaving.
func testView(owners, up, leaving []string) *View {
	var es []RosterEntry
	for _, n := range owners {
		es = append(es, RosterEntry{Name: n, Incarnation: 1, Phase: PhaseJoined})
	}
	for _, n := range leaving {
		es = append(es, RosterEntry{Name: n, Incarnation: 1, Phase: PhaseLeaving})
	}
	var live []Member
	for _, n := range up {
		live = append(live, Member{Name: n, State: StateAlive, Incarnation: 1})
	}
	for _, n := range leaving {
		live = append(live, Member{Name: n, State: StateLeaving, Incarnation: 1})
	}
	v := NewView(1, live)
	v.Roster, _ = (&Roster{}).Merge(es...)
	return v
}

// keysOwnedBy returns keys of c whose owner is name.
func keysOwnedBy(c *config, name string, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if k := fmt.Sprintf("k%d", i); c.owner(k) == name {
			keys = append(keys, k)
		}
	}
	return keys
}

var t0 = time.Unix(1_000_000, 0)

// TestOwnershipCrashKeepsKeys: under the exact policy a down owner keeps
// its keys: nobody acts for them ("owner down"), and nothing else moves.
// Under the available policy the next member in each key's order acts for
// them, but decides them only once the down owner is fenced.
func TestOwnershipCrashKeepsKeys(t *testing.T) {
	all := []string{"a", "b", "c"}
	exact := newConfig("a", PolicyExact, 1, testView(all, []string{"a", "b"}, nil))
	for _, k := range keysOwnedBy(exact, "c", 20) {
		if name, _, err := exact.acting(k); name != "" || !errors.Is(err, ErrOwnerDown) {
			t.Fatalf("exact: acting(%s of down c) = %q, %v; want nobody, ErrOwnerDown", k, name, err)
		}
	}
	for _, k := range keysOwnedBy(exact, "b", 20) {
		if name, _, _ := exact.acting(k); name != "b" {
			t.Fatalf("exact: acting(%s of b) = %q; want b", k, name)
		}
	}

	// a held c's keys never; with c down under available, a acts for some
	// of them, which must wait for c's fence.
	before := newConfig("a", PolicyAvailable, 1, testView(all, all, nil))
	o := (&ownership{}).next(before, 7, t0)
	o = o.with("b", &complete{inc: 1, config: before.id}, nil, t0)
	o = o.with("c", &complete{inc: 1, config: before.id}, nil, t0)
	if !o.settled {
		t.Fatalf("every live member completed: settled = false, waiting for %v", o.waitingFor)
	}
	after := newConfig("a", PolicyAvailable, 1, testView(all, []string{"a", "b"}, nil))
	o = o.next(after, 7, t0)
	var gained string
	for _, k := range keysOwnedBy(after, "c", 50) {
		if name, down, _ := after.acting(k); name == "a" && len(down) == 1 && down[0] == "c" {
			gained = k
			break
		}
	}
	if gained == "" {
		t.Fatal("no key of c falls to a")
	}
	o = o.with("b", &complete{inc: 1, config: after.id}, nil, t0)
	if err := o.gate(gained, t0); !errors.Is(err, ErrMoving) {
		t.Fatalf("available: gate(%s of down c) before the fence = %v; want ErrMoving", gained, err)
	}
	f := fence{inc: 1, at: t0.Add(1100 * time.Millisecond)}
	o = o.with("c", nil, &f, t0)
	if err := o.gate(gained, t0.Add(time.Second)); err == nil {
		t.Fatalf("available: gate(%s) before the fence's wait is over = nil; want an error", gained)
	}
	if err := o.gate(gained, t0.Add(1100*time.Millisecond)); err != nil {
		t.Fatalf("available: gate(%s) once c is fenced = %v; want nil", gained, err)
	}
}

// TestOwnershipGainWaitsForHandoff: a key a node gains (another member
// left) is decided only once every live member, the previous holder
// included, sent its complete for the new configuration; keys it held all
// along are decided at once.
func TestOwnershipGainWaitsForHandoff(t *testing.T) {
	all := []string{"a", "b", "c"}
	c1 := newConfig("a", PolicyExact, 1, testView(all, all, nil))
	o := (&ownership{}).next(c1, 7, t0)
	for _, n := range []string{"b", "c"} {
		o = o.with(n, &complete{inc: 1, config: c1.id}, nil, t0)
	}
	if !o.settled {
		t.Fatalf("settled = false after every complete; waiting for %v", o.waitingFor)
	}
	// c leaves: its keys move, some to a.
	c2 := newConfig("a", PolicyExact, 1, testView([]string{"a", "b"}, []string{"a", "b"}, []string{"c"}))
	o = o.next(c2, 7, t0)
	held := keysOwnedBy(c1, "a", 5)
	var gained []string
	for _, k := range keysOwnedBy(c1, "c", 40) {
		if c2.owner(k) == "a" {
			gained = append(gained, k)
		}
	}
	for _, k := range held {
		if err := o.gate(k, t0); err != nil {
			t.Fatalf("gate(%s, held all along) = %v; want nil", k, err)
		}
	}
	for _, step := range []struct {
		from string
		want bool // gained keys decidable after this complete
	}{{"b", false}, {"c", true}} {
		for _, k := range gained {
			if err := o.gate(k, t0); err == nil {
				t.Fatalf("gate(%s, gained from c) before %s's complete = nil; want an error", k, step.from)
			}
		}
		o = o.with(step.from, &complete{inc: 1, config: c2.id}, nil, t0)
		for _, k := range gained {
			if err := o.gate(k, t0); (err == nil) != step.want {
				t.Fatalf("gate(%s) after %s's complete = %v; want decidable %v", k, step.from, err, step.want)
			}
		}
	}
	if !o.settled {
		t.Fatalf("settled = false after every complete; waiting for %v", o.waitingFor)
	}
	// A complete for another configuration counts for nothing.
	o2 := (&ownership{}).next(c1, 7, t0).next(c2, 7, t0)
	o2 = o2.with("b", &complete{inc: 1, config: c1.id}, nil, t0)
	o2 = o2.with("c", &complete{inc: 1, config: c1.id}, nil, t0)
	if err := o2.gate(gained[0], t0); err == nil {
		t.Fatalf("gate after completes for the old configuration = nil; want an error")
	}
}

// TestOwnershipFreshIncarnation: a node that starts (or takes a new
// incarnation) holds nothing: every key it acts for waits for the
// completes of the live members, and the key of a member that is down
// waits for it under the exact policy even when the others completed.
func TestOwnershipFreshIncarnation(t *testing.T) {
	all := []string{"a", "b", "c"}
	c := newConfig("a", PolicyExact, 1, testView(all, []string{"a", "b"}, nil))
	o := (&ownership{}).next(c, 7, t0)
	mine := keysOwnedBy(c, "a", 60)
	o = o.with("b", &complete{inc: 1, config: c.id}, nil, t0)
	free, blocked := 0, 0
	for _, k := range mine {
		err := o.gate(k, t0)
		switch where := c.others.Owner(k).Name; {
		case where == "b" && err != nil:
			t.Fatalf("gate(%s, next owner b completed) = %v; want nil", k, err)
		case where == "c" && err == nil:
			t.Fatalf("gate(%s, next owner c down) = nil; want it to wait for c", k)
		case where == "b":
			free++
		default:
			blocked++
		}
	}
	if free == 0 || blocked == 0 {
		t.Fatalf("%d keys free, %d blocked; want some of each", free, blocked)
	}
	// A new incarnation forgets the completes.
	o = o.next(c, 8, t0)
	for _, k := range mine {
		if err := o.gate(k, t0); err == nil {
			t.Fatalf("gate(%s) in a new incarnation before any complete = nil; want an error", k)
		}
	}
}

// TestStandby: with two replicas, a key's standby is the first member up
// after its acting member in the key's order: never the acting member, the
// second of the order while everyone is up, and the next one up when that
// one is down; when the owner is down, its standby acts and the member
// after it keeps the copy. With one replica there is none.
func TestStandby(t *testing.T) {
	all := []string{"a", "b", "c", "d"}
	c := newConfig("a", PolicyExact, 2, testView(all, all, nil))
	for i := 0; i < 200; i++ {
		k := fmt.Sprintf("k%d", i)
		order := c.order(k)
		if got := c.standby(k); got != order[1] {
			t.Fatalf("standby(%s), all up = %q; want %q, the second of %v", k, got, order[1], order)
		}
	}
	for _, down := range all {
		var up []string
		for _, n := range all {
			if n != down {
				up = append(up, n)
			}
		}
		c := newConfig("a", PolicyExact, 2, testView(all, up, nil))
		for i := 0; i < 200; i++ {
			k := fmt.Sprintf("k%d", i)
			var upOrder []string
			for _, n := range c.order(k) {
				if n != down {
					upOrder = append(upOrder, n)
				}
			}
			if got, _, err := c.acting(k); err != nil || got != upOrder[0] {
				t.Fatalf("%s down: acting(%s) = %q, %v; want %q (order %v)", down, k, got, err, upOrder[0], c.order(k))
			}
			if got := c.standby(k); got != upOrder[1] {
				t.Fatalf("%s down: standby(%s) = %q; want %q (order %v)", down, k, got, upOrder[1], c.order(k))
			}
		}
	}
	if got := newConfig("a", PolicyExact, 1, testView(all, all, nil)).standby("k1"); got != "" {
		t.Fatalf("standby with one replica = %q; want none", got)
	}
}

// TestOwnershipWaitsForStandbys: with standbys, a node is settled only once
// it merged the copies it keeps (promoted) and brought every live member up
// to date as a standby; until then a key waits for its own standby.
func TestOwnershipWaitsForStandbys(t *testing.T) {
	all := []string{"a", "b", "c"}
	c := newConfig("a", PolicyExact, 2, testView(all, all, nil))
	o := (&ownership{}).next(c, 7, t0)
	for _, n := range []string{"b", "c"} {
		o = o.with(n, &complete{inc: 1, config: c.id}, nil, t0)
	}
	if o.settled {
		t.Fatal("settled before any standby was brought up to date")
	}
	key := keysOwnedBy(c, "a", 1)[0]
	sb := c.standby(key)
	other := "b"
	if sb == "b" {
		other = "c"
	}
	if err := o.gate(key, t0); err == nil {
		t.Fatalf("gate(%s) before promotion = nil; want it to wait", key)
	}
	o = o.amended(t0, func(n *ownership) { n.promoted = c.id })
	o = o.amended(t0, func(n *ownership) { n.synced = map[string]syncMark{other: {cfg: c, inc: 1}} })
	if err := o.gate(key, t0); err == nil {
		t.Fatalf("gate(%s) while its standby %s is not up to date = nil; want it to wait", key, sb)
	}
	o = o.amended(t0, func(n *ownership) {
		n.synced = map[string]syncMark{other: {cfg: c, inc: 1}, sb: {cfg: c, inc: 1}}
	})
	if !o.settled || o.gate(key, t0) != nil {
		t.Fatalf("every standby up to date: settled %v, gate %v; want settled", o.settled, o.gate(key, t0))
	}
	// A standby that restarted (new incarnation) is no longer up to date.
	v := testView(all, all, nil)
	for i := range v.Members {
		if v.Members[i].Name == sb {
			v.Members[i].Incarnation = 2
		}
	}
	o = o.next(newConfig("a", PolicyExact, 2, v), 7, t0)
	if o.settled {
		t.Fatalf("settled after standby %s restarted; want it brought up to date again", sb)
	}
}
