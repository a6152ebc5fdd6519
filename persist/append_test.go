package persist

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func app(key string, deadline int64, value string) Record {
	return Record{Key: key, Deadline: deadline, Value: []byte(value), Append: true}
}

// TestAppend: an append adds its bytes to the key's latest value, wherever
// that value is (the current overlay, the frozen one under a checkpoint, the
// data file), or is the value alone when the key has none (never written,
// deleted in any of those places); the key's deadline is the last record's;
// records of a key apply in order within a batch and across batches; and a
// replay after a crash finds the same values.
func TestAppend(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	long := strings.Repeat("L", 100) // past entry.small
	keys := []string{"cur", "grow", "batch", "frozen", "frozendel", "bolt", "boltdel", "curdel", "new", "afterdel", "x"}
	check := func(when string, want map[string]stored) {
		t.Helper()
		if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Get = %v; want %v", when, got, want)
		}
	}

	// In the data file.
	submit(t, s, put("bolt", 10, "b0"), put("boltdel", 10, "d0"), put("frozendel", 10, "f0"))
	checkpoint(t, s)
	submit(t, s, del("boltdel"))
	checkpoint(t, s)
	// Frozen under a checkpoint that waits.
	submit(t, s, put("frozen", 10, "z0"), del("frozendel"))
	entered, release := blockCheckpoints(s)
	defer release()
	done := make(chan error, 1)
	go func() { done <- s.checkpointNow() }()
	<-entered

	submit(t, s,
		put("cur", 10, "c0"), app("cur", 11, "+c1"),
		put("grow", 10, "g0"),
		app("batch", 5, "a"), app("batch", 7, "b"), app("batch", 6, "c"),
		app("frozen", 20, "+z1"),
		app("frozendel", 20, "f1"),
		app("bolt", 30, "+b1"),
		app("boltdel", 30, "d1"),
		put("curdel", 10, "old"), del("curdel"), app("curdel", 40, "c1"),
		app("new", 50, "n1"),
		put("afterdel", 10, "old"),
	)
	submit(t, s, app("grow", 12, "+"+long), app("cur", 13, "+c2"), del("afterdel"))
	submit(t, s, app("grow", 14, "+g2"), app("afterdel", 60, "a1"), app("x", 1, "x"), put("x", 2, "y"), app("x", 3, "z"))
	want := map[string]stored{
		"cur":       {13, "c0+c1+c2"},
		"grow":      {14, "g0+" + long + "+g2"},
		"batch":     {6, "abc"},
		"frozen":    {20, "z0+z1"},
		"frozendel": {20, "f1"},
		"bolt":      {30, "b0+b1"},
		"boltdel":   {30, "d1"},
		"curdel":    {40, "c1"},
		"new":       {50, "n1"},
		"afterdel":  {60, "a1"},
		"x":         {3, "yz"},
	}
	check("during a checkpoint", want)
	release()
	if err := <-done; err != nil {
		t.Fatalf("checkpoint = %v", err)
	}
	check("after the checkpoint", want)

	// The frozen overlay was checkpointed as it was frozen: replaying the
	// appends over it gives the same values.
	crash(t, s)
	s = openStore(t, o)
	check("after a crash and replay", want)

	// Over the data file, again.
	submit(t, s, app("bolt", 31, "+b2"), put("grow", 15, "g"), app("grow", 16, "+g3"))
	want["bolt"] = stored{31, "b0+b1+b2"}
	want["grow"] = stored{16, "g+g3"}
	check("after appends over the data file", want)
	checkpoint(t, s)
	check("after a checkpoint", want)
	checkIndex(t, s)
	if got, wantNext := s.NextDeadline(), int64(3); got != wantNext {
		t.Errorf("NextDeadline() = %d; want %d", got, wantNext)
	}
}

