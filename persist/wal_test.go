package persist

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// crashChildEnv names the data file the crash child writes to; set, the
// test binary runs as that child instead of running tests.
const crashChildEnv = "SLUICE_PERSIST_CRASH_CHILD"

// crashChild parameters: goroutines, each writing to its own keys.
const (
	crashGoroutines = 4
	crashKeysPer    = 25
	crashBatch      = 3
)

// crashKey is the key of goroutine g's n-th record.
func crashKey(g, n int) string { return fmt.Sprintf("g%d/k%02d", g, n%crashKeysPer) }

// crashLogKey is the key to which goroutine g appends the number of the
// last record of each of its batches.
func crashLogKey(g int) string { return fmt.Sprintf("g%d/log", g) }

// crashDeadline is far in the future: nothing expires during the test.
const crashDeadline = int64(1) << 62

// runCrashChild is the child process of TestCrashKeepsAcknowledged: each
// goroutine submits batches of crashBatch records in ModeCommit, plus an
// append of n to its log key, with small checkpoint thresholds so that
// checkpoints run all along, and prints "g n" once the batch that ends with
// its record n is acknowledged, until
// the parent kills it (or a minute has passed: it never outlives a parent
// that failed to kill it).
func runCrashChild(path string, start int) {
	s, err := Open(Options{Path: path, Mode: ModeCommit, CheckpointKeys: 40, CheckpointBytes: 8 << 10})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex // one line per write to the pipe
	deadline := time.Now().Add(time.Minute)
	for g := range crashGoroutines {
		go func() {
			for n := start; time.Now().Before(deadline); {
				recs := make([]Record, crashBatch, crashBatch+1)
				for i := range recs {
					n++
					recs[i] = Record{Key: crashKey(g, n), Deadline: crashDeadline, Value: binary.BigEndian.AppendUint64(nil, uint64(n))}
				}
				recs = append(recs, Record{Key: crashLogKey(g), Deadline: crashDeadline, Value: binary.BigEndian.AppendUint64(nil, uint64(n)), Append: true})
				c := s.Submit(recs, nil)
				<-c.Done()
				if err := c.Err(); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "%d %d\n", g, n)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Until(deadline)) // not a poll: the child runs until its parent kills it, a minute at most
	os.Exit(3)
}

// TestCrashKeepsAcknowledged: kill -9 in ModeCommit, at any point (in the
// middle of a WAL write, a rotation or a checkpoint), loses no acknowledged
// record, and Open accepts what the crash left. The appends to each
// goroutine's log key are all there, each once, in order: the batches'
// numbers with no gap up to the last acknowledged one at least. Three rounds
// crash on the same files, each child starting from what the previous one
// left.
func TestCrashKeepsAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	path := filepath.Join(t.TempDir(), "sluice.db")
	acked := make(map[string]int) // key -> highest acknowledged value
	ackedLog := make([]int, crashGoroutines)
	for round := range 3 {
		start := round * 1_000_000
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path, "SLUICE_PERSIST_CRASH_START="+strconv.Itoa(start))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		const want = 1500
		n := 0
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			var g, last int
			if _, err := fmt.Sscanf(lines.Text(), "%d %d", &g, &last); err != nil {
				t.Fatalf("child printed %q", lines.Text())
			}
			for i := last - crashBatch + 1; i <= last; i++ {
				acked[crashKey(g, i)] = max(acked[crashKey(g, i)], i)
			}
			ackedLog[g] = max(ackedLog[g], last)
			if n++; n == want {
				if err := cmd.Process.Kill(); err != nil { // SIGKILL
					t.Fatal(err)
				}
			}
		}
		err = cmd.Wait()
		if n < want {
			t.Fatalf("round %d: child acknowledged %d batches before it died (%v); want at least %d", round, n, err, want)
		}

		s, err := Open(Options{Path: path, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("round %d: Open after kill -9 = %v; want no error", round, err)
		}
		got := dump(t, s)
		lost := 0
		for key, wantN := range acked {
			r, ok := got[key]
			if !ok || len(r.Value) != 8 || int(binary.BigEndian.Uint64([]byte(r.Value))) < wantN {
				if lost++; lost <= 5 {
					t.Errorf("round %d: after kill -9, key %q = %v (found %t); acknowledged value %d", round, key, r, ok, wantN)
				}
			}
		}
		for g := range crashGoroutines {
			if err := checkCrashLog(got[crashLogKey(g)].Value, ackedLog[g]); err != nil {
				t.Errorf("round %d: after kill -9, log of goroutine %d: %v", round, g, err)
			}
		}
		t.Logf("round %d: %d batches acknowledged, %d keys checked, %d lost", round, n, len(acked), lost)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkCrashLog checks a log of the crash child: numbers of 8 bytes, each
// crashBatch after the previous one, except the first of a round (the
// millions say which), which is its crashBatch-th; and the last is at least
// acked.
func checkCrashLog(log string, acked int) error {
	if len(log)%8 != 0 {
		return fmt.Errorf("%d bytes, not a sequence of 8-byte numbers", len(log))
	}
	prev := 0
	for i := 0; i < len(log); i += 8 {
		n := int(binary.BigEndian.Uint64([]byte(log[i : i+8])))
		switch {
		case n/1_000_000 == prev/1_000_000 && n != prev+crashBatch:
			return fmt.Errorf("entry %d is %d after %d; want %d", i/8, n, prev, prev+crashBatch)
		case n/1_000_000 != prev/1_000_000 && (n/1_000_000 < prev/1_000_000 || n%1_000_000 != crashBatch):
			return fmt.Errorf("entry %d is %d after %d; want the first batch of a later round", i/8, n, prev)
		}
		prev = n
	}
	if prev < acked {
		return fmt.Errorf("ends at %d; the append of %d was acknowledged", prev, acked)
	}
	return nil
}

// crash closes s as kill -9 would leave it: no checkpoint, no sync, the WAL
// files kept.
func crash(t testing.TB, s *Store) {
	t.Helper()
	s.crashOnClose = true // read by the writer after the queue is closed
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
}

// walFiles returns the store's WAL files.
func walFiles(t testing.TB, path string) []walFile {
	t.Helper()
	files, err := listWALs(path)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// frameEnds writes one batch per key, each in its own frame, crashes, and
// returns the WAL file and the offset at which each frame ends.
func frameEnds(t *testing.T, o Options, keys []string) (string, []int64) {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int64
	for i, k := range keys {
		submit(t, s, put(k, int64(100+i), "v-"+k))
		files := walFiles(t, o.Path)
		info, err := os.Stat(files[len(files)-1].path)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, info.Size())
	}
	crash(t, s)
	files := walFiles(t, o.Path)
	if len(files) != 1 {
		t.Fatalf("%d WAL files; want 1", len(files))
	}
	return files[0].path, ends
}

// TestWALTornTail: a WAL whose last frame was cut short, zeroed or garbled
// (a write interrupted by a crash, never acknowledged) opens; every earlier
// frame is replayed, the torn one ignored, and the WAL starts empty.
func TestWALTornTail(t *testing.T) {
	keys := []string{"a", "b", "c", "d"}
	tests := []struct {
		name  string
		tear  func(b []byte, lastStart int) []byte
		whole bool // the last frame survives
	}{
		{"cut in the frame header", func(b []byte, at int) []byte { return b[:at+3] }, false},
		{"cut in the body", func(b []byte, at int) []byte { return b[:at+(len(b)-at)/2] }, false},
		{"cut one byte short", func(b []byte, at int) []byte { return b[:len(b)-1] }, false},
		{"zeroed", func(b []byte, at int) []byte { clear(b[at:]); return b }, false},
		{"zeros after it", func(b []byte, at int) []byte { return append(b, make([]byte, 4096)...) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			wal, ends := frameEnds(t, o, keys)
			b, err := os.ReadFile(wal)
			if err != nil {
				t.Fatal(err)
			}
			torn := tt.tear(b, int(ends[len(ends)-2]))
			writeFile(t, wal, torn)

			s := openStore(t, o)
			if kept, err := os.ReadFile(wal + ".torn"); err != nil || !bytes.Equal(kept, torn) {
				t.Errorf("after Open: the torn WAL file kept aside as %s.torn: %v; want it, as it was", wal, err)
			}
			want := map[string]stored{"a": {100, "v-a"}, "b": {101, "v-b"}, "c": {102, "v-c"}}
			if tt.whole {
				want["d"] = stored{103, "v-d"}
			}
			if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
				t.Errorf("after Open: Get(%q) = %v; want %v", keys, got, want)
			}
			files := walFiles(t, o.Path)
			if len(files) != 1 || fileSize(t, files[0].path) != walHeaderLen {
				t.Errorf("after Open: WAL files %v; want one, with its header only", files)
			}
			// The store goes on, and its new frames replay after the old ones.
			submit(t, s, put("e", 104, "v-e"))
			crash(t, s)
			s = openStore(t, o)
			want["e"] = stored{104, "v-e"}
			if got := dump(t, s); !reflect.DeepEqual(got, want) {
				t.Errorf("after a second crash: records = %v; want %v", got, want)
			}
		})
	}
}

