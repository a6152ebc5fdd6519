package persist

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestAppendTailMemory: appends to long values in the data file keep only
// their own bytes in the overlay, so that a few bytes appended to each of
// many long values start no checkpoint by memory; the values read, written
// by the next checkpoint and replayed after a crash are whole.
func TestAppendTailMemory(t *testing.T) {
	o := testOptions(t)
	o.CheckpointMemory = 256 << 10
	var ckpts atomic.Int32
	o.OnCheckpoint = func(int, time.Duration, error) { ckpts.Add(1) }
	s := openStore(t, o)
	const n = 200 // 200 values of 4 KB: 800 KB, three times the bound
	long := strings.Repeat("v", 4000)
	keys := make([]string, n)
	var puts []Record
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
		puts = append(puts, put(keys[i], 10, long))
	}
	submit(t, s, puts...)
	checkpoint(t, s)
	// The overlay that held the long values serves again, its entries
	// with their arrays: the tails must not count them.
	submit(t, s, put("other", 10, "o"))
	checkpoint(t, s)
	before := ckpts.Load()
	want := map[string]stored{"other": {10, "o"}}
	for round := range 5 {
		var apps []Record
		for _, k := range keys {
			apps = append(apps, app(k, int64(20+round), fmt.Sprintf("+%d", round)))
		}
		submit(t, s, apps...)
	}
	for _, k := range keys {
		want[k] = stored{24, long + "+0+1+2+3+4"}
	}
	if got := ckpts.Load() - before; got != 0 {
		t.Errorf("%d checkpoints for 10 bytes appended to each of %d values of 4 KB; want none (CheckpointMemory %d)", got, n, o.CheckpointMemory)
	}
	if m := s.cur.mem; m > n*(entryOverhead+64) {
		t.Errorf("the overlay counts %d bytes for %d tails of 10 bytes; want at most %d", m, n, n*(entryOverhead+64))
	}
	checkValues(t, "in the overlay", getAll(t, s, append(keys, "other")...), want)
	checkpoint(t, s)
	checkValues(t, "after a checkpoint", dump(t, s), want)

	// Tails again, then a crash: the replay rebuilds the same values.
	submit(t, s, app(keys[0], 30, "+5"), put(keys[1], 30, "p"), app(keys[1], 30, "+6"), del(keys[2]), app(keys[2], 30, "x"))
	want[keys[0]] = stored{30, want[keys[0]].Value + "+5"}
	want[keys[1]] = stored{30, "p+6"}
	want[keys[2]] = stored{30, "x"}
	checkValues(t, "before the crash", getAll(t, s, append(keys, "other")...), want)
	crash(t, s)
	s = openStore(t, o)
	checkValues(t, "after the crash", dump(t, s), want)
	checkIndex(t, s)
}

// TestAppendTailDuringCheckpoint: Get joins a tail to the value beneath it
// exactly once while the checkpoint that writes the tail into the data file
// is half done (its first transaction committed, its second not yet), for
// tails in the frozen overlay, in the current one over those, and in the
// current one over the data file, and once that checkpoint is written but
// its overlay not yet dropped; and a checkpoint that failed half way and is
// tried again appends each tail once.
func TestAppendTailDuringCheckpoint(t *testing.T) {
	o := testOptions(t)
	s := openStore(t, o)
	const n = 2*maxTxKeys + 10 // three transactions
	keys := make([]string, n)
	want := make(map[string]stored, n)
	var puts, apps []Record
	for i := range keys {
		keys[i] = fmt.Sprintf("k%05d", i)
		puts = append(puts, put(keys[i], 10, "v"+strings.Repeat(".", 100)))
		if i%2 == 0 { // odd keys stay in the data file, with no tail yet
			apps = append(apps, app(keys[i], 20, "+a"))
		}
	}
	submit(t, s, puts...)
	checkpoint(t, s)
	submit(t, s, apps...)
	for i, k := range keys {
		want[k] = stored{10, "v" + strings.Repeat(".", 100)}
		if i%2 == 0 {
			want[k] = stored{20, want[k].Value + "+a"}
		}
	}

	// The first try fails at its second transaction: the first half of
	// the keys are in the data file with their tails, the frozen overlay
	// holds all of them.
	var txs atomic.Int32
	s.ck.beforeCommit = func(*bolt.Tx) error {
		if txs.Add(1) == 2 {
			return errors.New("injected")
		}
		return nil
	}
	if err := s.checkpointNow(); err == nil {
		t.Fatal("checkpoint failing at its second transaction = nil; want the error")
	}
	checkValues(t, "after a failed checkpoint", getAll(t, s, keys...), want)

	// The retry waits in its second transaction.
	entered, release := blockCheckpoints(s)
	defer release()
	done := make(chan error, 1)
	go func() { done <- s.checkpointNow() }()
	<-entered
	var more []Record
	for i, k := range keys {
		if i%3 == 0 { // over frozen tails, and over the data file
			more = append(more, app(k, 30, "+b"))
			want[k] = stored{30, want[k].Value + "+b"}
		}
	}
	submit(t, s, more...)
	checkValues(t, "during the retry", getAll(t, s, keys...), want)
	release()
	if err := <-done; err != nil {
		t.Fatalf("retried checkpoint = %v", err)
	}
	checkValues(t, "after the retry", getAll(t, s, keys...), want)

	// Between a checkpoint's last commit and the drop of its overlay, the
	// data file holds the overlay's tails already.
	more = more[:0]
	for i, k := range keys {
		if i%5 == 0 {
			more = append(more, app(k, 40, "+c"))
			want[k] = stored{40, want[k].Value + "+c"}
		}
	}
	submit(t, s, more...)
	wrote, resume := make(chan struct{}), make(chan struct{})
	s.ck.beforeCommit = nil
	s.ck.afterWrite = func() {
		wrote <- struct{}{}
		<-resume
	}
	go func() { done <- s.checkpointNow() }()
	<-wrote
	checkValues(t, "once the checkpoint is written", getAll(t, s, keys...), want)
	close(resume)
	if err := <-done; err != nil {
		t.Fatalf("checkpoint = %v", err)
	}
	s.ck.afterWrite = nil
	checkValues(t, "in the data file", dump(t, s), want)
	crash(t, s)
	s = openStore(t, o)
	checkValues(t, "after a crash", dump(t, s), want)
}

// checkValues reports the keys whose value or deadline differ, the first
// few of them.
func checkValues(t *testing.T, when string, got, want map[string]stored) {
	t.Helper()
	bad := 0
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			if bad++; bad <= 3 {
				t.Errorf("%s: %s = %v (found %v); want %v", when, k, g, ok, w)
			}
		}
	}
	if bad > 0 || len(got) != len(want) {
		t.Errorf("%s: %d of %d keys wrong, %d found", when, bad, len(want), len(got))
	}
}