// TestAppendInline: an append that makes a value outgrow the entry's inline
// array moves it to a heap array; puts and appends after that, shorter or
// longer, keep every value exact.
func TestAppendInline(t *testing.T) {
	s := openStore(t, testOptions(t))
	var want []byte
	step := func(r Record) {
		t.Helper()
		submit(t, s, r)
		if r.Append {
			want = append(want, r.Value...)
		} else {
			want = append(want[:0], r.Value...)
		}
		got := getAll(t, s, "k")["k"]
		if got.Value != string(want) || got.Deadline != r.Deadline {
			t.Fatalf("after %s of %d bytes: Get = %q@%d; want %q@%d", op(r), len(r.Value), got.Value, got.Deadline, want, r.Deadline)
		}
	}
	fill := func(n int, c byte) string { return strings.Repeat(string(c), n) }
	step(put("k", 1, fill(10, 'a')))
	step(app("k", 2, fill(50, 'b')))  // 60: inline
	step(app("k", 3, fill(4, 'c')))   // 64: inline, full
	step(app("k", 4, fill(1, 'd')))   // 65: heap
	step(put("k", 5, fill(3, 'e')))   // short put into the heap array
	step(app("k", 6, fill(200, 'f'))) // grows it
	step(put("k", 7, fill(300, 'g')))
	step(put("k", 8, ""))
	step(app("k", 9, fill(1, 'h')))
	step(app("k", 10, fill(70, 'i')))
}

func op(r Record) string {
	switch {
	case r.Value == nil:
		return "delete"
	case r.Append:
		return "append"
	}
	return "put"
}

// TestOverlayAppend: the overlay's append, in every case of where the value
// is and of the length limit; the deadline heap follows the deadline.
func TestOverlayAppend(t *testing.T) {
	tests := []struct {
		name   string
		before []Record // applied to the overlay first
		base   string   // the value under the overlay ("" for none)
		limit  int
		value  string
		want   string
		wantOK bool
	}{
		{"no entry, no base", nil, "", 10, "v", "v", true},
		{"no entry, base", nil, "base", 10, "+v", "base+v", true},
		{"no entry, base too long", nil, "base", 5, "+v", "+v", false},
		{"put", []Record{put("k", 5, "put")}, "base", 10, "+v", "put+v", true},
		{"put, exactly the limit", []Record{put("k", 5, "put")}, "", 5, "+v", "put+v", true},
		{"put, too long", []Record{put("k", 5, "put")}, "", 4, "+v", "+v", false},
		{"empty put", []Record{put("k", 5, "")}, "base", 10, "v", "v", true},
		{"deletion", []Record{put("k", 5, "put"), del("k")}, "base", 10, "v", "v", true},
		{"past the inline array", []Record{put("k", 5, strings.Repeat("p", 60))}, "", 100, "+v+v+v", strings.Repeat("p", 60) + "+v+v+v", true},
		{"past the inline array from a base", nil, strings.Repeat("b", 64), 100, "+v", strings.Repeat("b", 64) + "+v", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOverlay()
			for _, r := range tt.before {
				if r.Value == nil {
					o.del(r.Key)
				} else {
					o.put(r.Key, r.Deadline, r.Value)
				}
			}
			var base []byte
			if tt.base != "" {
				base = []byte(tt.base)
			}
			ok := o.appendTo(o.m.get("k"), "k", 3, []byte(tt.value), base, tt.limit)
			e := o.m.get("k")
			if ok != tt.wantOK || e == nil || string(e.value) != tt.want || e.deadline != 3 || e.del {
				t.Fatalf("appendTo(%q) = %t, entry %+v; want %t, %q@3", tt.value, ok, e, tt.wantOK, tt.want)
			}
			if it, found := o.settle(nil); !found || it.deadline != 3 {
				t.Errorf("heap top = %v, %t; want deadline 3", it.deadline, found)
			}
			if tt.base != "" && string(base) != tt.base {
				t.Errorf("base modified to %q", base)
			}
		})
	}
}

