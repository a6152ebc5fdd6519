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

// recReplicator is a Replicator for tests: it keeps a copy of every write it
// receives, in order, and answers at once with fail, or, while hold is set,
// keeps done until release.
type recReplicator struct {
	mu    sync.Mutex
	recs  []persist.Record
	calls int
	hold  bool
	held  []func(error)
	fail  error
}

func (r *recReplicator) Replicate(recs []persist.Record, done func(error)) {
	r.mu.Lock()
	r.calls++
	for _, rec := range recs {
		rec.Value = bytes.Clone(rec.Value)
		r.recs = append(r.recs, rec)
	}
	if r.hold {
		r.held = append(r.held, done)
		r.mu.Unlock()
		return
	}
	err := r.fail
	r.mu.Unlock()
	done(err)
}

// release answers every held write with err and stops holding.
func (r *recReplicator) release(err error) {
	r.mu.Lock()
	held := r.held
	r.held, r.hold = nil, false
	r.mu.Unlock()
	for _, done := range held {
		done(err)
	}
}

// take returns the records received since the last take.
func (r *recReplicator) take() []persist.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	recs := r.recs
	r.recs = nil
	return recs
}

func (r *recReplicator) heldCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held)
}

// checkAsync runs c on h's engine in a goroutine and returns the channel
// its error arrives on.
func checkAsync(h *harness, c Check) <-chan error {
	res := make(chan error, 1)
	go func() {
		var d [1]Decision
		res <- h.eng.Check(context.Background(), []Check{c}, d[:])
	}()
	return res
}

// TestReplicatorAcknowledgement: in the commit and fsync modes, a call
// whose hits were written is acknowledged once both the store committed
// them and the Replicator confirmed them; a Replicator that fails fails
// the call with ErrReplication and its own error, and the hits stay
// counted; a call that wrote nothing is acknowledged at once; in async mode
// every call is acknowledged at once and Replicate is still called; in
// memory mode nothing is replicated. The Replicator receives the records
// the store received.
func TestReplicatorAcknowledgement(t *testing.T) {
	for _, mode := range []string{"commit", "fsync"} {
		t.Run(mode, func(t *testing.T) {
			rep := &recReplicator{hold: true}
			h := newHarness(t, mode, func(c *Config) { c.Replicator = rep })
			res := checkAsync(h, Check{Key: "k", Limit: 2, Window: time.Minute, Cost: 2})
			testkit.Eventually(t, 10*time.Second, func() bool { return rep.heldCount() == 1 }, "the write to reach the replicator")
			// The store commits; the call still waits for the replicator.
			if err := h.store.Flush(); err != nil {
				t.Fatal(err)
			}
			found := false
			if err := h.store.Get([]string{"k"}, func(int, int64, []byte) { found = true }); err != nil || !found {
				t.Fatalf("store.Get(k) after Flush: found %v, %v; want the record", found, err)
			}
			select {
			case err := <-res:
				t.Fatalf("Check returned %v before the replicator confirmed the write", err)
			default:
			}
			// A denial writes nothing: acknowledged at once, replicator held.
			if d := h.hit("k", 2, 1); d.Allowed {
				t.Fatalf("third hit of 2 allowed")
			}
			rep.release(nil)
			if err := <-res; err != nil {
				t.Fatalf("Check after the replicator confirmed: %v", err)
			}

			// A failing replicator: the call fails, the hits stay.
			standbyDown := errors.New("standby down")
			rep.mu.Lock()
			rep.fail = standbyDown
			rep.mu.Unlock()
			var d [1]Decision
			err := h.eng.Check(context.Background(), []Check{{Key: "j", Limit: 5, Window: time.Minute, Cost: 3}}, d[:])
			if !errors.Is(err, ErrReplication) || !errors.Is(err, standbyDown) {
				t.Fatalf("Check with a failing replicator = %v; want ErrReplication and %v", err, standbyDown)
			}
			if u := used(t, h.eng, "j"); u != 3 {
				t.Fatalf("after a failed replication j counts %d hits; want 3 (kept here)", u)
			}
			rep.mu.Lock()
			rep.fail = nil
			rep.mu.Unlock()

			// What the replicator received is what the store holds.
			h.settle()
			checkSameRecords(t, h, rep.take(), []string{"k", "j"})
		})
	}
	t.Run("async", func(t *testing.T) {
		rep := &recReplicator{hold: true}
		h := newHarness(t, "async", func(c *Config) { c.Replicator = rep })
		h.hit("k", 10, 1) // returns while the replicator holds the write
		testkit.Eventually(t, 10*time.Second, func() bool { return rep.heldCount() == 1 }, "the write to reach the replicator")
		rep.release(nil)
	})
	t.Run("memory", func(t *testing.T) {
		rep := &recReplicator{}
		h := newHarness(t, "memory", func(c *Config) { c.Replicator = rep })
		h.hit("k", 10, 1)
		h.settle()
		if rep.calls != 0 {
			t.Fatalf("memory mode replicated %d writes; want none", rep.calls)
		}
	})
}