// TestWALDamagedTail: a WAL whose last frame is complete but fails its
// checksum was damaged after it was acknowledged: Open refuses it with
// ErrFormat and changes nothing; with AcceptWALLoss it replays the frames
// before it, drops that one, and keeps the file aside as .damaged.
func TestWALDamagedTail(t *testing.T) {
	keys := []string{"a", "b", "c", "d"}
	o := testOptions(t)
	wal, _ := frameEnds(t, o, keys)
	b, err := os.ReadFile(wal)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff
	writeFile(t, wal, b)
	data, err := os.ReadFile(o.Path)
	if err != nil {
		t.Fatal(err)
	}

	s, err := Open(o)
	if err == nil {
		s.Close()
		t.Fatal("Open with a damaged last WAL frame = nil error; want ErrFormat")
	}
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "fails its checksum") || !strings.Contains(err.Error(), "--accept-wal-loss") {
		t.Errorf("Open = %v; want ErrFormat saying the frame is damaged and how to accept the loss", err)
	}
	if got, _ := os.ReadFile(wal); !bytes.Equal(got, b) {
		t.Error("the refused Open modified the WAL file")
	}
	if got, _ := os.ReadFile(o.Path); !bytes.Equal(got, data) {
		t.Error("the refused Open modified the data file")
	}

	o.AcceptWALLoss = true
	s = openStore(t, o)
	want := map[string]stored{"a": {100, "v-a"}, "b": {101, "v-b"}, "c": {102, "v-c"}}
	if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
		t.Errorf("after Open with the loss accepted: Get(%q) = %v; want %v", keys, got, want)
	}
	if kept, err := os.ReadFile(wal + ".damaged"); err != nil || !bytes.Equal(kept, b) {
		t.Errorf("the damaged WAL file kept aside as %s.damaged: %v; want it, as it was", wal, err)
	}
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

