package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/scripts/testkit"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(crashChildEnv); path != "" {
		start, _ := strconv.Atoi(os.Getenv("SLUICE_PERSIST_CRASH_START"))
		runCrashChild(path, start)
		return
	}
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait of a test; nothing should take nearly as long.
const waitTimeout = 20 * time.Second

// testWriter routes log lines to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testOptions returns options for a new file in a fresh temporary directory
// (whose parent directories Open must create).
func testOptions(t testing.TB) Options {
	return Options{
		Path:        filepath.Join(t.TempDir(), "data", "node", "sluice.db"),
		OpenTimeout: 50 * time.Millisecond,
		Logger:      testLogger(t),
	}
}

// openStore opens a store that is closed when the test ends.
func openStore(t testing.TB, o Options) *Store {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatalf("Open(%q) = %v; want no error", o.Path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v; want nil", err)
		}
	})
	return s
}

// wait waits for c, failing the test after waitTimeout.
func wait(t testing.TB, c *Commit) error {
	t.Helper()
	select {
	case <-c.Done():
		return c.Err()
	case <-time.After(waitTimeout):
		t.Fatalf("commit not done after %v", waitTimeout)
		return nil
	}
}

// submit submits recs and waits for them to commit.
func submit(t testing.TB, s *Store, recs ...Record) {
	t.Helper()
	if err := wait(t, s.Submit(recs, nil)); err != nil {
		t.Fatalf("Submit(%v) = %v; want nil", recs, err)
	}
}

func put(key string, deadline int64, value string) Record {
	return Record{Key: key, Deadline: deadline, Value: []byte(value)}
}

func del(key string) Record { return Record{Key: key} }

// stored is a record as read back.
type stored struct {
	Deadline int64
	Value    string
}

func (r stored) String() string { return fmt.Sprintf("%q@%d", r.Value, r.Deadline) }

// getAll reads keys with one Get; missing keys are absent from the map.
func getAll(t testing.TB, s *Store, keys ...string) map[string]stored {
	t.Helper()
	got := make(map[string]stored)
	err := s.Get(keys, func(i int, deadline int64, value []byte) {
		got[keys[i]] = stored{deadline, string(value)}
	})
	if err != nil {
		t.Fatalf("Get(%q) = %v; want nil", keys, err)
	}
	return got
}

// dump returns every stored record.
func dump(t testing.TB, s *Store) map[string]stored {
	t.Helper()
	got := make(map[string]stored)
	err := s.Scan("", "", 0, func(key string, deadline int64, value []byte) bool {
		got[key] = stored{deadline, string(value)}
		return true
	})
	if err != nil {
		t.Fatalf("Scan() = %v; want nil", err)
	}
	return got
}

// checkpoint waits until every committed record is in the data file.
func checkpoint(t testing.TB, s *Store) {
	t.Helper()
	if err := s.checkpointNow(); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
}

