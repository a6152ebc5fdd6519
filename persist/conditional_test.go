package persist

import (
	"reflect"
	"slices"
	"testing"
)

// cond is an append written only over a value whose deadline is after at.
func cond(key string, deadline int64, value string, at int64) Record {
	r := app(key, deadline, value)
	r.IfLive = at
	return r
}

// TestConditionalAppend: a conditional append is written where the key
// holds a value whose deadline is after its IfLive, wherever that value is
// (written earlier in the same batch, in a batch before it that was not
// waited for, in the current overlay, in the frozen one under a checkpoint,
// in the data file), and left out, with the rest of its batch written, where
// the key holds none: never written, deleted in any of those places, or
// expired. What was left out stays out after a crash and replay.
func TestConditionalAppend(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	keys := []string{"bolt", "boltdel", "boltold", "frozen", "frozendel", "cur", "curold", "batch", "batchdel", "queued", "never", "plain"}

	submit(t, s, put("bolt", 100, "b0"), put("boltdel", 100, "d0"), put("boltold", 10, "o0"), put("frozendel", 100, "f0"))
	checkpoint(t, s)
	submit(t, s, del("boltdel"))
	checkpoint(t, s)
	submit(t, s, put("frozen", 100, "z0"), del("frozendel"))
	entered, release := blockCheckpoints(s)
	defer release()
	done := make(chan error, 1)
	go func() { done <- s.checkpointNow() }()
	<-entered
	submit(t, s, put("cur", 100, "c0"), put("curold", 10, "x0"))

	// Two batches, the second submitted before the first commits: the
	// second's appends see the first's records.
	first := s.Submit([]Record{put("queued", 100, "q0"), del("cur")}, nil)
	second := s.Submit([]Record{
		cond("bolt", 110, "+b1", 50),
		cond("boltdel", 110, "d1", 50),
		cond("boltold", 110, "o1", 50), // expired at 10
		cond("frozen", 110, "+z1", 50),
		cond("frozendel", 110, "f1", 50),
		cond("cur", 110, "c1", 50), // deleted by the first batch
		cond("curold", 110, "x1", 50),
		cond("batch", 110, "a1", 50), // nothing yet: out
		put("batch", 100, "a0"),
		cond("batch", 120, "+a2", 50), // over the put just before
		put("batchdel", 100, "e0"), del("batchdel"),
		cond("batchdel", 110, "e1", 50),
		cond("queued", 110, "+q1", 50),
		cond("never", 110, "n1", 50),
		app("plain", 110, "p1"), // not conditional: its bytes alone
		cond("plain", 130, "+p2", 100),
		cond("plain", 140, "+p3", 130), // the append before moved the deadline to 130: not after 130
	}, nil)
	for _, c := range []*Commit{first, second} {
		if err := wait(t, c); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := second.Skipped(), []int{1, 2, 4, 5, 6, 7, 12, 14, 17}; !slices.Equal(got, want) {
		t.Errorf("Skipped() = %v; want %v", got, want)
	}
	if got := first.Skipped(); len(got) != 0 {
		t.Errorf("Skipped() of a batch without conditional appends = %v; want none", got)
	}
	want := map[string]stored{
		"bolt":    {110, "b0+b1"},
		"boltold": {10, "o0"},
		"frozen":  {110, "z0+z1"},
		"curold":  {10, "x0"},
		"batch":   {120, "a0+a2"},
		"queued":  {110, "q0+q1"},
		"plain":   {130, "p1+p2"},
	}
	check := func(when string) {
		t.Helper()
		if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Get = %v; want %v", when, got, want)
		}
	}
	check("during a checkpoint")
	release()
	if err := <-done; err != nil {
		t.Fatalf("checkpoint = %v", err)
	}
	crash(t, s)
	s = openStore(t, o)
	check("after a crash and replay")
	checkIndex(t, s)

	// A batch whose every record is left out commits, and writes nothing.
	c := s.Submit([]Record{cond("never", 110, "n1", 50), cond("boltold", 110, "o1", 50)}, nil)
	if err := wait(t, c); err != nil {
		t.Fatal(err)
	}
	if got := c.Skipped(); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("Skipped() = %v; want [0 1]", got)
	}
	check("after a batch left out whole")
}

// TestConditionalAppendSweep: a value that the Sweep step of the same
// commit deletes holds nothing for a conditional append.
func TestConditionalAppendSweep(t *testing.T) {
	s := openStore(t, testOptions(t))
	submit(t, s, put("old", 10, "o0"), put("live", 100, "l0"))
	sweep := s.Sweep(20)
	c := s.Submit([]Record{cond("old", 50, "+o1", 5), cond("live", 120, "+l1", 5)}, nil)
	if err := wait(t, c); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, sweep); err != nil {
		t.Fatal(err)
	}
	// Whether the Sweep's step came first or not, "old" ends deleted or
	// with its append, never with the append's bytes alone.
	got := getAll(t, s, "old", "live")
	if o, ok := got["old"]; ok && o.Value != "o0+o1" {
		t.Errorf("old = %v; want deleted, or %q", o, "o0+o1")
	}
	if l := got["live"]; l != (stored{120, "l0+l1"}) {
		t.Errorf("live = %v; want %q@120", l, "l0+l1")
	}
}

// TestConditionalAppendInvalid: IfLive on a put or a deletion, or below 0,
// refuses the batch.
func TestConditionalAppendInvalid(t *testing.T) {
	s := openStore(t, testOptions(t))
	for _, r := range []Record{
		{Key: "p", Deadline: 10, Value: []byte("v"), IfLive: 5},
		{Key: "d", IfLive: 5},
		{Key: "a", Deadline: 10, Value: []byte("v"), Append: true, IfLive: -1},
	} {
		if err := wait(t, s.Submit([]Record{put("ok", 10, "v"), r}, nil)); err == nil {
			t.Errorf("Submit(%+v) = nil; want an error", r)
		}
	}
	if got := getAll(t, s, "ok", "p", "d", "a"); len(got) != 0 {
		t.Errorf("after refused batches: Get = %v; want nothing", got)
	}
}
