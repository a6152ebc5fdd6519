package persist

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// pagesSize returns the bytes of the data file's pages up to the last one in
// use. The file itself grows by bbolt's AllocSize (16 MiB) at a time.
func pagesSize(t testing.TB, s *Store) int64 {
	t.Helper()
	var n int64
	if err := s.view(func(tx *bolt.Tx) error { n = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCompactAfterExpiry: once a flood of keys has expired and been swept,
// the data file is compacted back to within twice the pages of a file that
// holds the live keys alone; the live records, the index and the meta
// records are all there, reads during the compaction succeed, and the new
// file takes commits and reopens.
func TestCompactAfterExpiry(t *testing.T) {
	o := testOptions(t)
	o.CompactMinFree = 1 << 20
	compacted := make(chan [2]int64, 8)
	o.OnCompact = func(before, after int64, _ time.Duration) { compacted <- [2]int64{before, after} }
	s := openStore(t, o)

	value := strings.Repeat("x", 100)
	live := make(map[string]stored)
	var liveKeys []string
	for b := range 20 {
		recs := make([]Record, 0, 1000)
		for i := range 1000 {
			k := fmt.Sprintf("flood/%02d/%04d", b, i)
			if i%60 == 0 {
				live[k] = stored{1000, value}
				liveKeys = append(liveKeys, k)
				recs = append(recs, put(k, 1000, value))
				continue
			}
			recs = append(recs, put(k, 10, value))
		}
		submit(t, s, recs...)
	}
	checkpoint(t, s)
	if err := s.PutMeta("test", "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	flooded := pagesSize(t, s)

	// A reference file holding the live keys alone.
	ro := testOptions(t)
	ref := openStore(t, ro)
	for k, r := range live {
		submit(t, ref, put(k, r.Deadline, r.Value))
	}
	checkpoint(t, ref)
	need := pagesSize(t, ref)

	// Reads of live keys run all along the sweep and the compaction.
	var reads atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			found := 0
			if err := s.Get(liveKeys[:10], func(int, int64, []byte) { found++ }); err != nil || found != 10 {
				t.Errorf("during the compaction: Get found %d of 10 live keys, err %v", found, err)
				return
			}
			reads.Add(1)
		}
	}()
	stopReads := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopReads()
	if err := wait(t, s.Sweep(100)); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-compacted:
		t.Logf("compacted %d -> %d bytes; %d bytes flooded, live keys alone %d", c[0], c[1], flooded, need)
	case <-time.After(waitTimeout):
		t.Fatalf("no compaction %v after the sweep", waitTimeout)
	}
	stopReads()
	t.Logf("%d reads during the sweep and the compaction", reads.Load())
	if got := pagesSize(t, s); got > 2*need {
		t.Errorf("after the compaction: %d bytes of pages; want at most twice the %d bytes of the live keys alone (flooded: %d)", got, need, flooded)
	}
	if got := fileSize(t, o.Path); got > 16<<20+need {
		t.Errorf("after the compaction: file of %d bytes; want at most bbolt's 16 MiB step past the %d bytes of the live keys alone", got, need)
	}
	if _, err := os.Stat(compactName(o.Path)); !os.IsNotExist(err) {
		t.Errorf("the compaction's copy is still there: %v", err)
	}
	if got := dump(t, s); !reflect.DeepEqual(got, live) {
		t.Errorf("after the compaction: %d records; want the %d live ones", len(got), len(live))
	}
	if v, err := getMeta(s, "test", "k"); err != nil || v != "v" {
		t.Errorf("after the compaction: meta record = %q, %v; want \"v\"", v, err)
	}
	checkIndex(t, s)

	submit(t, s, put("after", 1000, "a"))
	live["after"] = stored{1000, "a"}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	if got := dump(t, s); !reflect.DeepEqual(got, live) {
		t.Errorf("reopened: %d records; want %d", len(got), len(live))
	}
}

// getMeta reads one meta record.
func getMeta(s *Store, bucket, key string) (string, error) {
	var v string
	err := s.ScanMeta(bucket, func(k string, value []byte) bool {
		if k == key {
			v = string(value)
		}
		return true
	})
	return v, err
}

// TestCompactLeftover: a compaction's copy left by a crash is removed by
// Open, and the data file is read as it was.
func TestCompactLeftover(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	submit(t, s, put("a", 10, "a"))
	crash(t, s)
	if err := os.WriteFile(compactName(o.Path), []byte("half a copy"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, o)
	if _, err := os.Stat(compactName(o.Path)); !os.IsNotExist(err) {
		t.Errorf("after Open, %s: %v; want it removed", filepath.Base(compactName(o.Path)), err)
	}
	if got, want := dump(t, s), map[string]stored{"a": {10, "a"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("records = %v; want %v", got, want)
	}
}