// TestAppendReplay: a store that stops without Close (kill -9: neither
// the overlay nor the queue reaches the data file) replays appends whose
// values are in the WAL, in the data file, or in both, and gets the
// concatenations; twice in a row, and from a copy of the files taken while
// the store was open.
func TestAppendReplay(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("a", 10, "a0"), put("b", 10, "b0"), put("gone", 10, "g0"))
	checkpoint(t, s) // a, b, gone in the data file
	submit(t, s, app("a", 11, "+a1"), put("c", 10, "c0"), del("gone"))
	submit(t, s, app("c", 12, "+c1"), app("a", 13, "+a2"), app("gone", 14, "g1"), app("d", 15, "d0"))
	submit(t, s, app("c", 16, "+c2"), app("b", 17, "+b1"))
	want := map[string]stored{"a": {13, "a0+a1+a2"}, "b": {17, "b0+b1"}, "c": {16, "c0+c1+c2"}, "d": {15, "d0"}, "gone": {14, "g1"}}
	crash(t, s)

	s = openStore(t, o)
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after a crash: records = %v; want %v", got, want)
	}
	checkIndex(t, s) // a checkpoint: everything is in the data file now
	submit(t, s, app("a", 18, "+a3"), app("d", 19, "+d1"))
	want["a"] = stored{18, "a0+a1+a2+a3"}
	want["d"] = stored{19, "d0+d1"}
	crash(t, s)

	s = openStore(t, o)
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after a second crash: records = %v; want %v", got, want)
	}
	submit(t, s, app("b", 20, "+b2"), app("e", 21, "e0"), app("e", 22, "+e1"))
	want["b"] = stored{20, "b0+b1+b2"}
	want["e"] = stored{22, "e0+e1"}
	// Copy the files of the open store, as the disk holds them after a kill
	// -9 (ModeCommit writes the WAL with write(2); the data file is idle).
	copied := filepath.Join(t.TempDir(), "copy.db")
	copyFile(t, o.Path, copied)
	for _, f := range walFiles(t, o.Path) {
		copyFile(t, f.path, copied+strings.TrimPrefix(f.path, o.Path))
	}
	oc := o
	oc.Path = copied
	c := openStore(t, oc)
	if got := dump(t, c); !reflect.DeepEqual(got, want) {
		t.Errorf("from a copy of the open store: records = %v; want %v", got, want)
	}
	checkIndex(t, c)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAppendTornTail: an append in the torn last frame of a WAL is ignored
// with its frame; the appends before it are replayed.
func TestAppendTornTail(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("k", 10, "k0"))
	checkpoint(t, s)
	submit(t, s, app("k", 11, "+k1"))
	submit(t, s, app("k", 12, "+k2"))
	crash(t, s)
	files := walFiles(t, o.Path)
	last := files[len(files)-1].path
	b := readFile(t, last)
	writeFile(t, last, b[:len(b)-2])

	s = openStore(t, o)
	if got, want := dump(t, s), map[string]stored{"k": {11, "k0+k1"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("after a torn append: records = %v; want %v", got, want)
	}
}

// writeWAL writes a WAL file of the given format version whose frames
// (numbered from 1) hold recs, one batch per frame.
func writeWAL(t *testing.T, path string, gen uint64, version uint32, frames ...[]Record) string {
	t.Helper()
	b := append([]byte(walMagic), binary.LittleEndian.AppendUint32(nil, version)...)
	b = binary.LittleEndian.AppendUint32(b, 0)
	var e frameEncoder
	for i, recs := range frames {
		e.begin(uint64(i + 1))
		for i := range recs {
			e.record(&recs[i])
		}
		frame, err := e.end()
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, frame...)
	}
	name := walName(path, gen)
	writeFile(t, name, b)
	return name
}

