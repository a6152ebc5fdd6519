package persist

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// benchKeys is the number of distinct keys the benchmark writes to.
const benchKeys = 100_000

// benchValueLen is the size of a value: a few runs of a sliding log.
const benchValueLen = 64

// windows are the windows of the benchmark's limits: a record's deadline is
// the time of the write plus one of them, so the deadline index grows at a
// few points, as it does in service.
var windows = []int64{int64(time.Second), int64(time.Minute), int64(time.Hour)}

// BenchmarkSubmit measures records/s through Submit, each goroutine waiting
// for its batch to commit before the next, in ModeCommit and ModeFsync, with
// batches of 1, 10 and 100 records over 100k random keys already stored in
// the data file. Many more goroutines than CPUs submit at once
// (SetParallelism), as actors would, so that commits group the batches of
// many of them. The checkpoints that the WAL's growth starts run during the
// benchmark, on the checkpointer, as in service; the one of Close does not
// count.
func BenchmarkSubmit(b *testing.B) {
	for _, mode := range []Mode{ModeCommit, ModeFsync} {
		for _, batch := range []int{1, 10, 100} {
			b.Run(fmt.Sprintf("mode=%s/batch=%d", mode, batch), func(b *testing.B) {
				benchSubmit(b, benchCase{mode: mode, batch: batch, valueLen: benchValueLen})
			})
		}
	}
}

// benchLogLen is the size of a long sliding log's value, and benchRunLen
// what a hit adds to it.
const (
	benchLogLen = 2 << 10
	benchRunLen = 8
)

// BenchmarkSubmitLog compares the two ways to store a hit on a long
// sliding log, as BenchmarkSubmit runs them: the 100k keys hold values of
// 2 KiB, and each record either puts a value of 2 KiB (the whole log again)
// or appends 8 bytes (the run the hit adds) to it. The appended values grow
// by 8 bytes per record, about 80 bytes per key per million records.
func BenchmarkSubmitLog(b *testing.B) {
	for _, mode := range []Mode{ModeCommit, ModeFsync} {
		for _, batch := range []int{1, 10} {
			b.Run(fmt.Sprintf("mode=%s/batch=%d/op=put", mode, batch), func(b *testing.B) {
				benchSubmit(b, benchCase{mode: mode, batch: batch, valueLen: benchLogLen})
			})
			b.Run(fmt.Sprintf("mode=%s/batch=%d/op=append", mode, batch), func(b *testing.B) {
				benchSubmit(b, benchCase{mode: mode, batch: batch, valueLen: benchLogLen, appendLen: benchRunLen})
			})
		}
	}
}

// benchCase is a run of benchSubmit: the keys hold values of valueLen bytes;
// each record puts one, or, if appendLen > 0, appends that many bytes.
type benchCase struct {
	mode      Mode
	batch     int
	valueLen  int
	appendLen int
}

func benchSubmit(b *testing.B, bc benchCase) {
	mode, batch := bc.mode, bc.batch
	dir := b.TempDir()
	if d := os.Getenv("SLUICE_BENCH_DIR"); d != "" {
		dir = d // to measure another file system than the temporary one
	}
	var (
		txs     atomic.Int64
		txRecs  atomic.Int64
		txNanos atomic.Int64
		cks     atomic.Int64
		ckRecs  atomic.Int64
		ckNanos atomic.Int64
	)
	s, err := Open(Options{
		Path: filepath.Join(dir, fmt.Sprintf("bench-%s-%d-%d-%d.db", mode, batch, bc.valueLen, bc.appendLen)),
		Mode: mode,
		OnCommit: func(records int, d time.Duration) {
			txs.Add(1)
			txRecs.Add(int64(records))
			txNanos.Add(int64(d))
		},
		OnCheckpoint: func(records int, d time.Duration, _ error) {
			cks.Add(1)
			ckRecs.Add(int64(records))
			ckNanos.Add(int64(d))
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		if err := os.Remove(s.Path()); err != nil && !os.IsNotExist(err) {
			b.Fatal(err)
		}
	}()
	// Store every key once, so that the benchmark updates existing records.
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%03d/user-%08d", i%997, i)
	}
	base := time.Now().UnixNano()
	var recs []Record
	for i, key := range keys {
		recs = append(recs, Record{Key: key, Deadline: base + windows[i%len(windows)], Value: make([]byte, bc.valueLen)})
		if len(recs) == 10_000 {
			submit(b, s, recs...)
			recs = nil
		}
	}
	if err := s.checkpointNow(); err != nil {
		b.Fatal(err)
	}
	txs.Store(0)
	txRecs.Store(0)
	txNanos.Store(0)
	cks.Store(0)
	ckRecs.Store(0)
	ckNanos.Store(0)

	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		recs := make([]Record, batch)
		n := bc.valueLen
		if bc.appendLen > 0 {
			n = bc.appendLen
		}
		values := make([]byte, batch*n)
		for i := range values {
			values[i] = 1 // an append's value must not be empty
		}
		for pb.Next() {
			// The store owns recs until the commit is done; we wait for it,
			// so the same slices serve again.
			for i := range recs {
				recs[i] = Record{
					Key:      keys[rng.IntN(benchKeys)],
					Deadline: time.Now().UnixNano() + windows[rng.IntN(len(windows))],
					Value:    values[i*n : (i+1)*n],
					Append:   bc.appendLen > 0,
				}
			}
			c := s.Submit(recs, nil)
			<-c.Done()
			if err := c.Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "records/s")
	if n := txs.Load(); n > 0 {
		b.ReportMetric(float64(txRecs.Load())/float64(n), "records/tx")
		b.ReportMetric(float64(txNanos.Load())/float64(n)/1e6, "ms/tx")
	}
	if n := cks.Load(); n > 0 {
		b.ReportMetric(float64(ckRecs.Load())/float64(n), "keys/ckpt")
		b.ReportMetric(float64(ckNanos.Load())/float64(n)/1e6, "ms/ckpt")
	}
}

// BenchmarkCheckpoint measures one checkpoint of 100k keys, every key of a
// data file that holds them already, with new values and deadlines: the
// worst case, where every page of the file is rewritten. It reports the
// cost per key; the cost per record committed is that divided by how many
// times each key was written between checkpoints.
func BenchmarkCheckpoint(b *testing.B) {
	s, err := Open(Options{Path: filepath.Join(b.TempDir(), "bench-checkpoint.db")})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}()
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%03d/user-%08d", i%997, i)
	}
	fill := func() {
		base := time.Now().UnixNano()
		var recs []Record
		for i, key := range keys {
			recs = append(recs, Record{Key: key, Deadline: base + windows[i%len(windows)] + rand.Int64N(int64(time.Second)), Value: make([]byte, benchValueLen)})
			if len(recs) == 10_000 {
				submit(b, s, recs...)
				recs = nil
			}
		}
	}
	fill()
	if err := s.checkpointNow(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		fill()
		b.StartTimer()
		if err := s.checkpointNow(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchKeys), "ns/key")
}