// TestWALCorrupt: a WAL damaged anywhere but in its last frame, or that is
// not a WAL this build reads, stops Open with ErrFormat, naming the file,
// and neither the WAL nor the data file is modified.
func TestWALCorrupt(t *testing.T) {
	keys := []string{"a", "b", "c", "d", "e"}
	tests := []struct {
		name    string
		corrupt func(b []byte, ends []int64) []byte
		want    string
	}{
		{"bit flip in a middle frame", func(b []byte, ends []int64) []byte {
			b[ends[1]+frameHeaderLen+5] ^= 0x10
			return b
		}, "checksum mismatch"},
		{"length of a middle frame", func(b []byte, ends []int64) []byte {
			binary.LittleEndian.PutUint32(b[ends[1]:], 1<<30)
			return b
		}, "past the end"},
		{"middle frame zeroed", func(b []byte, ends []int64) []byte {
			clear(b[ends[1]:ends[2]])
			return b
		}, "invalid length 0"},
		{"frame missing", func(b []byte, ends []int64) []byte {
			return append(b[:ends[1]:ends[1]], b[ends[2]:]...)
		}, "frames are missing"},
		{"bad magic", func(b []byte, ends []int64) []byte {
			copy(b, "NOTAWAL!")
			return b
		}, "not a Sluice WAL"},
		{"unknown version", func(b []byte, ends []int64) []byte {
			binary.LittleEndian.PutUint32(b[len(walMagic):], 9)
			return b
		}, "WAL format version 9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			wal, ends := frameEnds(t, o, keys)
			b, err := os.ReadFile(wal)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, wal, tt.corrupt(b, append([]int64{walHeaderLen}, ends...)))
			beforeWAL, beforeDB := readFile(t, wal), readFile(t, o.Path)

			s, err := Open(o)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%s) = nil error; want ErrFormat", tt.name)
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), wal) {
				t.Errorf("Open(%s) = %v; want ErrFormat naming %s and saying %q", tt.name, err, wal, tt.want)
			}
			t.Logf("Open(%s) = %v", tt.name, err)
			if !bytes.Equal(readFile(t, wal), beforeWAL) || !bytes.Equal(readFile(t, o.Path), beforeDB) {
				t.Errorf("Open(%s) modified the WAL or the data file", tt.name)
			}
		})
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReplay: after a crash, Open replays every committed record, puts and
// deletions, over what the data file held, so that a deletion committed
// after a checkpoint is not undone by it; NextDeadline follows.
func TestReplay(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("a", 10, "a1"), put("b", 20, "b1"), put("c", 30, "c1"))
	checkpoint(t, s)
	submit(t, s, del("a"), put("b", 25, "b2"), put("d", 40, "d1"))
	submit(t, s, del("d"), put("e", 50, "e1"), put("e", 5, "e2"))
	crash(t, s)

	s = openStore(t, o)
	want := map[string]stored{"b": {25, "b2"}, "c": {30, "c1"}, "e": {5, "e2"}}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after replay: records = %v; want %v", got, want)
	}
	checkIndex(t, s)
	if got, want := s.NextDeadline(), int64(5); got != want {
		t.Errorf("after replay: NextDeadline() = %d; want %d", got, want)
	}
}