// TestWALVersions: WAL files of format version 1 (written by the previous
// release) are replayed; this build writes version 2; an append in a
// version 1 file, an empty append, or an unknown version is ErrFormat, with
// the files left as they were.
func TestWALVersions(t *testing.T) {
	t.Run("version 1 replays", func(t *testing.T) {
		o := testOptions(t)
		makeStore(t, o.Path, 0) // its Close checkpointed WAL generation 1
		writeWAL(t, o.Path, 2, 1,
			[]Record{put("a", 10, "a0"), put("b", 20, "b0")},
			[]Record{del("a"), put("c", 30, "c0")},
		)
		s := openStore(t, o)
		if got, want := dump(t, s), map[string]stored{"b": {20, "b0"}, "c": {30, "c0"}}; !reflect.DeepEqual(got, want) {
			t.Errorf("after replaying a version 1 WAL: records = %v; want %v", got, want)
		}
		submit(t, s, app("b", 21, "+b1"))
		crash(t, s)
		files := walFiles(t, o.Path)
		if len(files) != 1 {
			t.Fatalf("WAL files %v; want 1", files)
		}
		if v := binary.LittleEndian.Uint32(readFile(t, files[0].path)[len(walMagic):]); v != 2 {
			t.Errorf("new WAL file of format version %d; want 2", v)
		}
		s = openStore(t, o)
		if got, want := dump(t, s), map[string]stored{"b": {21, "b0+b1"}, "c": {30, "c0"}}; !reflect.DeepEqual(got, want) {
			t.Errorf("after replaying a version 2 WAL: records = %v; want %v", got, want)
		}
	})
	tests := []struct {
		name    string
		version uint32
		recs    []Record
		want    string
	}{
		{"append in version 1", 1, []Record{put("a", 10, "a0"), app("a", 11, "+a1")}, "an append, in a file of WAL format version 1"},
		{"empty append", 2, []Record{{Key: "a", Deadline: 11, Value: []byte{}, Append: true}}, "an append of nothing"},
		{"version 0", 0, []Record{put("a", 10, "a0")}, "WAL format version 0; this build reads versions 1 to 2 only"},
		{"version 3", 3, []Record{put("a", 10, "a0")}, "WAL format version 3; this build reads versions 1 to 2 only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			makeStore(t, o.Path, 0)
			wal := writeWAL(t, o.Path, 2, tt.version, []Record{put("z", 5, "z")}, tt.recs)
			beforeWAL, beforeDB := readFile(t, wal), readFile(t, o.Path)
			s, err := Open(o)
			if err == nil {
				s.Close()
				t.Fatalf("Open with %s = nil error; want ErrFormat", tt.name)
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), wal) {
				t.Errorf("Open with %s = %v; want ErrFormat naming %s and saying %q", tt.name, err, wal, tt.want)
			}
			if !bytes.Equal(readFile(t, wal), beforeWAL) || !bytes.Equal(readFile(t, o.Path), beforeDB) {
				t.Errorf("Open with %s modified the WAL or the data file", tt.name)
			}
		})
	}
}

