package actor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/persist"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// asRecords turns exported states into the full-state records a follower
// receives.
func asRecords(xs []Exported) []persist.Record {
	recs := make([]persist.Record, len(xs))
	for i, x := range xs {
		recs[i] = persist.Record{Key: x.Key, Deadline: x.Deadline, Value: x.State}
	}
	return recs
}

// getStates is Engine.Get that fails the test on an error or a missing key.
func getStates(t *testing.T, e *Engine, keys ...string) []Exported {
	t.Helper()
	xs, err := e.Get(context.Background(), keys)
	if err != nil || len(xs) != len(keys) {
		t.Fatalf("Get(%q) = %d states, %v; want %d", keys, len(xs), err, len(keys))
	}
	return xs
}

// TestFollowerKeysDecideOnLeading: states a leader recorded, written on a
// follower with PutFollower, are the follower's own keys: its next check
// on one counts the leader's hits (a key the leader filled is denied), and
// nothing is kept under ReplicaPrefix. For every algorithm.
func TestFollowerKeysDecideOnLeading(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			leader := newHarness(t, "commit", nil)
			follower := newHarness(t, "commit", nil)
			ctx := context.Background()
			c := Check{Key: "k", Limit: 5, Window: time.Minute, Algorithm: algo, Cost: 1}
			for i := range 5 {
				if d := leader.check(c); !d.Allowed {
					t.Fatalf("leader: hit %d of 5 denied", i+1)
				}
				leader.clk.Advance(time.Second)
				follower.clk.Advance(time.Second)
			}
			if err := follower.eng.PutFollower(ctx, asRecords(getStates(t, leader.eng, "k"))); err != nil {
				t.Fatalf("PutFollower: %v", err)
			}
			if v, err := follower.eng.InspectReplica(ctx, "k"); err != nil || v.Found {
				t.Errorf("InspectReplica(k) = %+v, %v; want no replica copy", v, err)
			}
			if got, want := used(t, follower.eng, "k"), used(t, leader.eng, "k"); got != want || got == 0 {
				t.Errorf("follower counts %d hits on k; want the leader's %d", got, want)
			}
			if d := follower.check(c); d.Allowed {
				t.Errorf("follower: a sixth hit of 5 allowed: %+v", d)
			}
		})
	}
}

// TestPutFollowerAppendsAndDeletes: the records a leader's Replicator
// receives (full states, tails, deletes), written with PutFollower, leave
// the follower's keys as the leader's; a tail over a key the follower
// holds nothing of is not written and is reported in a *MissingBaseError,
// while the other records of the call are.
func TestPutFollowerAppendsAndDeletes(t *testing.T) {
	rep := &recReplicator{}
	leader := newHarness(t, "commit", func(c *Config) { c.Replicator = rep })
	follower := newHarness(t, "commit", nil)
	ctx := context.Background()
	hit := func(key string) {
		leader.check(Check{Key: key, Limit: 100, Window: time.Minute, Cost: 1})
		leader.clk.Advance(time.Second)
		follower.clk.Advance(time.Second)
	}
	for range 5 {
		hit("log")
	}
	recs := rep.take()
	if tails := slices.IndexFunc(recs, func(r persist.Record) bool { return r.Append }); tails < 0 {
		t.Fatalf("no tail among the leader's %d records", len(recs))
	}
	if err := follower.eng.PutFollower(ctx, recs); err != nil {
		t.Fatalf("PutFollower(the leader's records) = %v", err)
	}
	got, want := getStates(t, follower.eng, "log")[0], getStates(t, leader.eng, "log")[0]
	if !bytes.Equal(got.State, want.State) || got.Deadline != want.Deadline {
		t.Fatalf("follower's log = %x (deadline %d); want the leader's %x (deadline %d)", got.State, got.Deadline, want.State, want.Deadline)
	}

	// A tail of log (held) and one of late, whose full state the follower
	// never got.
	hit("late")
	rep.take()
	hit("log")
	hit("late")
	recs = rep.take()
	err := follower.eng.PutFollower(ctx, recs)
	var mb *MissingBaseError
	if !errors.As(err, &mb) || !slices.Equal(mb.Keys, []string{"late"}) {
		t.Fatalf("PutFollower(tails of log and late) = %v; want a *MissingBaseError for late", err)
	}
	if !strings.Contains(err.Error(), "put follower") {
		t.Errorf("error %q does not name the call", err)
	}
	if got := used(t, follower.eng, "log"); got != 6 {
		t.Errorf("follower's log counts %d hits; want 6 (its tail applied)", got)
	}
	if v, err := follower.eng.Inspect(ctx, "late"); err != nil || v.Found {
		t.Errorf("follower's Inspect(late) = %+v, %v; want nothing", v, err)
	}

	// A delete deletes.
	if _, err := leader.eng.Reset(ctx, "log"); err != nil {
		t.Fatal(err)
	}
	recs = rep.take()
	if len(recs) != 1 || recs[0].Value != nil {
		t.Fatalf("leader's records of a reset = %+v; want one delete", recs)
	}
	if err := follower.eng.PutFollower(ctx, recs); err != nil {
		t.Fatal(err)
	}
	found := false
	if err := follower.store.Get([]string{"log"}, func(int, int64, []byte) { found = true }); err != nil || found {
		t.Errorf("follower's store after the delete: found %v, %v; want no record", found, err)
	}
}