// TestCloseEmptiesWAL: Close writes everything into the data file and
// removes the WAL; Open starts a WAL with its header only.
func TestCloseEmptiesWAL(t *testing.T) {
	for _, mode := range []Mode{ModeCommit, ModeFsync, ModeAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			o := testOptions(t)
			o.Mode = mode
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			submit(t, s, put("a", 10, "a"), put("b", 20, "b"))
			submit(t, s, del("a"))
			if err := s.Close(); err != nil {
				t.Fatalf("Close() = %v", err)
			}
			if files := walFiles(t, o.Path); len(files) != 0 {
				t.Errorf("after Close: WAL files %v; want none", files)
			}
			s = openStore(t, o)
			files := walFiles(t, o.Path)
			if len(files) != 1 || fileSize(t, files[0].path) != walHeaderLen {
				t.Errorf("after reopen: WAL files %v; want one, with its header only", files)
			}
			if got, want := dump(t, s), map[string]stored{"b": {20, "b"}}; !reflect.DeepEqual(got, want) {
				t.Errorf("after reopen: records = %v; want %v", got, want)
			}
		})
	}
}

// blockCheckpoints makes every checkpoint transaction of s wait, once it
// has written its records, until the test releases it: entered receives
// when one waits.
func blockCheckpoints(s *Store) (entered <-chan struct{}, release func()) {
	in := make(chan struct{}, 1)
	rel := make(chan struct{})
	// The checkpointer is idle: it reads the hook after its next job.
	s.ck.beforeCommit = func(*bolt.Tx) error {
		select {
		case in <- struct{}{}:
		default:
		}
		<-rel
		return nil
	}
	return in, sync.OnceFunc(func() { close(rel) })
}

// TestGetSeesCommitted: Get finds every committed record, whether it is in
// the current overlay, in the frozen one being checkpointed, or in the data
// file, and a deletion hides the older record under it; commits go on while
// a checkpoint runs.
func TestGetSeesCommitted(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	keys := []string{"a", "b", "c", "d", "e"}
	check := func(when string, want map[string]stored) {
		t.Helper()
		if got := getAll(t, s, keys...); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Get(%q) = %v; want %v", when, keys, got, want)
		}
	}
	submit(t, s, put("a", 10, "a1"), put("b", 20, "b1"))
	check("in the overlay", map[string]stored{"a": {10, "a1"}, "b": {20, "b1"}})
	checkpoint(t, s)
	check("in the data file", map[string]stored{"a": {10, "a1"}, "b": {20, "b1"}})

	submit(t, s, put("b", 21, "b2"), put("c", 30, "c1"), put("d", 40, "d1"))
	entered, release := blockCheckpoints(s)
	defer release()
	done := make(chan error, 1)
	go func() { done <- s.checkpointNow() }()
	<-entered // b2, c1, d1 are frozen, their transaction not committed

	submit(t, s, put("c", 31, "c2"), del("d"), put("e", 50, "e1"), del("a"))
	want := map[string]stored{"b": {21, "b2"}, "c": {31, "c2"}, "e": {50, "e1"}}
	check("during a checkpoint", want)
	if err := s.Flush(); err != nil {
		t.Errorf("Flush() during a checkpoint = %v", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("checkpoint = %v", err)
	}
	check("after the checkpoint", want)
	checkpoint(t, s)
	check("after a second checkpoint", want)
	checkIndex(t, s)
}