// TestInvalidAppend: a batch with an invalid append is refused whole, with
// an error that says what is wrong, and nothing of it is written.
func TestInvalidAppend(t *testing.T) {
	s := openStore(t, testOptions(t))
	submit(t, s, put("k", 10, "k0"))
	tests := []struct {
		name string
		bad  Record
		want string
	}{
		{"nil value", Record{Key: "k", Deadline: 11, Append: true}, "appends an empty value"},
		{"empty value", Record{Key: "k", Deadline: 11, Value: []byte{}, Append: true}, "appends an empty value"},
		{"zero deadline", app("k", 0, "v"), "deadline 0"},
		{"negative deadline", app("k", -1, "v"), "deadline -1"},
		{"empty key", app("", 11, "v"), "empty key"},
	}
	for _, tt := range tests {
		var got error
		called := false
		c := s.Submit([]Record{app("k", 12, "+good"), put("other", 5, "o"), tt.bad}, func(err error) { called, got = true, err })
		if !called || got == nil || !strings.Contains(got.Error(), tt.want) || !strings.Contains(got.Error(), "nothing of the batch was written") {
			t.Errorf("%s: Submit: done called %t with %v; want called at once with an error saying %q and that nothing was written", tt.name, called, got, tt.want)
		}
		if err := wait(t, c); err != got {
			t.Errorf("%s: Err() = %v; want %v", tt.name, err, got)
		}
	}
	if got, want := dump(t, s), map[string]stored{"k": {10, "k0"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("records after invalid batches = %v; want %v", got, want)
	}
}

// logCounter is a slog handler that counts the records whose message
// contains a string, and passes every record on to t.Log.
type logCounter struct {
	slog.Handler
	substr string
	mu     *sync.Mutex
	n      *int
}

func (h logCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		h.mu.Lock()
		*h.n++
		h.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h logCounter) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

// TestAppendTooLong: an append that would make a value longer than the
// store keeps stores its bytes alone, whether the value is in the overlay or
// in the data file; the commit succeeds, and one warning is logged.
func TestAppendTooLong(t *testing.T) {
	o := testOptions(t)
	var (
		mu       sync.Mutex
		warnings int
	)
	o.Logger = slog.New(logCounter{Handler: o.Logger.Handler(), substr: "longer than", mu: &mu, n: &warnings})
	s := openStore(t, o)
	s.w.maxValue = 10 // the writer is idle: it reads it after the first send
	submit(t, s, put("k", 1, "0123456"), app("k", 2, "789"))
	submit(t, s, app("k", 3, "ab"), put("d", 1, "0123456789"))
	checkpoint(t, s)
	submit(t, s, app("d", 2, "x"), app("d", 3, "y"))
	want := map[string]stored{"k": {3, "ab"}, "d": {3, "xy"}}
	if got := getAll(t, s, "k", "d"); !reflect.DeepEqual(got, want) {
		t.Errorf("Get = %v; want %v", got, want)
	}
	checkpoint(t, s)
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after a checkpoint: records = %v; want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if warnings != 1 {
		t.Errorf("%d warnings about values too long; want 1", warnings)
	}
}

// TestAppendDuringSweep: while the data file's part of a Sweep pass may
// still run, an append to a key only the data file holds, expired as of the
// pass, stores its bytes alone (the pass was queued first), live and after a
// crash; a key the pass does not expire keeps its value; once the pass is
// over, an expired value nobody deleted is appended to.
func TestAppendDuringSweep(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("old", 10, "o0"), put("live", 100, "l0"))
	checkpoint(t, s)

	// Keep the checkpointer busy, so that the pass waits behind it.
	submit(t, s, put("x", 200, "x"))
	entered, release := blockCheckpoints(s)
	defer release()
	done := make(chan error, 1)
	go func() { done <- s.checkpointNow() }()
	<-entered
	sweep := s.Sweep(20)
	if err := s.Flush(); err != nil { // the overlay part is committed now
		t.Fatal(err)
	}
	submit(t, s, app("old", 50, "+o1"), app("live", 120, "+l1"))
	want := map[string]stored{"old": {50, "+o1"}, "live": {120, "l0+l1"}, "x": {200, "x"}}
	keys := []string{"old", "live", "x"}
	if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
		t.Errorf("during the pass: Get = %v; want %v", got, want)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := wait(t, sweep); err != nil {
		t.Fatalf("Sweep(20) = %v", err)
	}
	if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
		t.Errorf("after the pass: Get = %v; want %v", got, want)
	}

	// After the pass: an expired record written since is a value like any.
	submit(t, s, put("late", 15, "t0"))
	checkpoint(t, s)
	submit(t, s, app("late", 60, "+t1"))
	want["late"] = stored{60, "t0+t1"}
	keys = append(keys, "late")
	crash(t, s)

	s = openStore(t, o)
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after a crash: records = %v; want %v", got, want)
	}
	checkIndex(t, s)
}

// TestAppendWALBytes: the WAL bytes of an append are those of its own
// bytes, whatever the length of the value it adds to.
func TestAppendWALBytes(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	const key = "tenant/user"
	submit(t, s, put(key, 10, strings.Repeat("v", 4000)))
	checkpoint(t, s)
	wal := walFiles(t, o.Path)[0].path
	// A frame: header, sequence number and count, then the record.
	const perCommit = frameHeaderLen + frameMinBody + 1 + 1 + len(key) + 8 + 1 + 8
	for i := range 50 {
		before := fileSize(t, wal)
		submit(t, s, app(key, int64(11+i), "12345678"))
		if got := fileSize(t, wal) - before; got != int64(perCommit) {
			t.Fatalf("append %d onto a value of %d bytes: the WAL grew by %d bytes; want %d", i, 4000+8*i, got, perCommit)
		}
	}
}