// checkIndex checkpoints, then checks that every record has an entry in
// the expiry index at or before its deadline, so that a Sweep reaches it in
// time (entries are lower bounds; an entry whose record is gone waits for a
// Sweep to drop it).
func checkIndex(t testing.TB, s *Store) {
	t.Helper()
	checkpoint(t, s)
	err := s.db.View(func(tx *bolt.Tx) error {
		first := make(map[string]uint64) // key → its earliest entry
		err := tx.Bucket(bucketExpiry).ForEach(func(k, _ []byte) error {
			key, d := string(k[8:]), binary.BigEndian.Uint64(k)
			if f, ok := first[key]; !ok || d < f {
				first[key] = d
			}
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
			d := binary.BigEndian.Uint64(v)
			if f, ok := first[string(k)]; !ok || f > d {
				t.Errorf("record %q (deadline %d) has no expiry index entry at or before its deadline (earliest: %d, found %t)", k, d, f, ok)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("reading the index: %v", err)
	}
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{"commit", ModeCommit, false},
		{"fsync", ModeFsync, false},
		{"async", ModeAsync, false},
		{"", 0, true},
		{"Commit", 0, true},
		{"sync", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseMode(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseMode(%q) = %v, %v; want %v, error %t", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "commit, fsync or async") {
			t.Errorf("ParseMode(%q) error %q does not list the valid names", tt.in, err)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("ParseMode(%q).String() = %q; want %q", tt.in, got.String(), tt.in)
		}
	}
	if got, want := Mode(9).String(), "mode(9)"; got != want {
		t.Errorf("Mode(9).String() = %q; want %q", got, want)
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		o       Options
		wantErr string // "" = valid
	}{
		{"defaults", Options{Path: "x"}, ""},
		{"DefaultOptions", DefaultOptions("x"), ""},
		{"no path", Options{}, "Path is empty"},
		{"bad mode", Options{Path: "x", Mode: 7}, "unknown Mode 7"},
		{"negative timeout", Options{Path: "x", OpenTimeout: -1}, "OpenTimeout"},
		{"negative queue", Options{Path: "x", MaxQueue: -1}, "MaxQueue"},
		{"negative tx", Options{Path: "x", MaxTxRecords: -1}, "MaxTxRecords"},
		{"negative checkpoint keys", Options{Path: "x", CheckpointKeys: -1}, "CheckpointKeys"},
		{"negative checkpoint memory", Options{Path: "x", CheckpointMemory: -1}, "CheckpointMemory"},
		{"negative checkpoint bytes", Options{Path: "x", CheckpointBytes: -1}, "CheckpointBytes"},
	}
	for _, tt := range tests {
		err := tt.o.Validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: Validate() = %v; want nil", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: Validate() = %v; want an error containing %q", tt.name, err, tt.wantErr)
		}
		if tt.wantErr != "" {
			if _, err := Open(tt.o); err == nil {
				t.Errorf("%s: Open() = nil error; want the Validate error", tt.name)
			}
		}
	}
}

// TestRoundTrip writes batches one after the other and reads every key back
// after each, also after closing and reopening the file.
func TestRoundTrip(t *testing.T) {
	keys := []string{"a", "b", "c", "missing"}
	steps := []struct {
		name string
		recs []Record
		want map[string]stored
	}{
		{"put", []Record{put("a", 10, "v1"), put("b", 20, "v2")},
			map[string]stored{"a": {10, "v1"}, "b": {20, "v2"}}},
		{"overwrite same deadline", []Record{put("a", 10, "v1b")},
			map[string]stored{"a": {10, "v1b"}, "b": {20, "v2"}}},
		{"move deadline", []Record{put("b", 5, "v2b")},
			map[string]stored{"a": {10, "v1b"}, "b": {5, "v2b"}}},
		{"empty value", []Record{put("c", 7, "")},
			map[string]stored{"a": {10, "v1b"}, "b": {5, "v2b"}, "c": {7, ""}}},
		{"delete", []Record{del("a"), del("missing")},
			map[string]stored{"b": {5, "v2b"}, "c": {7, ""}}},
		{"binary value", []Record{put("a", 1<<62, "\x00\xff\x00")},
			map[string]stored{"a": {1 << 62, "\x00\xff\x00"}, "b": {5, "v2b"}, "c": {7, ""}}},
	}
	o := testOptions(t)
	s := openStore(t, o)
	for _, step := range steps {
		submit(t, s, step.recs...)
		if got := getAll(t, s, keys...); !reflect.DeepEqual(got, step.want) {
			t.Errorf("after %s: Get(%q) = %v; want %v", step.name, keys, got, step.want)
		}
		checkIndex(t, s)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	s = openStore(t, o)
	want := steps[len(steps)-1].want
	if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: Get(%q) = %v; want %v", keys, got, want)
	}
	if got, want := s.NextDeadline(), int64(5); got != want {
		t.Errorf("after reopen: NextDeadline() = %d; want %d", got, want)
	}
}

// TestLaterRecordWins: records of one key submitted later win, within a
// batch and across batches of one transaction, and the index keeps one
// entry per key.
func TestLaterRecordWins(t *testing.T) {
	s := openStore(t, testOptions(t))

	// One batch.
	submit(t, s,
		put("a", 10, "a1"), put("b", 30, "b1"), put("a", 20, "a2"),
		put("c", 5, "c1"), del("c"),
		del("d"), put("d", 40, "d1"),
		put("b", 30, "b2"), del("b"), put("b", 35, "b3"),
	)
	want := map[string]stored{"a": {20, "a2"}, "b": {35, "b3"}, "d": {40, "d1"}}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("one batch: records = %v; want %v", got, want)
	}
	checkIndex(t, s)

	// Many batches queued together: most share transactions.
	var commits []*Commit
	for i := range 200 {
		commits = append(commits, s.Submit([]Record{put("k", int64(1000-i), fmt.Sprint(i))}, nil))
		if i%7 == 0 {
			commits = append(commits, s.Submit([]Record{del("k")}, nil))
		}
	}
	commits = append(commits, s.Submit([]Record{put("k", 999, "last")}, nil))
	for _, c := range commits {
		if err := wait(t, c); err != nil {
			t.Fatalf("Submit: %v", err)
		}
	}
	if got, want := getAll(t, s, "k"), map[string]stored{"k": {999, "last"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("many batches: Get(k) = %v; want %v", got, want)
	}
	checkIndex(t, s)
	if got, want := s.NextDeadline(), int64(20); got != want {
		t.Errorf("NextDeadline() = %d; want %d", got, want)
	}
}

// TestCommitsGroupOnOneCore: on one P, records that many goroutines
// submit at once share WAL writes. The writer used to run as soon as the
// first record was queued and write it alone: a write(2) per decision on a
// node with one core.
func TestCommitsGroupOnOneCore(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const (
		goroutines = 64
		rounds     = 20
	)
	o := testOptions(t)
	var txs, recs atomic.Int64
	o.OnCommit = func(records int, d time.Duration) {
		txs.Add(1)
		recs.Add(int64(records))
	}
	s := openStore(t, o)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for r := range rounds {
				c := s.Submit([]Record{put(fmt.Sprintf("g%02d", g), int64(r+1), "v")}, nil)
				if err := wait(t, c); err != nil {
					t.Errorf("Commit.Err() = %v; want nil", err)
				}
			}
		})
	}
	wg.Wait()
	if n := recs.Load(); n != goroutines*rounds {
		t.Fatalf("%d records committed; want %d", n, goroutines*rounds)
	}
	// Each round's 64 records are submitted at once; a round in one write
	// and a half in another is the most this allows. Without the writer's
	// yield: 1,280 commits, or 34 to 55 under the race detector (whose
	// instrumentation gives the writer's first record time to gather
	// company); with it, 22 or 23.
	if n := txs.Load(); n > rounds*3/2 {
		t.Errorf("%d records in %d commits; want at most %d: the records submitted at once share a write", recs.Load(), n, rounds*3/2)
	}
}