// TestCheckpointConcurrent: commits, Gets, Scans and checkpoints run at once
// (the thresholds are tiny); each goroutine owns its keys and, after each of
// its commits, Get returns exactly what it last wrote; after Close and
// reopen, everything is there.
func TestCheckpointConcurrent(t *testing.T) {
	const (
		goroutines = 6
		rounds     = 300
		keysPer    = 8
	)
	o := testOptions(t)
	o.CheckpointKeys = 30
	o.CheckpointBytes = 4 << 10
	var checkpoints atomic.Int64
	o.OnCheckpoint = func(int, time.Duration, error) { checkpoints.Add(1) }
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		want = make(map[string]stored)
	)
	stop := make(chan struct{})
	var scanners sync.WaitGroup
	scanners.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.Scan("g", "", 50, func(string, int64, []byte) bool { return true }); err != nil {
				t.Errorf("Scan = %v", err)
				return
			}
		}
	})
	for g := range goroutines {
		wg.Go(func() {
			model := make(map[string]stored)
			keys := make([]string, keysPer)
			for i := range keys {
				keys[i] = fmt.Sprintf("g%d/k%d", g, i)
			}
			for r := range rounds {
				var recs []Record
				for i := range 1 + r%3 {
					k := keys[(r*3+i)%keysPer]
					if (r+i)%7 == 0 {
						recs = append(recs, del(k))
						delete(model, k)
						continue
					}
					rec := put(k, int64(1+r), fmt.Sprintf("g%d r%d i%d", g, r, i))
					recs = append(recs, rec)
					model[k] = stored{rec.Deadline, string(rec.Value)}
				}
				if err := wait(t, s.Submit(recs, nil)); err != nil {
					t.Errorf("Submit = %v", err)
					return
				}
				got := make(map[string]stored)
				err := s.Get(keys, func(i int, deadline int64, value []byte) {
					got[keys[i]] = stored{deadline, string(value)}
				})
				if err != nil || !maps.Equal(got, model) {
					t.Errorf("goroutine %d round %d: Get = %v, %v; want %v", g, r, got, err, model)
					return
				}
			}
			mu.Lock()
			maps.Copy(want, model)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(stop)
	scanners.Wait()
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if checkpoints.Load() < 5 {
		t.Errorf("%d checkpoints; want many (the thresholds are tiny)", checkpoints.Load())
	}
	t.Logf("%d checkpoints", checkpoints.Load())
	s = openStore(t, o)
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: %d records, want %d; first difference: %s", len(got), len(want), firstDiff(got, want))
	}
	checkIndex(t, s)
}

// TestCheckpointThresholds: a checkpoint starts once the overlay holds
// CheckpointKeys keys, not before; an idle store runs none.
func TestCheckpointThresholds(t *testing.T) {
	o := testOptions(t)
	o.CheckpointKeys = 10
	ckpts := make(chan int, 10)
	o.OnCheckpoint = func(records int, _ time.Duration, _ error) { ckpts <- records }
	s := openStore(t, o)
	for i := range 9 {
		submit(t, s, put(fmt.Sprintf("k%d", i), 1, "v"), put("k0", 1, "again"))
	}
	select {
	case n := <-ckpts:
		t.Fatalf("checkpoint of %d records with 9 keys in the overlay; want none below CheckpointKeys", n)
	default:
	}
	submit(t, s, put("k9", 1, "v"))
	select {
	case n := <-ckpts:
		if n != 10 {
			t.Errorf("checkpoint of %d records; want 10 (19 puts of 10 keys coalesce)", n)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no checkpoint with CheckpointKeys keys in the overlay")
	}
	checkpoint(t, s) // waits for the one under way, which removes the first WAL
	if files := walFiles(t, o.Path); len(files) != 1 {
		t.Errorf("after a checkpoint: WAL files %v; want the new one only", files)
	}
}

// TestCheckpointMemory: a checkpoint also starts once the overlay's
// entries take CheckpointMemory bytes, long before CheckpointKeys keys
// when values are long (a key's appends grow its value in the overlay):
// the overlays stay bounded whatever the values.
func TestCheckpointMemory(t *testing.T) {
	o := testOptions(t)
	o.CheckpointKeys = 1 << 20
	o.CheckpointMemory = 64 << 10
	ckpts := make(chan int, 100)
	o.OnCheckpoint = func(records int, _ time.Duration, _ error) { ckpts <- records }
	s := openStore(t, o)
	chunk := strings.Repeat("x", 1000)
	for i := range 8 {
		// 8 keys of 8 KB each: about 65 KiB with the entries.
		key := fmt.Sprintf("long-%d", i)
		submit(t, s, put(key, 1, chunk))
		for range 7 {
			submit(t, s, app(key, 1, chunk))
		}
		if i < 6 {
			select {
			case n := <-ckpts:
				t.Fatalf("checkpoint of %d records with %d keys of 8 KB in the overlay; want none below 64 KiB", n, i+1)
			default:
			}
		}
	}
	select {
	case n := <-ckpts:
		if n < 7 || n > 8 {
			t.Errorf("checkpoint of %d records; want the 7 or 8 keys that reached 64 KiB", n)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no checkpoint with 64 KB of values in the overlay (CheckpointMemory %d)", o.CheckpointMemory)
	}
	checkpoint(t, s)
	got := dump(t, s)
	for i := range 8 {
		if v := got[fmt.Sprintf("long-%d", i)]; len(v.Value) != 8000 {
			t.Errorf("long-%d: %d bytes after the checkpoints; want 8000", i, len(v.Value))
		}
	}
}

// TestSweepOverlay: a Sweep deletes expired records in the overlay, in the
// frozen overlay under a checkpoint and in the data file, never a record
// rewritten with a later deadline; the deletions go through the WAL, so that
// a replay after a crash does not bring the records back.
func TestSweepOverlay(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("a", 10, "a"), put("b", 20, "b"), put("f", 8, "f"))
	checkpoint(t, s) // a, b, f in the data file
	submit(t, s, put("b", 30, "b2"), put("c", 15, "c"), put("d", 5, "d"), put("e", 7, "e"), put("g", 100, "g"))

	// Freeze c, d, e, g under a checkpoint that waits.
	entered, release := blockCheckpoints(s)
	defer release()
	done := make(chan error, 1)
	go func() { done <- s.checkpointNow() }()
	<-entered
	submit(t, s, put("e", 60, "e2"), put("h", 3, "h"))

	if got, want := s.NextDeadline(), int64(3); got != want {
		t.Errorf("before Sweep: NextDeadline() = %d; want %d", got, want)
	}
	sweep := s.Sweep(20)
	if err := s.Flush(); err != nil { // the overlay part is committed now
		t.Fatal(err)
	}
	// The overlays' expired records are gone; the data file's (a, f) wait
	// for the checkpointer, busy with the checkpoint.
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	during := map[string]stored{"a": {10, "a"}, "b": {30, "b2"}, "e": {60, "e2"}, "f": {8, "f"}, "g": {100, "g"}}
	if got := getAll(t, s, keys...); !reflect.DeepEqual(got, during) {
		t.Errorf("after Sweep(20), during a checkpoint: Get = %v; want %v", got, during)
	}
	want := map[string]stored{"b": {30, "b2"}, "e": {60, "e2"}, "g": {100, "g"}}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := wait(t, sweep); err != nil {
		t.Fatalf("Sweep(20) = %v", err)
	}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after Sweep(20): records = %v; want %v", got, want)
	}
	submit(t, s, put("i", 70, "i"))
	crash(t, s)

	s = openStore(t, o)
	want["i"] = stored{70, "i"}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after a crash and replay: records = %v; want %v", got, want)
	}
	checkIndex(t, s)
	if got, want := s.NextDeadline(), int64(30); got != want {
		t.Errorf("after replay: NextDeadline() = %d; want %d", got, want)
	}
}