// checkSameRecords applies recs to a store of their own, as the engine's
// store applies them, and checks that it then holds what h's store holds
// for keys.
func checkSameRecords(t *testing.T, h *harness, recs []persist.Record, keys []string) {
	t.Helper()
	st, err := persist.Open(persist.Options{Path: t.TempDir() + "/copy.db"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c := st.Submit(recs, nil)
	<-c.Done()
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
	read := func(s *persist.Store) map[string]string {
		m := make(map[string]string)
		if err := s.Get(keys, func(i int, deadline int64, v []byte) { m[keys[i]] = fmt.Sprintf("%d:%x", deadline, v) }); err != nil {
			t.Fatal(err)
		}
		return m
	}
	got, want := read(st), read(h.store)
	for _, k := range keys {
		if got[k] != want[k] {
			t.Errorf("key %q: replicated records give %s; the store holds %s", k, got[k], want[k])
		}
	}
}

// TestReplicaCopies: the records an owner's Replicator receives, written
// on another engine with PutReplicas, give that engine a copy of each key
// that equals the owner's state (tails appended to their base); the copies
// survive a restart, stay out of List and Collect, and expire at their
// deadline.
func TestReplicaCopies(t *testing.T) {
	rep := &recReplicator{}
	owner := newHarness(t, "commit", func(c *Config) { c.Replicator = rep })
	standby := newHarness(t, "commit", nil)
	ctx := context.Background()
	keys := []string{"log", "window", "bucket", "gone"}
	for i := range 20 {
		owner.check(Check{Key: "log", Limit: 100, Window: time.Minute, Cost: 1})
		owner.check(Check{Key: "window", Limit: 100, Window: time.Minute, Algorithm: SlidingWindow, Cost: 1})
		owner.check(Check{Key: "bucket", Limit: 100, Window: time.Minute, Algorithm: TokenBucket, Cost: 3})
		if i == 10 {
			owner.check(Check{Key: "gone", Limit: 100, Window: time.Minute, Cost: 1})
			if _, err := owner.eng.Reset(ctx, "gone"); err != nil {
				t.Fatal(err)
			}
		}
		owner.clk.Advance(time.Second)
		standby.clk.Advance(time.Second)
	}
	owner.settle()
	recs := rep.take()
	appends := 0
	for _, r := range recs {
		if r.Append {
			appends++
		}
	}
	if appends == 0 {
		t.Fatalf("no tail among %d replicated records; want the log's hits as tails", len(recs))
	}
	// As the cluster sends them: in order, a few records per call.
	for start := 0; start < len(recs); start += 7 {
		if err := standby.eng.PutReplicas(ctx, recs[start:min(start+7, len(recs))]); err != nil {
			t.Fatalf("PutReplicas: %v", err)
		}
	}
	want, err := owner.eng.Get(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 3 {
		t.Fatalf("owner's Get(%q) = %d states; want 3", keys, len(want))
	}
	checkCopies := func(when string) {
		t.Helper()
		got := collectReplicas(t, standby.eng, nil)
		if len(got) != len(want) {
			t.Fatalf("%s: CollectReplicas = %d copies; want %d", when, len(got), len(want))
		}
		for _, w := range want {
			g, ok := got[w.Key]
			if !ok || !bytes.Equal(g.State, w.State) || g.Deadline != w.Deadline {
				t.Errorf("%s: copy of %q = %x (deadline %d); want the owner's %x (deadline %d)", when, w.Key, g.State, g.Deadline, w.State, w.Deadline)
			}
		}
	}
	checkCopies("after PutReplicas")

	// InspectReplica shows each copy as Inspect shows the owner's key.
	for _, k := range keys {
		w, err := owner.eng.Inspect(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		g, err := standby.eng.InspectReplica(ctx, k)
		if err != nil {
			t.Fatalf("InspectReplica(%q): %v", k, err)
		}
		if g.Found != w.Found || g.Used != w.Used || g.Lineage != w.Lineage || !slices.Equal(g.Runs, w.Runs) || g.InMemory {
			t.Errorf("InspectReplica(%q) = found %v, %d used, lineage %x, runs %v, in memory %v; want the owner's found %v, %d used, lineage %x, runs %v, not in memory",
				k, g.Found, g.Used, g.Lineage, g.Runs, g.InMemory, w.Found, w.Used, w.Lineage, w.Runs)
		}
	}
	if v, err := owner.eng.InspectReplica(ctx, "log"); err != nil || v.Found {
		t.Errorf("owner's InspectReplica(log) = %+v, %v; want not found: the owner keeps no copy of its own key", v, err)
	}
	if _, err := standby.eng.InspectReplica(ctx, ReplicaPrefix+"log"); err == nil {
		t.Errorf("InspectReplica(a reserved key) = nil error; want an *InvalidCheckError")
	}

	// Copies are no keys of the standby's.
	if l, err := standby.eng.List(ctx, "", "", 100); err != nil || len(l) != 0 {
		t.Fatalf("standby List = %+v, %v; want nothing", l, err)
	}
	if n, err := standby.eng.Collect(ctx, func(string) bool { return true }, func(x Exported) error {
		t.Errorf("Collect returned %q", x.Key)
		return nil
	}); err != nil || n != 0 {
		t.Fatalf("standby Collect = %d, %v; want 0", n, err)
	}
	if v, err := standby.eng.Inspect(ctx, "log"); err != nil || v.Found {
		t.Fatalf("standby Inspect(log) = %+v, %v; want not found", v, err)
	}

	standby.restart()
	checkCopies("after a restart")
	only := collectReplicas(t, standby.eng, func(k string) bool { return k == "window" })
	if len(only) != 1 || only["window"].Key != "window" {
		t.Fatalf("CollectReplicas(window only) = %v; want window", only)
	}

	// DeleteReplicas.
	if err := standby.eng.DeleteReplicas(ctx, []string{"window"}); err != nil {
		t.Fatal(err)
	}
	if got := collectReplicas(t, standby.eng, nil); len(got) != 2 || got["window"].Key != "" {
		t.Fatalf("after DeleteReplicas(window): %d copies (%v); want log and bucket", len(got), got)
	}

	// The copies expire at their deadline: the janitor deletes them.
	standby.clk.Advance(2 * time.Minute)
	testkit.Eventually(t, 10*time.Second, func() bool { return standby.store.NextDeadline() == 0 }, "the standby's deadline index to empty")
	n := 0
	if err := standby.store.Scan("", "", 0, func(string, int64, []byte) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("records on the standby's disk after every deadline = %d; want 0", n)
	}
}

// collectReplicas returns the copies CollectReplicas returns for want
// (nil: all), by key.
func collectReplicas(t *testing.T, e *Engine, want func(string) bool) map[string]Exported {
	t.Helper()
	if want == nil {
		want = func(string) bool { return true }
	}
	got := make(map[string]Exported)
	n, err := e.CollectReplicas(context.Background(), want, func(x Exported) error {
		if _, dup := got[x.Key]; dup {
			t.Errorf("CollectReplicas returned %q twice", x.Key)
		}
		got[x.Key] = x
		return nil
	})
	if err != nil || n != len(got) {
		t.Fatalf("CollectReplicas = %d, %v; fn received %d", n, err, len(got))
	}
	return got
}

// TestPutReplicasMissingBase: a tail whose copy has nothing to append to
// (no copy, a copy deleted by an earlier record or by a call before it not
// yet committed, an expired copy) is not written and is reported; the
// other records are written, and a tail over a put of a call not yet
// committed appends to it.
func TestPutReplicasMissingBase(t *testing.T) {
	h := newHarness(t, "commit", nil)
	ctx := context.Background()
	var s state
	var sv saved
	var d Decision
	c := Check{Key: "k", Limit: 100, Window: time.Minute, Cost: 1}
	now := h.clk.Now().UnixNano()
	s.decide(now, &c, stMaxRuns, &d)
	full := s.appendBinary(nil)
	s.written(&sv, len(full))
	s.decide(now+1, &c, stMaxRuns, &d)
	tail, ok := s.appendTail(nil, &sv, now+1)
	if !ok {
		t.Fatal("no tail")
	}
	dl := s.deadline()
	recs := []persist.Record{
		{Key: "nobase", Deadline: dl, Value: tail, Append: true},
		{Key: "based", Deadline: dl, Value: full},
		{Key: "based", Deadline: dl, Value: tail, Append: true},
		{Key: "deleted", Deadline: dl, Value: full},
		{Key: "deleted"},
		{Key: "deleted", Deadline: dl, Value: tail, Append: true},
		{Key: "nobase", Deadline: dl, Value: tail, Append: true},
	}
	err := h.eng.PutReplicas(ctx, recs)
	var mb *MissingBaseError
	if !errors.As(err, &mb) || !slices.Equal(mb.Keys, []string{"nobase", "deleted"}) {
		t.Fatalf("PutReplicas = %v; want a *MissingBaseError for nobase and deleted", err)
	}
	got := collectReplicas(t, h.eng, nil)
	if len(got) != 1 {
		t.Fatalf("copies = %v; want based only", got)
	}
	var b state
	if err := b.decode(got["based"].State); err != nil || b.cur != 2 || b.lineage != s.lineage {
		t.Fatalf("copy of based = %+v, %v; want 2 hits of lineage %x", b, err, s.lineage)
	}
	// A tail to based now appends.
	if err := h.eng.PutReplicas(ctx, []persist.Record{{Key: "based", Deadline: dl, Value: tail, Append: true}}); err != nil {
		t.Fatalf("PutReplicas(tail of based) = %v", err)
	}

	// Calls in flight: a tail sees the put of the call before it, and a
	// deletion of the call before it, though neither committed yet.
	var writes []*ReplicaWrite
	for _, recs := range [][]persist.Record{
		{{Key: "queued", Deadline: dl, Value: full}, {Key: "gone", Deadline: dl, Value: full}},
		{{Key: "queued", Deadline: dl, Value: tail, Append: true}, {Key: "gone"}},
		{{Key: "gone", Deadline: dl, Value: tail, Append: true}},
	} {
		w, err := h.eng.SubmitReplicas(ctx, recs)
		if err != nil {
			t.Fatal(err)
		}
		writes = append(writes, w)
	}
	for i, w := range writes {
		err := w.Wait(ctx)
		if i < 2 && err != nil || i == 2 && (!errors.As(err, &mb) || !slices.Equal(mb.Keys, []string{"gone"})) {
			t.Errorf("call %d: Wait = %v", i, err)
		}
	}
	got = collectReplicas(t, h.eng, func(k string) bool { return k == "queued" || k == "gone" })
	if err := b.decode(got["queued"].State); len(got) != 1 || err != nil || b.cur != 2 {
		t.Errorf("copies = %v (%v); want queued with 2 hits", got, err)
	}

	// Expired: as good as none.
	h.clk.Advance(2 * time.Minute)
	err = h.eng.PutReplicas(ctx, []persist.Record{{Key: "based", Deadline: dl + int64(2*time.Minute), Value: tail, Append: true}})
	if !errors.As(err, &mb) || !slices.Equal(mb.Keys, []string{"based"}) {
		t.Fatalf("PutReplicas(tail of an expired copy) = %v; want a *MissingBaseError for based", err)
	}
	if !strings.Contains(err.Error(), `"based"`) {
		t.Errorf("error %q does not name the key", err)
	}
}

// TestPutReplicasRefusesBadRecords: a record that is not a copy of a
// client key's state refuses the whole call, and nothing is written; in
// memory mode there is no store to keep copies in.
func TestPutReplicasRefusesBadRecords(t *testing.T) {
	h := newHarness(t, "commit", nil)
	ctx := context.Background()
	var s state
	var d Decision
	s.decide(h.clk.Now().UnixNano(), &Check{Key: "k", Limit: 10, Window: time.Minute, Cost: 1}, stMaxRuns, &d)
	good := persist.Record{Key: "good", Deadline: s.deadline(), Value: s.appendBinary(nil)}
	for _, bad := range []persist.Record{
		{Key: "", Deadline: 1, Value: good.Value},
		{Key: ReplicaPrefix + "x", Deadline: 1, Value: good.Value},
		{Key: "x", Deadline: 0, Value: good.Value},
		{Key: "x", Deadline: 1, Value: []byte{9, 9}},
		{Key: "x", Append: true},
	} {
		if err := h.eng.PutReplicas(ctx, []persist.Record{good, bad}); err == nil || !strings.Contains(err.Error(), "nothing was written") {
			t.Errorf("PutReplicas(%+v) = %v; want an error saying nothing was written", bad, err)
		}
	}
	if got := collectReplicas(t, h.eng, nil); len(got) != 0 {
		t.Fatalf("copies after refused calls: %v; want none", got)
	}
	m := newHarness(t, "memory", nil)
	if err := m.eng.PutReplicas(ctx, []persist.Record{good}); !errors.Is(err, ErrNoStore) {
		t.Fatalf("PutReplicas in memory mode = %v; want ErrNoStore", err)
	}
	if n, err := m.eng.CollectReplicas(ctx, func(string) bool { return true }, func(Exported) error { return nil }); n != 0 || err != nil {
		t.Fatalf("CollectReplicas in memory mode = %d, %v; want 0, nil", n, err)
	}
	if err := m.eng.DeleteReplicas(ctx, []string{"good"}); err != nil {
		t.Fatalf("DeleteReplicas in memory mode = %v; want nil", err)
	}
}

// TestReservedKeys: clients cannot use keys with ReservedPrefix, and
// listings skip the copies kept under it, whatever their number, while
// they still show the keys around them.
func TestReservedKeys(t *testing.T) {
	h := newHarness(t, "commit", nil)
	ctx := context.Background()
	reserved := ReplicaPrefix + "k"
	var d [1]Decision
	refused := func(what string, err error) {
		t.Helper()
		var ice *InvalidCheckError
		if !errors.As(err, &ice) || !strings.Contains(err.Error(), "keys starting with two NUL bytes are reserved") {
			t.Errorf("%s on a reserved key = %v; want an *InvalidCheckError saying it is reserved", what, err)
		}
	}
	refused("Check", h.eng.Check(ctx, []Check{{Key: "\x00\x00", Limit: 1, Window: time.Second, Cost: 1}}, d[:]))
	refused("Check", h.eng.Check(ctx, []Check{{Key: reserved, Limit: 1, Window: time.Second, Cost: 1}}, d[:]))
	_, err := h.eng.Inspect(ctx, reserved)
	refused("Inspect", err)
	_, err = h.eng.Reset(ctx, reserved)
	refused("Reset", err)
	_, err = h.eng.List(ctx, ReservedPrefix, "", 10)
	refused("List", err)
	refused("Import", h.eng.Import(ctx, []Exported{{Key: reserved, State: []byte{1}}}))
	_, err = h.eng.Forget(ctx, []Exported{{Key: reserved}})
	refused("Forget", err)
	_, err = h.eng.Get(ctx, []string{reserved})
	refused("Get", err)

	// Client keys around the reserved range, and many copies in it.
	clientKeys := []string{"\x00", "\x00\x01", "\x00\x01x", "a", "b"}
	for _, k := range clientKeys {
		h.hit(k, 10, 1)
	}
	var s state
	var dd Decision
	s.decide(h.clk.Now().UnixNano(), &Check{Key: "k", Limit: 10, Window: time.Minute, Cost: 1}, stMaxRuns, &dd)
	var recs []persist.Record
	for i := range 2500 {
		recs = append(recs, persist.Record{Key: fmt.Sprintf("copy-%04d", i), Deadline: s.deadline(), Value: s.appendBinary(nil)})
	}
	if err := h.eng.PutReplicas(ctx, recs); err != nil {
		t.Fatal(err)
	}
	h.restart() // every key on disk only
	for _, prefix := range []string{"", "\x00"} {
		l, err := h.eng.List(ctx, prefix, "", 3)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, k := range l {
			got = append(got, k.Key)
		}
		if want := clientKeys[:3]; !slices.Equal(got, want) {
			t.Errorf("List(%q, 3) = %q; want %q", prefix, got, want)
		}
	}
	if l, err := h.eng.List(ctx, "", "\x00\x00r:copy-0005", 2); err != nil || len(l) != 2 || l[0].Key != "\x00\x01" {
		t.Errorf("List after a reserved key = %+v, %v; want the client keys after the reserved range", l, err)
	}
	got := collectAll(t, h.eng, func(string) bool { return true })
	if len(got) != len(clientKeys) {
		t.Errorf("Collect returned %d keys; want the %d client keys", len(got), len(clientKeys))
	}
	if n := len(collectReplicas(t, h.eng, nil)); n != 2500 {
		t.Errorf("CollectReplicas = %d copies; want 2500", n)
	}
}

// TestStandbyTakeoverCountsOnce plays what the cluster does with copies of
// one key: the owner replicates its writes to a standby; the owner goes
// down, and the standby takes the key over from its copy (Import) and
// records more hits; the owner comes back with its disk, and both states
// meet in a merge, in either direction. Each hit counts once: the copies
// share a lineage, so the hits they share are not added up, and the hits
// each recorded alone are kept.
func TestStandbyTakeoverCountsOnce(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			rep := &recReplicator{}
			owner := newHarness(t, "commit", func(c *Config) { c.Replicator = rep })
			standby := newHarness(t, "commit", nil)
			ctx := context.Background()
			hit := func(h *harness, n int) {
				for range n {
					h.check(Check{Key: "k", Limit: 100, Window: time.Minute, Algorithm: algo, Cost: 1})
				}
			}
			hit(owner, 10)
			owner.settle()
			if err := standby.eng.PutReplicas(ctx, rep.take()); err != nil {
				t.Fatal(err)
			}
			// The owner records 3 hits its standby never gets, and goes
			// down; the standby takes over from its copy.
			owner.clk.Advance(time.Second)
			standby.clk.Advance(time.Second)
			rep.mu.Lock()
			rep.fail = errors.New("standby unreachable")
			rep.mu.Unlock()
			for range 3 {
				var d [1]Decision
				err := owner.eng.Check(ctx, []Check{{Key: "k", Limit: 100, Window: time.Minute, Algorithm: algo, Cost: 1}}, d[:])
				if !errors.Is(err, ErrReplication) {
					t.Fatalf("Check with the standby unreachable = %v; want ErrReplication", err)
				}
			}
			copies := collectReplicas(t, standby.eng, nil)
			if err := standby.eng.Import(ctx, []Exported{copies["k"]}); err != nil {
				t.Fatal(err)
			}
			if err := standby.eng.DeleteReplicas(ctx, []string{"k"}); err != nil {
				t.Fatal(err)
			}
			standby.clk.Advance(time.Second)
			owner.clk.Advance(time.Second)
			hit(standby, 5)
			// The owner comes back: its disk and the standby's state meet.
			rep.mu.Lock()
			rep.fail = nil
			rep.mu.Unlock()
			before, err := owner.eng.Inspect(ctx, "k")
			if err != nil || before.Lineage == 0 {
				t.Fatalf("owner Inspect(k) = %+v, %v; want a lineage", before, err)
			}
			owner.restart()
			if after, err := owner.eng.Inspect(ctx, "k"); err != nil || after.Lineage != before.Lineage {
				t.Fatalf("after a restart the owner's k has lineage %x (%v); want %x", after.Lineage, err, before.Lineage)
			}
			ownState, err := owner.eng.Get(ctx, []string{"k"})
			if err != nil || len(ownState) != 1 {
				t.Fatalf("owner Get(k) = %v, %v", ownState, err)
			}
			sbState, err := standby.eng.Get(ctx, []string{"k"})
			if err != nil || len(sbState) != 1 {
				t.Fatalf("standby Get(k) = %v, %v", sbState, err)
			}
			ownUsed, sbUsed := used(t, owner.eng, "k"), used(t, standby.eng, "k")
			if err := owner.eng.Import(ctx, sbState); err != nil {
				t.Fatal(err)
			}
			if err := standby.eng.Import(ctx, ownState); err != nil {
				t.Fatal(err)
			}
			// 10 hits shared, 3 on the owner only (never acknowledged), 5
			// on the standby only. The log keeps every hit once: 18. The
			// counters keep, where both sides recorded hits in the same
			// bucket (or bucket), the larger count: at least what each side
			// counts, never the shared hits twice.
			for name, h := range map[string]*harness{"owner": owner, "standby": standby} {
				u := used(t, h.eng, "k")
				switch {
				case algo == SlidingLog && u != 18:
					t.Errorf("%s counts %d hits after the merge; want 18 (10 shared, counted once, 3 and 5 of each)", name, u)
				case u < max(ownUsed, sbUsed) || u > ownUsed+sbUsed-9:
					t.Errorf("%s counts %d hits after the merge of %d (owner) and %d (standby), which share 10; want at least each, and the shared ones once", name, u, ownUsed, sbUsed)
				}
			}
		})
	}
}