// TestConcurrentSubmit: many goroutines submit batches at once through a
// small queue and small transactions; every done callback runs once, in
// submission order per goroutine, and all data is there after Close and
// reopen.
func TestConcurrentSubmit(t *testing.T) {
	const (
		goroutines = 16
		batches    = 100
		keysPer    = 20
	)
	o := testOptions(t)
	o.MaxQueue = 4
	o.MaxTxRecords = 50
	var txs atomic.Int64
	o.OnCommit = func(records int, d time.Duration) { txs.Add(1) }
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}

	var (
		wg        sync.WaitGroup
		callbacks atomic.Int64
		mu        sync.Mutex
		want      = make(map[string]stored)
	)
	for g := range goroutines {
		wg.Go(func() {
			final := make(map[string]stored)
			var commits []*Commit
			var last atomic.Int64 // last batch acknowledged, to check the order
			for b := range batches {
				var recs []Record
				for r := range 1 + b%10 {
					key := fmt.Sprintf("g%02d/k%02d", g, (b*7+r)%keysPer)
					if (b+r)%5 == 0 {
						recs = append(recs, del(key))
						delete(final, key)
						continue
					}
					rec := put(key, int64(1+b*10+r), fmt.Sprintf("g%d b%d r%d", g, b, r))
					recs = append(recs, rec)
					final[key] = stored{rec.Deadline, string(rec.Value)}
				}
				commits = append(commits, s.Submit(recs, func(err error) {
					if err != nil {
						t.Errorf("done(%v); want nil", err)
					}
					if prev := last.Swap(int64(b)); b > 0 && prev != int64(b-1) {
						t.Errorf("goroutine %d: batch %d acknowledged after batch %d; want submission order", g, b, prev)
					}
					callbacks.Add(1)
				}))
			}
			for _, c := range commits {
				if err := wait(t, c); err != nil {
					t.Errorf("Commit.Err() = %v; want nil", err)
				}
			}
			mu.Lock()
			for k, v := range final {
				want[k] = v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if got, want := callbacks.Load(), int64(goroutines*batches); got != want {
		t.Errorf("done callbacks = %d; want %d", got, want)
	}
	t.Logf("%d batches in %d transactions", goroutines*batches, txs.Load())

	s = openStore(t, o)
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: %d records, want %d; first difference: %s", len(got), len(want), firstDiff(got, want))
	}
	checkIndex(t, s)
}

func firstDiff(got, want map[string]stored) string {
	keys := make([]string, 0, len(got)+len(want))
	for k := range got {
		keys = append(keys, k)
	}
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		g, gok := got[k]
		w, wok := want[k]
		if g != w || gok != wok {
			return fmt.Sprintf("key %q = %v (found %t); want %v (found %t)", k, g, gok, w, wok)
		}
	}
	return "none"
}

// TestCloseCommitsQueued: Close commits everything queued before it and
// acknowledges it before returning.
func TestCloseCommitsQueued(t *testing.T) {
	for _, mode := range []Mode{ModeCommit, ModeFsync, ModeAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			o := testOptions(t)
			o.Mode = mode
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			if s.Mode() != mode || s.Path() != o.Path {
				t.Errorf("Mode(), Path() = %v, %q; want %v, %q", s.Mode(), s.Path(), mode, o.Path)
			}
			if got, want := s.db.NoSync, mode != ModeFsync; got != want {
				t.Errorf("bbolt NoSync = %t; want %t", got, want)
			}
			const n = 500
			var done atomic.Int64
			commits := make([]*Commit, n)
			for i := range n {
				commits[i] = s.Submit([]Record{put(fmt.Sprintf("k%04d", i), int64(i+1), "v")}, func(err error) {
					if err == nil {
						done.Add(1)
					}
				})
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close() = %v; want nil", err)
			}
			if got := done.Load(); got != n {
				t.Errorf("done(nil) callbacks when Close returned = %d; want %d", got, n)
			}
			for i, c := range commits {
				select {
				case <-c.Done():
				default:
					t.Fatalf("commit %d not done when Close returned", i)
				}
			}
			s = openStore(t, o)
			if got := len(dump(t, s)); got != n {
				t.Errorf("after reopen: %d records; want %d", got, n)
			}
		})
	}
}

// TestClosed: after Close nothing is accepted and every call says so.
func TestClosed(t *testing.T) {
	s, err := Open(testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close() = %v; want nil", err)
	}

	var got error
	called := false
	c := s.Submit([]Record{put("a", 1, "v")}, func(err error) { called, got = true, err })
	if !called || !errors.Is(got, ErrClosed) {
		t.Errorf("Submit after Close: done called %t with %v; want called before Submit returns, with ErrClosed", called, got)
	}
	select {
	case <-c.Done():
	default:
		t.Errorf("Submit after Close: Commit not done")
	}
	if err := c.Err(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), s.Path()) {
		t.Errorf("Submit after Close: Err() = %v; want ErrClosed naming %s", err, s.Path())
	}
	if err := s.Flush(); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close = %v; want ErrClosed", err)
	}
	if err := wait(t, s.Sweep(10)); !errors.Is(err, ErrClosed) {
		t.Errorf("Sweep after Close = %v; want ErrClosed", err)
	}
	if err := s.Get([]string{"a"}, func(int, int64, []byte) {}); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close = %v; want ErrClosed", err)
	}
	if err := s.Scan("", "", 0, func(string, int64, []byte) bool { return true }); !errors.Is(err, ErrClosed) {
		t.Errorf("Scan after Close = %v; want ErrClosed", err)
	}
}

// TestInvalidBatch: a batch with an invalid record is refused whole, and
// the store goes on.
func TestInvalidBatch(t *testing.T) {
	s := openStore(t, testOptions(t))
	tests := []struct {
		name string
		bad  Record
		want string
	}{
		{"empty key", put("", 1, "v"), "empty key"},
		{"zero deadline", put("x", 0, "v"), "deadline 0"},
		{"negative deadline", put("x", -5, "v"), "deadline -5"},
		{"long key", put(strings.Repeat("k", MaxKeyLen+1), 1, "v"), "longer than"},
	}
	for _, tt := range tests {
		var got error
		called := false
		c := s.Submit([]Record{put("good", 1, "v"), tt.bad}, func(err error) { called, got = true, err })
		if !called || got == nil || !strings.Contains(got.Error(), tt.want) {
			t.Errorf("%s: Submit: done called %t with %v; want called at once with an error containing %q", tt.name, called, got, tt.want)
		}
		if err := wait(t, c); err != got {
			t.Errorf("%s: Err() = %v; want %v", tt.name, err, got)
		}
	}
	submit(t, s, del("nothing"), Record{Key: "deletion ignores deadline", Deadline: -1})
	if got := dump(t, s); len(got) != 0 {
		t.Errorf("records after invalid batches = %v; want none", got)
	}
}