// TestCheckpointFailure: a checkpoint that fails keeps its records visible
// and in the WAL; Flush and Scan report it; the next one writes them. If the
// one of Close fails, the WAL stays and the next Open replays it.
func TestCheckpointFailure(t *testing.T) {
	o := testOptions(t)
	var (
		mu      sync.Mutex
		results []string // what OnCheckpoint was told, in order
	)
	o.OnCheckpoint = func(records int, _ time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, fmt.Sprintf("%d %v", records, err != nil))
	}
	reported := func(when string, want ...string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(results, want) {
			t.Errorf("%s: OnCheckpoint saw (records, failed) %q; want %q", when, results, want)
		}
		results = nil
	}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	s.ck.beforeCommit = func(*bolt.Tx) error { // the checkpointer is idle until the first checkpoint
		if fail.Load() {
			return errors.New("injected failure")
		}
		return nil
	}
	submit(t, s, put("a", 10, "a"))
	fail.Store(true)
	if err := s.checkpointNow(); err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Errorf("failing checkpoint = %v; want the injected failure", err)
	}
	reported("a failed checkpoint", "1 true")
	submit(t, s, put("b", 20, "b"))
	want := map[string]stored{"a": {10, "a"}, "b": {20, "b"}}
	if got := getAll(t, s, "a", "b"); !reflect.DeepEqual(got, want) {
		t.Errorf("after a failed checkpoint: Get = %v; want %v", got, want)
	}
	if err := s.Flush(); err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Errorf("Flush() after a failed checkpoint = %v; want the failure", err)
	}
	if err := s.Flush(); err != nil {
		t.Errorf("second Flush() = %v; want nil (the failure was reported)", err)
	}
	fail.Store(false)
	if got := dump(t, s); !reflect.DeepEqual(got, want) { // Scan checkpoints again
		t.Errorf("after a checkpoint that succeeded: records = %v; want %v", got, want)
	}
	reported("the checkpoints after it (the failed one again, then b)", "1 false", "1 false")

	submit(t, s, put("c", 30, "c"))
	fail.Store(true)
	if err := s.Close(); err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Errorf("Close() with a failing checkpoint = %v; want the failure", err)
	}
	reported("the last checkpoint, failing", "1 true")
	if files := walFiles(t, o.Path); len(files) == 0 {
		t.Errorf("after a failed Close: no WAL file; want the WAL kept")
	}
	s = openStore(t, o)
	want["c"] = stored{30, "c"}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: records = %v; want %v", got, want)
	}
}