// TestEvictDropsStaleMemory: a key an actor holds in memory is not what
// PutFollower wrote under it: the actor decides from its memory, older
// than the store (which is why Evict exists). After Evict, the key loads
// from the store, and the hits written there count. For every algorithm.
func TestEvictDropsStaleMemory(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			leader := newHarness(t, "commit", nil)
			follower := newHarness(t, "commit", nil)
			ctx := context.Background()
			c := Check{Key: "k", Limit: 5, Window: time.Minute, Algorithm: algo, Cost: 1}
			// The follower decided k once (it led the key then): k is in
			// its memory with one hit.
			follower.check(c)
			for range 5 {
				leader.check(c)
			}
			if err := follower.eng.PutFollower(ctx, asRecords(getStates(t, leader.eng, "k"))); err != nil {
				t.Fatal(err)
			}
			if got := follower.remaining(c); got != 4 {
				t.Fatalf("without Evict: remaining %d; want 4, the stale memory's (the store holds 0)", got)
			}
			n, err := follower.eng.Evict(ctx, func(key string) bool { return key == "k" })
			if err != nil || n != 1 {
				t.Fatalf("Evict(k) = %d, %v; want 1, nil", n, err)
			}
			if got := follower.remaining(c); got != 0 {
				t.Errorf("after Evict: remaining %d; want 0, the store's", got)
			}
			if d := follower.check(c); d.Allowed {
				t.Errorf("after Evict: a sixth hit of 5 allowed: %+v", d)
			}
		})
	}
}

// TestEvictWaitsForWriteInFlight: Evict does not drop a key whose latest
// write is not committed yet: the actor waits for the commit, and a check
// sent once the actor has taken Evict's call is decided after it, and sees
// the write (a drop before would load the store without it, and allow a
// hit over the limit). A write that fails drops the key as any failed
// commit does: it loads again without the write.
func TestEvictWaitsForWriteInFlight(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			disk := newGatedDisk()
			h := newFaultHarness(t, "commit", disk.write, nil)
			// Before the harness stops, should the test fail with the write
			// still held.
			t.Cleanup(func() {
				select {
				case disk.result <- nil:
				default:
				}
			})
			ctx := context.Background()
			c := Check{Key: "k", Limit: 5, Window: time.Minute, Cost: 4}
			h.check(c)

			disk.armed.Store(true)
			c.Cost = 1
			first := checkAsync(h, c)
			within(t, disk.entered, "the fifth hit's write") // decided, its write held
			disk.armed.Store(false)

			asked := make(chan struct{})
			var once sync.Once
			type result struct {
				n   int
				err error
			}
			evicted := make(chan result, 1)
			go func() {
				n, err := h.eng.Evict(ctx, func(key string) bool {
					if key == "k" {
						once.Do(func() { close(asked) })
					}
					return key == "k"
				})
				evicted <- result{n, err}
			}()
			within(t, asked, "k's actor to take Evict's call")
			type decided struct {
				d   Decision
				err error
			}
			next := make(chan decided, 1)
			batches := h.obs.batches.Load()
			go func() {
				d, err := h.tryCheck(c)
				next <- decided{d, err}
			}()
			// The check waits in the mailbox of k's actor, which waits for
			// the commit; an actor that did not wait decides it now.
			mailbox := h.eng.actors[shardOf(h.eng, "k")].mailbox
			testkit.Eventually(t, 10*time.Second, func() bool { return len(mailbox) == 1 || h.obs.batches.Load() > batches },
				"the check to wait for k's actor or be decided")

			var want error
			if fail {
				want = errDiskFull
			}
			disk.result <- want
			if err := within(t, first, "the fifth hit's answer"); fail != (err != nil) {
				t.Fatalf("the fifth hit: %v; want the disk's error %v", err, want)
			}
			if r := within(t, evicted, "Evict's answer"); r.n != 1 || r.err != nil {
				t.Fatalf("Evict(k) = %d, %v; want 1, nil", r.n, r.err)
			}
			r := within(t, next, "the check after Evict")
			switch {
			case r.err != nil:
				t.Fatalf("check after Evict: %v", r.err)
			case !fail && r.d.Allowed:
				t.Errorf("check after Evict = %+v; want denied: the fifth hit was committed", r.d)
			case fail && (!r.d.Allowed || r.d.Remaining != 0):
				t.Errorf("check after Evict = %+v; want allowed, 0 remaining: the fifth hit failed", r.d)
			}
			if fail {
				_ = h.drainFailure()
			}
		})
	}
}