// TestSweep: a Sweep deletes exactly the records whose deadline has passed,
// never one whose deadline a later put moved, and NextDeadline follows.
func TestSweep(t *testing.T) {
	s := openStore(t, testOptions(t))
	submit(t, s, put("a", 10, "a"), put("b", 20, "b"), put("c", 5, "c"), put("d", 25, "d"), put("e", 40, "e"), put("f", 50, "f"))
	submit(t, s, put("c", 30, "c2"), del("f")) // c moved past the sweep, f gone
	checkpoint(t, s)                           // into the data file, where the index is
	// A stale index entry, as if a put had moved "e" without cleaning up:
	// the sweep must drop the entry and keep the record.
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketExpiry).Put(append(binary.BigEndian.AppendUint64(nil, 15), "e"...), []byte{})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.NextDeadline(), int64(10); got != want {
		t.Errorf("before Sweep: NextDeadline() = %d; want %d", got, want)
	}
	if err := wait(t, s.Sweep(25)); err != nil {
		t.Fatalf("Sweep(25) = %v", err)
	}
	want := map[string]stored{"c": {30, "c2"}, "e": {40, "e"}}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after Sweep(25): records = %v; want %v", got, want)
	}
	checkIndex(t, s)
	if got, want := s.NextDeadline(), int64(30); got != want {
		t.Errorf("after Sweep(25): NextDeadline() = %d; want %d", got, want)
	}
	for _, now := range []int64{0, -1, 29} {
		if err := wait(t, s.Sweep(now)); err != nil {
			t.Errorf("Sweep(%d) = %v", now, err)
		}
	}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after Sweeps that expire nothing: records = %v; want %v", got, want)
	}
	if err := wait(t, s.Sweep(1000)); err != nil {
		t.Fatalf("Sweep(1000) = %v", err)
	}
	if got := dump(t, s); len(got) != 0 {
		t.Errorf("after Sweep(1000): records = %v; want none", got)
	}
	if got := s.NextDeadline(); got != 0 {
		t.Errorf("after Sweep(1000): NextDeadline() = %d; want 0", got)
	}
	checkIndex(t, s)
}

// TestSweepContinues: a pass larger than the per-transaction budget goes on
// in later transactions, interleaved with batches, until it is complete.
func TestSweepContinues(t *testing.T) {
	o := testOptions(t)
	var txs atomic.Int64
	o.OnCommit = func(int, time.Duration) { txs.Add(1) }
	s := openStore(t, o)
	s.w.sweepBudget = 7 // the writer is idle: it reads it after the first send

	var recs []Record
	for i := range 100 {
		recs = append(recs, put(fmt.Sprintf("old%03d", i), int64(1+i%13), "x"))
	}
	recs = append(recs, put("live1", 500, "x"), put("live2", 600, "x"))
	submit(t, s, recs...)
	before := txs.Load()
	sweep := s.Sweep(100)
	var commits []*Commit
	for i := range 20 {
		commits = append(commits, s.Submit([]Record{put(fmt.Sprintf("new%02d", i), 700, "x")}, nil))
	}
	if err := wait(t, sweep); err != nil {
		t.Fatalf("Sweep(100) = %v", err)
	}
	for _, c := range commits {
		if err := wait(t, c); err != nil {
			t.Fatalf("Submit = %v", err)
		}
	}
	if got, min := txs.Load()-before, int64(100/7); got < min {
		t.Errorf("transactions for the sweep = %d; want at least %d", got, min)
	}
	got := dump(t, s)
	if len(got) != 22 {
		t.Errorf("after Sweep(100): %d records; want 22 (live1, live2 and 20 new)", len(got))
	}
	for k := range got {
		if strings.HasPrefix(k, "old") {
			t.Errorf("after Sweep(100): %q still stored", k)
		}
	}
	if got, want := s.NextDeadline(), int64(500); got != want {
		t.Errorf("NextDeadline() = %d; want %d", got, want)
	}
	checkIndex(t, s)
}