// TestWALBytes: WALBytes is the size of the WAL files on disk: it grows
// with the records committed, falls back once a checkpoint has written them
// into the data file, and keeps growing while checkpoints fail.
func TestWALBytes(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	var fail atomic.Bool
	s.ck.beforeCommit = func(*bolt.Tx) error { // the checkpointer is idle until the first checkpoint
		if fail.Load() {
			return errors.New("injected failure")
		}
		return nil
	}
	size := func(when string) int64 {
		t.Helper()
		n, err := s.WALBytes()
		if err != nil {
			t.Fatalf("%s: WALBytes() = %v", when, err)
		}
		var files int64
		for _, f := range walFiles(t, o.Path) {
			info, err := os.Stat(f.path)
			if err != nil {
				t.Fatal(err)
			}
			files += info.Size()
		}
		if n != files {
			t.Errorf("%s: WALBytes() = %d; the WAL files hold %d bytes", when, n, files)
		}
		return n
	}
	if n := size("new"); n != walHeaderLen {
		t.Errorf("new store: WALBytes() = %d; want %d, a file's header", n, walHeaderLen)
	}
	value := strings.Repeat("v", 1000)
	write := func(prefix string) {
		for i := range 10 {
			submit(t, s, put(fmt.Sprintf("%s%d", prefix, i), 10, value))
		}
	}
	write("a")
	grown := size("after 10 records")
	if grown < walHeaderLen+10*1000 {
		t.Errorf("after 10 records of 1000 bytes: WALBytes() = %d; want at least %d", grown, walHeaderLen+10*1000)
	}
	checkpoint(t, s)
	if n := size("after a checkpoint"); n >= 1000 {
		t.Errorf("after a checkpoint: WALBytes() = %d; want the records gone from the WAL (%d before)", n, grown)
	}

	fail.Store(true)
	write("b")
	before := size("before a failing checkpoint")
	if err := s.checkpointNow(); err == nil {
		t.Fatal("failing checkpoint = nil; want the injected failure")
	}
	if err := s.Flush(); err == nil { // reports the failure once
		t.Error("Flush() after a failed checkpoint = nil; want the failure")
	}
	write("c")
	if n := size("after a failed checkpoint"); n < before+10*1000 {
		t.Errorf("after a failed checkpoint and 10 more records: WALBytes() = %d; want at least %d (the failed checkpoint's records stay)", n, before+10*1000)
	}
	fail.Store(false)
	checkpoint(t, s)
	if n := size("after checkpoints succeed again"); n >= 1000 {
		t.Errorf("after checkpoints succeed again: WALBytes() = %d; want the records gone from the WAL", n)
	}
}

// TestWALIgnoresCheckpointed: a WAL file that a checkpoint wrote into the
// data file but could not remove is not replayed over newer records.
func TestWALIgnoresCheckpointed(t *testing.T) {
	o := testOptions(t)
	o.CheckpointKeys = 1
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := blockCheckpoints(s)
	submit(t, s, put("k", 10, "old")) // its WAL is frozen and checkpointed
	<-entered
	first := walFiles(t, o.Path)[0]
	saved := readFile(t, first.path)
	release()
	checkpoint(t, s)
	if _, err := os.Stat(first.path); err == nil {
		t.Fatalf("checkpointed WAL %s still there", first.path)
	}
	submit(t, s, put("k", 20, "new"))
	submit(t, s, put("x", 30, "x"))
	crash(t, s)
	writeFile(t, first.path, saved) // as if its removal had failed

	s = openStore(t, o)
	want := map[string]stored{"k": {20, "new"}, "x": {30, "x"}}
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: records = %v; want %v", got, want)
	}
}

// FuzzDecodeWAL: the WAL decoder never panics, and the frames it accepts
// and the tail it sets aside (torn, or a damaged last frame) make up the
// whole file.
func FuzzDecodeWAL(f *testing.F) {
	var e frameEncoder
	file := append([]byte(nil), walHeader...)
	for seq := uint64(1); seq <= 3; seq++ {
		e.begin(seq)
		e.record(&Record{Key: fmt.Sprint("key", seq), Deadline: int64(seq * 10), Value: []byte("value")})
		e.record(&Record{Key: fmt.Sprint("key", seq), Deadline: int64(seq*10 + 1), Value: []byte("+more"), Append: true})
		e.record(&Record{Key: "gone"})
		frame, _ := e.end()
		file = append(file, frame...)
	}
	f.Add(file)
	f.Add(file[:len(file)-3])
	f.Add(walHeader)
	f.Add([]byte("SLUIC"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var recs []walRecord
		sc, err := decodeWAL(bytes.NewReader(data), int64(len(data)), 1, func(r walRecord) error {
			recs = append(recs, r)
			return nil
		})
		if err != nil {
			return
		}
		if sc.records != len(recs) || sc.torn < 0 || sc.damaged < 0 || (sc.torn > 0 && sc.damaged > 0) || sc.torn+sc.damaged > len(data) {
			t.Fatalf("decodeWAL = %+v with %d records; inconsistent", sc, len(recs))
		}
		// The accepted frames and the tail set aside cover the file.
		off := walHeaderLen
		for range sc.frames {
			off += frameHeaderLen + int(binary.LittleEndian.Uint32(data[off:]))
		}
		if off != len(data)-sc.torn-sc.damaged {
			t.Fatalf("%d frames end at %d; the decoder said %d bytes of %d are torn, %d damaged", sc.frames, off, sc.torn, len(data), sc.damaged)
		}
	})
}