// within receives from ch, or fails the test after 10 s.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("still waiting for %s after 10 s", what)
		panic("unreachable")
	}
}

// TestEvictCountsAndKeepsTheRest: Evict drops exactly the keys drop picks,
// returns how many, and changes nothing on disk; the other keys stay in
// memory. The dropped keys' alarms go with them: the kept keys expire on
// theirs, each once, and then no timer is left. In memory mode Evict drops
// nothing and says why.
func TestEvictCountsAndKeepsTheRest(t *testing.T) {
	h := newHarness(t, "commit", nil)
	ctx := context.Background()
	dropped := []string{"drop-1", "drop-2", "drop-3"}
	kept := []string{"keep-1", "keep-2"}
	for _, k := range append(slices.Clone(dropped), kept...) {
		h.hit(k, 10, 2)
	}
	var mu sync.Mutex
	asked := make(map[string]int)
	n, err := h.eng.Evict(ctx, func(key string) bool {
		mu.Lock()
		asked[key]++
		mu.Unlock()
		return strings.HasPrefix(key, "drop-")
	})
	if err != nil || n != len(dropped) {
		t.Fatalf("Evict(drop-*) = %d, %v; want %d, nil", n, err, len(dropped))
	}
	for k, times := range asked {
		if times != 1 {
			t.Errorf("drop(%q) called %d times; want once", k, times)
		}
	}
	inspect := func(key string) KeyState {
		t.Helper()
		v, err := h.eng.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, k := range dropped {
		if v := inspect(k); v.InMemory || !v.Found || v.Used != 2 {
			t.Errorf("after Evict: %q in memory %v, found %v, %d used; want on disk only, 2 used", k, v.InMemory, v.Found, v.Used)
		}
	}
	for _, k := range kept {
		if v := inspect(k); !v.InMemory || v.Used != 2 {
			t.Errorf("after Evict: %q in memory %v, %d used; want in memory, 2 used", k, v.InMemory, v.Used)
		}
	}
	if got := h.obs.keys.Load(); got != int64(len(kept)) {
		t.Errorf("keys in memory = %d; want %d", got, len(kept))
	}
	if n, err := h.eng.Evict(ctx, func(key string) bool { return strings.HasPrefix(key, "drop-") }); n != 0 || err != nil {
		t.Errorf("Evict again = %d, %v; want 0, nil", n, err)
	}

	h.clk.Advance(2 * time.Minute)
	testkit.Eventually(t, 10*time.Second, func() bool { return h.obs.keys.Load() == 0 }, "the kept keys to expire")
	testkit.Eventually(t, 10*time.Second, func() bool { return h.clk.Pending() == 0 }, "no timer armed")
	if got := h.obs.expired.Load(); got != int64(len(kept)) {
		t.Errorf("keys expired on their alarms = %d; want %d, the kept ones", got, len(kept))
	}

	m := newHarness(t, "memory", nil)
	m.hit("k", 10, 2)
	if n, err := m.eng.Evict(ctx, func(string) bool { return true }); n != 0 || !errors.Is(err, ErrNoStore) {
		t.Fatalf("Evict in memory mode = %d, %v; want 0, ErrNoStore", n, err)
	}
	if got := used(t, m.eng, "k"); got != 2 {
		t.Fatalf("memory mode, after a refused Evict: k counts %d hits; want 2", got)
	}
}

// TestEvictForgetsDamagedRecord: an actor that found a key's stored record
// damaged refuses the key's checks until the record is replaced; once
// PutFollower replaced it and Evict dropped the actor's note, the key
// loads the new state.
func TestEvictForgetsDamagedRecord(t *testing.T) {
	h := newHarness(t, "commit", nil)
	leader := newHarness(t, "commit", nil)
	ctx := context.Background()
	c := Check{Key: "k", Limit: 5, Window: time.Minute, Cost: 1}
	h.check(c)
	h.stop()
	damageRecord(t, h.dir, "k")
	h.start()
	if d, err := h.tryCheck(c); err != nil || !errors.Is(d.Err, ErrDamaged) {
		t.Fatalf("check on a damaged record = %+v, %v; want ErrDamaged", d, err)
	}
	for range 5 {
		leader.check(c)
	}
	if err := h.eng.PutFollower(ctx, asRecords(getStates(t, leader.eng, "k"))); err != nil {
		t.Fatal(err)
	}
	if d, err := h.tryCheck(c); err != nil || !errors.Is(d.Err, ErrDamaged) {
		t.Fatalf("without Evict: check = %+v, %v; want ErrDamaged still (the actor's note)", d, err)
	}
	if n, err := h.eng.Evict(ctx, func(key string) bool { return key == "k" }); n != 0 || err != nil {
		t.Fatalf("Evict(k) = %d, %v; want 0 (not in memory), nil", n, err)
	}
	if d := h.check(c); d.Err != nil || d.Allowed {
		t.Fatalf("after Evict: check = %+v; want denied, the leader's 5 hits loaded", d)
	}
}

// TestPutFollowerRefusesBadRecords: a record that is not a client key's
// state refuses the whole call, and nothing is written; in memory mode
// there is no store to write to.
func TestPutFollowerRefusesBadRecords(t *testing.T) {
	h := newHarness(t, "commit", nil)
	ctx := context.Background()
	var s state
	var d Decision
	s.decide(h.clk.Now().UnixNano(), &Check{Key: "k", Limit: 10, Window: time.Minute, Cost: 1}, stMaxRuns, &d)
	good := persist.Record{Key: "good", Deadline: s.deadline(), Value: s.appendBinary(nil)}
	for _, bad := range []persist.Record{
		{Key: "", Deadline: s.deadline(), Value: good.Value},
		{Key: ReplicaPrefix + "x", Deadline: s.deadline(), Value: good.Value},
		{Key: ReservedPrefix, Deadline: s.deadline(), Value: good.Value},
		{Key: "x", Deadline: 0, Value: good.Value},
		{Key: "x", Deadline: s.deadline(), Value: []byte{9, 9}},
		{Key: "x", Append: true},
	} {
		if err := h.eng.PutFollower(ctx, []persist.Record{good, bad}); err == nil || !strings.Contains(err.Error(), "nothing was written") {
			t.Errorf("PutFollower(%+v) = %v; want an error saying nothing was written", bad, err)
		}
		if _, err := h.eng.SubmitFollower(ctx, []persist.Record{good, bad}); err == nil {
			t.Errorf("SubmitFollower(%+v) = nil error; want the same refusal", bad)
		}
	}
	n := 0
	if err := h.store.Scan("", "", 0, func(string, int64, []byte) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("records on disk after refused calls: %d; want none", n)
	}
	m := newHarness(t, "memory", nil)
	if err := m.eng.PutFollower(ctx, []persist.Record{good}); !errors.Is(err, ErrNoStore) {
		t.Fatalf("PutFollower in memory mode = %v; want ErrNoStore", err)
	}
}