// TestNextDeadline: NextDeadline follows every transaction, and
// DeadlineChanged fires exactly when it got earlier or left 0.
func TestNextDeadline(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	steps := []struct {
		name      string
		recs      []Record
		sweep     int64
		wantNext  int64
		wantFired bool
	}{
		{name: "first put", recs: []Record{put("a", 100, "")}, wantNext: 100, wantFired: true},
		{name: "later put", recs: []Record{put("b", 200, "")}, wantNext: 100},
		{name: "earlier put", recs: []Record{put("c", 50, "")}, wantNext: 50, wantFired: true},
		{name: "delete earliest", recs: []Record{del("c")}, wantNext: 100},
		{name: "move earliest earlier", recs: []Record{put("a", 70, "")}, wantNext: 70, wantFired: true},
		{name: "move earliest later", recs: []Record{put("a", 300, "")}, wantNext: 200},
		{name: "sweep", sweep: 250, wantNext: 300},
		{name: "delete last", recs: []Record{del("a")}, wantNext: 0},
		{name: "put after empty", recs: []Record{put("d", 900, "")}, wantNext: 900, wantFired: true},
	}
	if got := s.NextDeadline(); got != 0 {
		t.Errorf("empty store: NextDeadline() = %d; want 0", got)
	}
	for _, step := range steps {
		if step.recs != nil {
			submit(t, s, step.recs...)
		} else if err := wait(t, s.Sweep(step.sweep)); err != nil {
			t.Fatalf("%s: Sweep = %v", step.name, err)
		}
		if got := s.NextDeadline(); got != step.wantNext {
			t.Errorf("%s: NextDeadline() = %d; want %d", step.name, got, step.wantNext)
		}
		fired := false
		select {
		case <-s.DeadlineChanged():
			fired = true
		default:
		}
		if fired != step.wantFired {
			t.Errorf("%s: DeadlineChanged fired %t; want %t", step.name, fired, step.wantFired)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	if got, want := s.NextDeadline(), int64(900); got != want {
		t.Errorf("after reopen: NextDeadline() = %d; want %d", got, want)
	}
}

func TestScan(t *testing.T) {
	s := openStore(t, testOptions(t))
	keys := []string{"a", "user/1", "user/10", "user/2", "user/3", "users", "v"}
	var recs []Record
	for i, k := range keys {
		recs = append(recs, put(k, int64(i+1), "val "+k))
	}
	submit(t, s, recs...)

	tests := []struct {
		prefix, after string
		limit         int
		stopAfter     int // fn returns false on this key (1-based); 0 never
		want          []string
	}{
		{"", "", 0, 0, keys},
		{"user/", "", 0, 0, []string{"user/1", "user/10", "user/2", "user/3"}},
		{"user/", "user/10", 0, 0, []string{"user/2", "user/3"}},
		{"user/", "user/15", 0, 0, []string{"user/2", "user/3"}},
		{"user/", "user/3", 0, 0, nil},
		{"user/", "", 2, 0, []string{"user/1", "user/10"}},
		{"user/", "user/1", 2, 0, []string{"user/10", "user/2"}},
		{"user/", "a", 0, 0, []string{"user/1", "user/10", "user/2", "user/3"}},
		{"user/", "zzz", 0, 0, nil},
		{"user", "", -1, 0, []string{"user/1", "user/10", "user/2", "user/3", "users"}},
		{"", "users", 0, 0, []string{"v"}},
		{"", "", 0, 2, []string{"a", "user/1"}},
		{"nope", "", 0, 0, nil},
	}
	for _, tt := range tests {
		var got []string
		err := s.Scan(tt.prefix, tt.after, tt.limit, func(key string, deadline int64, value []byte) bool {
			got = append(got, key)
			if want := int64(slices.Index(keys, key) + 1); deadline != want || string(value) != "val "+key {
				t.Errorf("Scan(%q, %q, %d): key %q = %q@%d; want %q@%d", tt.prefix, tt.after, tt.limit, key, value, deadline, "val "+key, want)
			}
			return len(got) != tt.stopAfter
		})
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("Scan(%q, %q, %d) = %q, %v; want %q", tt.prefix, tt.after, tt.limit, got, err, tt.want)
		}
	}
}

// TestFlush: when Flush returns, everything submitted before it is done and
// readable.
func TestFlush(t *testing.T) {
	s := openStore(t, testOptions(t))
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() on an idle store = %v", err)
	}
	var commits []*Commit
	var keys []string
	for i := range 300 {
		k := fmt.Sprintf("k%03d", i)
		keys = append(keys, k)
		commits = append(commits, s.Submit([]Record{put(k, 1, "v")}, nil))
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() = %v", err)
	}
	for i, c := range commits {
		select {
		case <-c.Done():
			if c.Err() != nil {
				t.Errorf("commit %d: Err() = %v", i, c.Err())
			}
		default:
			t.Fatalf("commit %d not done when Flush returned", i)
		}
	}
	if got := getAll(t, s, keys...); len(got) != len(keys) {
		t.Errorf("after Flush: Get found %d keys; want %d", len(got), len(keys))
	}
}

// TestCommitFailure: a failed transaction fails every batch in it, with the
// error; Flush then Close report it once; the writer goes on.
func TestCommitFailure(t *testing.T) {
	o := testOptions(t)
	var fail atomic.Bool
	o.WriteFault = func() error {
		if fail.Load() {
			return errors.New("injected failure")
		}
		return nil
	}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	submit(t, s, put("before", 1, "v"))

	fail.Store(true)
	var cbErr error
	c := s.Submit([]Record{put("lost", 1, "v")}, func(err error) { cbErr = err })
	if err := wait(t, c); err == nil || !strings.Contains(err.Error(), "injected failure") || !strings.Contains(err.Error(), o.Path) {
		t.Errorf("failed commit: Err() = %v; want the injected failure, naming the file", err)
	}
	if cbErr != c.Err() {
		t.Errorf("failed commit: done(%v); want done(%v)", cbErr, c.Err())
	}
	fail.Store(false)

	if err := s.Flush(); err == nil {
		t.Errorf("first Flush after a failure = nil; want the failure")
	}
	if err := s.Flush(); err != nil {
		t.Errorf("second Flush = %v; want nil (the failure was reported)", err)
	}
	submit(t, s, put("after", 1, "v"))
	want := map[string]stored{"before": {1, "v"}, "after": {1, "v"}}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("records = %v; want %v", got, want)
	}

	fail.Store(true)
	if err := wait(t, s.Submit([]Record{put("lost2", 1, "v")}, nil)); err == nil {
		t.Errorf("failed commit: Err() = nil; want the failure")
	}
	if err := s.Close(); err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Errorf("Close() after an unreported failure = %v; want it", err)
	}
	if err := s.Close(); err == nil {
		t.Errorf("second Close() = nil; want the same error")
	}
}