// TestAppendModel: random puts, appends, deletions, sweeps, checkpoints
// (explicit, and started by tiny thresholds, so that appends meet frozen
// overlays), crashes and reopenings over a few keys, batches mixing them,
// checked after every step against a map: an append adds to the model's
// value, or is the value alone when the key has none.
func TestAppendModel(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			o := testOptions(t)
			o.Logger = nil
			o.CheckpointKeys = 4
			o.CheckpointBytes = 2 << 10
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if s != nil {
					s.Close()
				}
			}()
			rng := rand.New(rand.NewPCG(seed, 42))
			keys := []string{"a", "b", "c", "d", "e", "f"}
			model := make(map[string]stored)
			now := int64(1000)
			value := func(step, i int) []byte {
				n := 1 + rng.IntN(24)
				if rng.IntN(8) == 0 {
					n = 60 + rng.IntN(120) // across entry.small
				}
				b := fmt.Appendf(nil, "<%d.%d:", step, i)
				for len(b) < n {
					b = append(b, byte('a'+rng.IntN(26)))
				}
				return append(b, '>')
			}
			for step := range 1500 {
				switch op := rng.IntN(100); {
				case op < 80:
					var recs []Record
					for i := range 1 + rng.IntN(4) {
						k := keys[rng.IntN(len(keys))]
						d := now + 1 + rng.Int64N(300)
						switch kind := rng.IntN(10); {
						case kind < 6:
							r := Record{Key: k, Deadline: d, Value: value(step, i), Append: true}
							recs = append(recs, r)
							m := model[k]
							model[k] = stored{d, m.Value + string(r.Value)}
						case kind < 9:
							r := Record{Key: k, Deadline: d, Value: value(step, i)}
							recs = append(recs, r)
							model[k] = stored{d, string(r.Value)}
						default:
							recs = append(recs, del(k))
							delete(model, k)
						}
					}
					submit(t, s, recs...)
				case op < 86:
					now += rng.Int64N(100)
					if err := wait(t, s.Sweep(now)); err != nil {
						t.Fatalf("step %d: Sweep(%d) = %v", step, now, err)
					}
					for k, r := range model {
						if r.Deadline <= now {
							delete(model, k)
						}
					}
				case op < 92:
					checkpoint(t, s)
				case op < 96:
					crash(t, s)
					s = nil
					if s, err = Open(o); err != nil {
						t.Fatalf("step %d: Open after a crash = %v", step, err)
					}
				default:
					if err := s.Close(); err != nil {
						t.Fatalf("step %d: Close() = %v", step, err)
					}
					s = nil
					if s, err = Open(o); err != nil {
						t.Fatalf("step %d: Open after Close = %v", step, err)
					}
				}
				if got := getAll(t, s, keys...); !reflect.DeepEqual(got, model) {
					t.Fatalf("step %d: records %v; want %v", step, got, model)
				}
			}
			checkIndex(t, s)
		})
	}
}

// TestCheckpointInterrupted: a checkpoint is written in transactions of
// maxTxKeys records; a crash between two of them leaves some keys with
// their final values in the data file and their records still in the WAL.
// The replay applies those records again only where the data file lacks
// them: each append once. Twice: after one transaction of a checkpoint
// failed, and after a retry of it failed earlier than the first attempt.
func TestCheckpointInterrupted(t *testing.T) {
	for _, failAt := range [][]int{{2}, {3, 2}} {
		t.Run(fmt.Sprint(failAt), func(t *testing.T) {
			o := testOptions(t)
			s := openStore(t, o)
			const n = 3*maxTxKeys + 10
			want := make(map[string]stored, n)
			var base, apps []Record
			for i := range n {
				k := fmt.Sprintf("k%05d", i)
				base = append(base, put(k, 10, "v"))
				apps = append(apps, app(k, 20, "+a"))
				want[k] = stored{20, "v+a"}
			}
			submit(t, s, base...)
			checkpoint(t, s)
			submit(t, s, apps...)
			for _, fail := range failAt {
				var txs atomic.Int32
				s.ck.beforeCommit = func(*bolt.Tx) error {
					if txs.Add(1) == int32(fail) {
						return errors.New("injected")
					}
					return nil
				}
				if err := s.checkpointNow(); err == nil {
					t.Fatalf("checkpoint failing at transaction %d = nil; want the error", fail)
				}
			}
			crash(t, s)

			s = openStore(t, o)
			got := dump(t, s)
			bad := 0
			for k, w := range want {
				if got[k] != w {
					if bad++; bad <= 3 {
						t.Errorf("after the crash: %s = %v; want %v", k, got[k], w)
					}
				}
			}
			if bad > 0 || len(got) != n {
				t.Errorf("after the crash: %d of %d keys wrong, %d keys stored", bad, n, len(got))
			}
			checkIndex(t, s)
		})
	}
}