// TestDeadlinesModel: random puts (deadlines moving both ways), deletions,
// sweeps and checkpoints, checked after each step against a model: the
// records are the model's, a Sweep leaves nothing expired, and NextDeadline
// is the earliest deadline of the model: exactly until the first
// checkpoint (the data file's index holds lower bounds), never later than
// it, and after a Sweep(now) later than now. A last Sweep past every
// deadline leaves the data file and its index empty: no entry is lost and
// none is left behind.
func TestDeadlinesModel(t *testing.T) {
	for _, withCheckpoints := range []bool{false, true} {
		t.Run(fmt.Sprintf("checkpoints=%t", withCheckpoints), func(t *testing.T) {
			o := testOptions(t)
			o.Logger = nil
			s := openStore(t, o)
			s.w.sweepBudget = 3 // the writer is idle: it reads it after the first send
			rng := rand.New(rand.NewPCG(1, uint64(len(t.Name()))))
			model := make(map[string]stored)
			now := int64(1000)
			exact, checkpointed := true, false
			for step := range 3000 {
				swept := false
				switch op := rng.IntN(20); {
				case op < 12:
					k := fmt.Sprintf("k%02d", rng.IntN(40))
					d := now + 1 + rng.Int64N(200)
					submit(t, s, put(k, d, fmt.Sprint(step)))
					model[k] = stored{d, fmt.Sprint(step)}
					exact = !checkpointed
				case op < 15:
					k := fmt.Sprintf("k%02d", rng.IntN(40))
					submit(t, s, del(k))
					delete(model, k)
					exact = !checkpointed
				case op < 18:
					now += rng.Int64N(60)
					if err := wait(t, s.Sweep(now)); err != nil {
						t.Fatalf("step %d: Sweep(%d) = %v", step, now, err)
					}
					for k, r := range model {
						if r.Deadline <= now {
							delete(model, k)
						}
					}
					swept = true
				case withCheckpoints:
					checkpoint(t, s)
					exact, checkpointed = false, true
				}
				if got := getAll(t, s, keysOf(model, 40)...); !reflect.DeepEqual(got, model) {
					t.Fatalf("step %d: records %v; want %v", step, got, model)
				}
				want := int64(0)
				for _, r := range model {
					if want == 0 || r.Deadline < want {
						want = r.Deadline
					}
				}
				got := s.NextDeadline()
				switch {
				case exact && got != want:
					t.Fatalf("step %d: NextDeadline() = %d; want %d", step, got, want)
				case want != 0 && (got == 0 || got > want):
					t.Fatalf("step %d: NextDeadline() = %d; want at most %d", step, got, want)
				case swept && got != 0 && got <= now:
					t.Fatalf("step %d: NextDeadline() = %d after Sweep(%d); want later", step, got, now)
				}
			}
			now += 1000
			if err := wait(t, s.Sweep(now)); err != nil {
				t.Fatalf("Sweep(%d) = %v", now, err)
			}
			checkpoint(t, s)
			err := s.db.View(func(tx *bolt.Tx) error {
				for _, name := range [][]byte{bucketKeys, bucketExpiry} {
					if n := tx.Bucket(name).Stats().KeyN; n != 0 {
						t.Errorf("after Sweep(%d), past every deadline: %d keys in the %q bucket; want none", now, n, name)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// keysOf returns k00 to k(n-1): every key the model test may write.
func keysOf(map[string]stored, int) []string {
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	return keys
}

// TestSweepRewritten: when the data file's record of a key has expired but
// the overlay holds a newer record of it, a Sweep drops the index entry and
// keeps the record for the checkpoint that rewrites it; Get, NextDeadline,
// the checkpoint and a replay after a crash all see the newer record.
func TestSweepRewritten(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("a", 10, "a1"), put("b", 20, "b1"))
	checkpoint(t, s)
	submit(t, s, put("a", 50, "a2"))
	if got, want := s.NextDeadline(), int64(10); got != want {
		t.Errorf("before Sweep: NextDeadline() = %d; want %d (the data file's stale entry)", got, want)
	}
	if err := wait(t, s.Sweep(15)); err != nil {
		t.Fatalf("Sweep(15) = %v", err)
	}
	if got, want := s.NextDeadline(), int64(20); got != want {
		t.Errorf("after Sweep(15): NextDeadline() = %d; want %d", got, want)
	}
	want := map[string]stored{"a": {50, "a2"}, "b": {20, "b1"}}
	if got := getAll(t, s, "a", "b"); !reflect.DeepEqual(got, want) {
		t.Errorf("after Sweep(15): Get = %v; want %v", got, want)
	}
	crash(t, s)

	s = openStore(t, o)
	if got := dump(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after a crash and replay: records = %v; want %v", got, want)
	}
	checkIndex(t, s)
	if err := wait(t, s.Sweep(30)); err != nil {
		t.Fatalf("Sweep(30) = %v", err)
	}
	if got, want := dump(t, s), map[string]stored{"a": {50, "a2"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("after Sweep(30): records = %v; want %v", got, want)
	}
	checkIndex(t, s)
}