// TestSubmitAfterFailure: a batch that builds on one that failed is not
// written, even when the disk is fine again by its turn, and fails with
// the same error; so does every batch built on it, in turn; a batch that
// builds on nothing, or on one that succeeded, is written. Batches that
// share a commit succeed or fail together. Done callbacks keep the
// submission order.
func TestSubmitAfterFailure(t *testing.T) {
	injected := errors.New("no space left on device")
	// open returns a store each of whose WAL writes waits for the test:
	// the writer sends on entered when it is about to write, then fails the
	// write with what it receives on writes (nil: it succeeds); submit
	// submits a batch that its done callback names in order().
	open := func(t *testing.T, maxRecs int) (s *Store, entered chan struct{}, writes chan error, submit func(name string, prev *Commit, recs ...Record) *Commit, order func() string) {
		o := testOptions(t)
		o.MaxTxRecords = maxRecs
		entered, writes = make(chan struct{}), make(chan error)
		o.WriteFault = func() error {
			entered <- struct{}{}
			return <-writes
		}
		s = openStore(t, o)
		var (
			mu    sync.Mutex
			names []string
		)
		submit = func(name string, prev *Commit, recs ...Record) *Commit {
			return s.SubmitAfter(prev, recs, func(error) {
				mu.Lock()
				names = append(names, name)
				mu.Unlock()
			})
		}
		order = func() string {
			mu.Lock()
			defer mu.Unlock()
			return strings.Join(names, " ")
		}
		return s, entered, writes, submit, order
	}
	// write lets the writer's next WAL write go on, failing with err.
	write := func(entered chan struct{}, writes chan error, err error) {
		<-entered
		writes <- err
	}

	t.Run("chain", func(t *testing.T) {
		s, entered, writes, submit, order := open(t, 1) // one batch a commit
		// The writer waits in the write of "block" while the chain is
		// queued behind it: c1 fails in its own commit; c2 and c3, built
		// on it, are not written though the disk is fine again; c4, built
		// on one that succeeded, is.
		hold := submit("hold", nil, put("hold", 1, "h"))
		write(entered, writes, nil)
		if err := wait(t, hold); err != nil {
			t.Fatal(err)
		}
		block := submit("block", nil, put("block", 1, "b"))
		c1 := submit("c1", nil, put("a", 1, "a1"))
		c2 := submit("c2", c1, app("a", 1, "+a2"))
		c3 := submit("c3", c2, put("c", 1, "c3"))
		c4 := submit("c4", hold, put("d", 1, "d4"))
		write(entered, writes, nil)      // block
		write(entered, writes, injected) // c1
		write(entered, writes, nil)      // c4 (c2 and c3 write nothing)
		for _, tc := range []struct {
			name string
			c    *Commit
			fail bool
		}{{"block", block, false}, {"c1", c1, true}, {"c2", c2, true}, {"c3", c3, true}, {"c4", c4, false}} {
			err := wait(t, tc.c)
			switch {
			case tc.fail && (err == nil || !strings.Contains(err.Error(), injected.Error())):
				t.Errorf("%s: Err() = %v; want the failure of c1, %v", tc.name, err, c1.Err())
			case !tc.fail && err != nil:
				t.Errorf("%s: Err() = %v; want nil", tc.name, err)
			}
		}
		if got, want := order(), "hold block c1 c2 c3 c4"; got != want {
			t.Errorf("done callbacks ran in the order %s; want %s", got, want)
		}
		// Built on a batch that failed long ago: still not written.
		if err := wait(t, submit("c5", c3, put("e", 1, "e5"))); err == nil {
			t.Errorf("c5, built on c3: Err() = nil; want c1's failure")
		}
		if err := s.Flush(); err == nil {
			t.Errorf("Flush after the failures = nil; want the first one")
		}
		want := map[string]stored{"hold": {1, "h"}, "block": {1, "b"}, "d": {1, "d4"}}
		if got := dump(t, s); !reflect.DeepEqual(got, want) {
			t.Errorf("records = %v; want %v (nothing of a, c or e)", got, want)
		}
	})

	t.Run("one commit", func(t *testing.T) {
		s, entered, writes, submit, _ := open(t, 0)
		base := submit("base", nil, put("a", 1, "a0"))
		write(entered, writes, nil)
		if err := wait(t, base); err != nil {
			t.Fatal(err)
		}
		// c1 and c2 are queued while the writer is in the write of
		// "block": its next commit takes both.
		submit("block", nil, put("block", 1, "b"))
		<-entered
		c1 := submit("c1", base, app("a", 1, "+1"))
		c2 := submit("c2", c1, app("a", 1, "+2"))
		writes <- nil
		write(entered, writes, injected)
		if err := wait(t, c2); err == nil || c1.Err() == nil {
			t.Errorf("c1, c2 in one failed commit: Err() = %v, %v; want the failure for both", c1.Err(), err)
		}
		c3 := submit("c3", base, app("a", 1, "+3"))
		write(entered, writes, nil)
		if err := wait(t, c3); err != nil {
			t.Errorf("c3, built on base: Err() = %v; want nil", err)
		}
		_ = s.Flush() // reports the failure
		want := map[string]stored{"a": {1, "a0+3"}, "block": {1, "b"}}
		if got := dump(t, s); !reflect.DeepEqual(got, want) {
			t.Errorf("records = %v; want %v", got, want)
		}
	})
}

// TestOpenRefuses: Open stops with ErrFormat on a file it cannot read and
// leaves the file as it was.
func TestOpenRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string) // creates the file
		want  string                          // in the error message
	}{
		{"garbage", func(t *testing.T, path string) {
			writeFile(t, path, bytes.Repeat([]byte("not a bbolt file "), 2000))
		}, "bbolt cannot read it"},
		{"tiny garbage", func(t *testing.T, path string) {
			writeFile(t, path, []byte("hello"))
		}, "bbolt cannot read it"},
		{"unknown version", func(t *testing.T, path string) {
			makeStore(t, path, 3)
			rawUpdate(t, path, func(tx *bolt.Tx) error {
				return tx.Bucket(bucketMeta).Put(keyFormat, []byte{0, 0, 0, 2})
			})
		}, "format version 2"},
		{"no meta bucket", func(t *testing.T, path string) {
			rawUpdate(t, path, func(tx *bolt.Tx) error {
				_, err := tx.CreateBucket([]byte("other"))
				return err
			})
		}, `without a "meta" bucket`},
		{"no format", func(t *testing.T, path string) {
			makeStore(t, path, 3)
			rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyFormat) })
		}, "no format version"},
		{"no expiry bucket", func(t *testing.T, path string) {
			makeStore(t, path, 3)
			rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketExpiry) })
		}, `no "expiry" bucket`},
		{"short record", func(t *testing.T, path string) {
			makeStore(t, path, 3)
			rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketKeys).Put([]byte("k"), []byte{1, 2}) })
		}, "shorter than its deadline"},
		{"truncated", func(t *testing.T, path string) {
			makeStore(t, path, 5000)
			// Cut the file in the middle of the pages in use.
			if err := os.Truncate(path, usedSize(t, path)/2); err != nil {
				t.Fatal(err)
			}
		}, "truncated"},
		{"corrupt pages", func(t *testing.T, path string) {
			makeStore(t, path, 5000)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// Overwrite everything past the two meta pages and the first
			// few pages, where the trees live.
			page := os.Getpagesize()
			for i := 4 * page; i < len(b); i++ {
				b[i] = byte(i * 7)
			}
			writeFile(t, path, b)
		}, "corrupt"},
		{"four bytes flipped at offset 12,300", func(t *testing.T, path string) {
			makeStore(t, path, 5000)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for i := 12300; i < 12304; i++ {
				b[i] ^= 0xff
			}
			writeFile(t, path, b)
		}, "corrupt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			if err := os.MkdirAll(filepath.Dir(o.Path), 0o750); err != nil {
				t.Fatal(err)
			}
			tt.setup(t, o.Path)
			before, err := os.ReadFile(o.Path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(o)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%s) = nil error; want ErrFormat", tt.name)
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), o.Path) {
				t.Errorf("Open(%s) = %v; want ErrFormat naming the file and saying %q", tt.name, err, tt.want)
			}
			t.Logf("Open(%s) = %v", tt.name, err)
			after, err := os.ReadFile(o.Path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("Open(%s) modified the file", tt.name)
			}
		})
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// makeStore creates a data file holding n records.
func makeStore(t *testing.T, path string, n int) {
	t.Helper()
	s, err := Open(Options{Path: path, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var recs []Record
	for i := range n {
		recs = append(recs, put(fmt.Sprintf("key %06d", i), int64(i+1), strings.Repeat("v", 50)))
	}
	submit(t, s, recs...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// usedSize returns the bytes of the pages in use in a bbolt file: bbolt
// grows the file ahead of them.
func usedSize(t *testing.T, path string) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	if err := db.View(func(tx *bolt.Tx) error { used = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return used
}

// rawUpdate runs fn in a bbolt transaction on the file, around the store.
func rawUpdate(t *testing.T, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenEmptyBoltFile: a bbolt file without any bucket (creation
// interrupted before the first commit) is initialised, not refused.
func TestOpenEmptyBoltFile(t *testing.T) {
	o := testOptions(t)
	if err := os.MkdirAll(filepath.Dir(o.Path), 0o750); err != nil {
		t.Fatal(err)
	}
	rawUpdate(t, o.Path, func(*bolt.Tx) error { return nil })
	s := openStore(t, o)
	submit(t, s, put("a", 1, "v"))
	if got := getAll(t, s, "a"); len(got) != 1 {
		t.Errorf("Get(a) = %v; want the record", got)
	}
}

// TestOpenNotAFile: a directory or an unwritable place is an error, not
// ErrFormat.
func TestOpenNotAFile(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{dir, filepath.Join(dir, "file", "sluice.db")} {
		if path != dir {
			writeFile(t, filepath.Join(dir, "file"), []byte("x"))
		}
		s, err := Open(Options{Path: path})
		if err == nil {
			s.Close()
			t.Fatalf("Open(%q) = nil error; want one", path)
		}
		if errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), path) {
			t.Errorf("Open(%q) = %v; want an error naming the path, not ErrFormat", path, err)
		}
	}
}

// TestOpenLocked: a second Open of the same file, in the same process,
// fails with ErrLocked within OpenTimeout.
func TestOpenLocked(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("a", 1, "v"))

	o.OpenTimeout = 100 * time.Millisecond
	start := time.Now()
	s2, err := Open(o)
	elapsed := time.Since(start)
	if err == nil {
		s2.Close()
		t.Fatalf("second Open(%q) = nil error; want ErrLocked", o.Path)
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), o.Path) || !strings.Contains(err.Error(), "another sluice") {
		t.Errorf("second Open(%q) = %v; want ErrLocked naming the file and the likely cause", o.Path, err)
	}
	if elapsed > o.OpenTimeout+time.Second {
		t.Errorf("second Open took %v; want it to give up within OpenTimeout (%v)", elapsed, o.OpenTimeout)
	}
	if got := getAll(t, s, "a"); len(got) != 1 {
		t.Errorf("first store after the failed Open: Get(a) = %v; want the record", got)
	}
}

// TestConcurrentReads: Get and Scan run while the writer commits.
func TestConcurrentReads(t *testing.T) {
	s := openStore(t, testOptions(t))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := s.Get([]string{"k1", "k2"}, func(i int, deadline int64, value []byte) {
					if want := fmt.Sprint(deadline); string(value) != want {
						t.Errorf("Get: value %q with deadline %d; want %q", value, deadline, want)
					}
				})
				if err != nil {
					t.Errorf("Get = %v", err)
				}
				if err := s.Scan("k", "", 10, func(string, int64, []byte) bool { return true }); err != nil {
					t.Errorf("Scan = %v", err)
				}
			}
		})
	}
	for i := range 300 {
		d := int64(i + 1)
		submit(t, s, put("k1", d, fmt.Sprint(d)), put("k2", d, fmt.Sprint(d)))
	}
	close(stop)
	wg.Wait()
}

// TestCloseDuringSweep: Close does not wait for a long Sweep pass to finish;
// the Sweep is then done with ErrClosed (or nil if it finished first), and
// whatever it deleted, it deleted with the records' index entries.
func TestCloseDuringSweep(t *testing.T) {
	o := testOptions(t)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	s.w.sweepBudget = 1 // the writer is idle: it reads it after the first send
	var recs []Record
	for i := range 200 {
		recs = append(recs, put(fmt.Sprintf("k%03d", i), int64(i+1), "v"))
	}
	submit(t, s, recs...)
	sweep := s.Sweep(1000)
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	select {
	case <-sweep.Done():
	default:
		t.Fatalf("Sweep not done when Close returned")
	}
	if err := sweep.Err(); err != nil && !errors.Is(err, ErrClosed) {
		t.Errorf("Sweep after Close: Err() = %v; want nil or ErrClosed", err)
	}
	s = openStore(t, o)
	t.Logf("%d records left", len(dump(t, s)))
	checkIndex(t, s)
}

// TestOpenSurvivesFlippedBytes flips four bytes at offsets spread over a
// checkpointed data file, one offset per file: Open either opens it (the
// damage is in free space or in a value) or refuses it with ErrFormat
// without touching it. It never panics: bbolt's freelist rebuild panics on
// a goroutine of its own, which would end the process.
func TestOpenSurvivesFlippedBytes(t *testing.T) {
	dir := t.TempDir()
	orig := filepath.Join(dir, "orig.db")
	makeStore(t, orig, 5000)
	good, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	good = good[:usedSize(t, orig)] // only the pages in use matter
	// Offsets spread over the file, and the headers (flags and count,
	// overflow) of its first pages, where the trees' roots are.
	var offsets []int
	for off := 0; off+4 <= len(good); off += max(len(good)/200, 1) {
		offsets = append(offsets, off)
	}
	ps := os.Getpagesize()
	for p := 2; p < 40 && (p+1)*ps <= len(good); p++ {
		offsets = append(offsets, p*ps+8, p*ps+12)
	}
	refused := 0
	for _, off := range offsets {
		b := bytes.Clone(good)
		for i := off; i < off+4; i++ {
			b[i] ^= 0xff
		}
		path := filepath.Join(dir, fmt.Sprintf("flipped-%d.db", off))
		writeFile(t, path, b)
		s, err := Open(Options{Path: path})
		if err == nil {
			if err := s.Close(); err != nil {
				t.Logf("offset %d: Close: %v", off, err)
			}
			continue
		}
		refused++
		if !errors.Is(err, ErrFormat) {
			t.Errorf("offset %d: Open = %v; want nil or ErrFormat", off, err)
		}
		after, rerr := os.ReadFile(path)
		if rerr != nil || !bytes.Equal(after, b) {
			t.Errorf("offset %d: Open refused the file (%v) and modified it", off, err)
		}
	}
	t.Logf("%d offsets, %d refused", len(offsets), refused)
}

// TestCommitFailuresLoggedAtARate: a disk that fails every commit gets one
// "commit failed" line a second, with the count since the line before,
// not a line per commit; the first commit that succeeds again says how
// many failed.
func TestCommitFailuresLoggedAtARate(t *testing.T) {
	var buf testkit.SyncBuffer
	o := testOptions(t)
	o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	var fail atomic.Bool
	o.WriteFault = func() error {
		if fail.Load() {
			return errors.New("no space left on device")
		}
		return nil
	}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fail.Store(true)
	start := time.Now()
	const commits = 500
	for i := range commits {
		if err := wait(t, s.Submit([]Record{put(fmt.Sprintf("k%d", i), 1, "v")}, nil)); err == nil {
			t.Fatalf("commit %d: nil error; want the failure", i)
		}
	}
	elapsed := time.Since(start)
	fail.Store(false)
	submit(t, s, put("after", 1, "v"))
	logs := buf.String()
	lines := strings.Count(logs, `msg="commit failed"`)
	if lines < 1 || float64(lines) > 1+elapsed.Seconds() {
		t.Errorf("%d failed commits in %v logged %d lines; want one a second", commits, elapsed, lines)
	}
	if !regexp.MustCompile(fmt.Sprintf(`msg="commits succeed again" .*failed_commits=%d\b`, commits)).MatchString(logs) {
		t.Errorf("logs:\n%s\nwant the recovery, with %d failed commits", logs, commits)
	}
	_ = s.Flush() // reports the failures once
}

// indexEntries returns the data file's expiry index as "deadline:key".
func indexEntries(t *testing.T, s *Store) []string {
	t.Helper()
	var got []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketExpiry).ForEach(func(k, _ []byte) error {
			got = append(got, fmt.Sprintf("%d:%s", binary.BigEndian.Uint64(k), k[8:]))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestIndexLowerBounds: a checkpoint that moves a key's deadline later
// leaves its index entry where it is, a lower bound; the Sweep that reaches
// it moves it to the record's deadline and keeps the record; a deadline
// moved earlier, and a deletion, take the entry with them.
func TestIndexLowerBounds(t *testing.T) {
	s := openStore(t, testOptions(t))
	step := func(what string, want ...string) {
		t.Helper()
		checkpoint(t, s)
		if got := indexEntries(t, s); !slices.Equal(got, want) {
			t.Errorf("%s: index %q; want %q", what, got, want)
		}
	}
	submit(t, s, put("a", 10, "1"), put("b", 40, "1"))
	step("new keys", "10:a", "40:b")
	submit(t, s, put("a", 20, "2"))
	step("a's deadline moved later", "10:a", "40:b")
	if got := s.NextDeadline(); got != 10 {
		t.Errorf("NextDeadline() = %d; want 10, the lower bound", got)
	}
	if err := wait(t, s.Sweep(15)); err != nil {
		t.Fatal(err)
	}
	step("Sweep(15)", "20:a", "40:b")
	if got, want := getAll(t, s, "a"), map[string]stored{"a": {20, "2"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("after Sweep(15): %v; want %v", got, want)
	}
	submit(t, s, put("a", 18, "3"))
	step("a's deadline moved earlier", "18:a", "40:b")
	submit(t, s, del("a"))
	step("a deleted", "40:b")
	submit(t, s, put("b", 50, "2"))
	step("b's deadline moved later", "40:b")
	submit(t, s, del("b"))
	step("b deleted: its entry, a lower bound, waits for a Sweep", "40:b")
	if err := wait(t, s.Sweep(45)); err != nil {
		t.Fatal(err)
	}
	step("Sweep(45)")
	if got := s.NextDeadline(); got != 0 {
		t.Errorf("NextDeadline() = %d with nothing stored; want 0", got)
	}
}
