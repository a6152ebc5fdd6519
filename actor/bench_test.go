package actor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/persist"
)

// BenchmarkEngine measures decisions per second through the actors: one hot
// key or 100k uniform keys, one check or ten per call, per storage mode, with
// 64 concurrent callers per CPU.
func BenchmarkEngine(b *testing.B) {
	for _, mode := range []string{"memory", "commit", "fsync"} {
		for _, keys := range []int{1, 100_000} {
			for _, batch := range []int{1, 10} {
				name := fmt.Sprintf("%s/keys=%d/batch=%d", mode, keys, batch)
				b.Run(name, func(b *testing.B) { benchEngine(b, mode, keys, batch) })
			}
		}
	}
}

// BenchmarkEngineReplicated is BenchmarkEngine in the commit mode with a
// Replicator that confirms every write at once, on the actor's goroutine
// (inline), or from another goroutine (goroutine): the cost of the hook
// itself, without a network.
func BenchmarkEngineReplicated(b *testing.B) {
	for _, kind := range []string{"inline", "goroutine"} {
		for _, keys := range []int{1, 100_000} {
			for _, batch := range []int{1, 10} {
				name := fmt.Sprintf("commit/replicator=%s/keys=%d/batch=%d", kind, keys, batch)
				b.Run(name, func(b *testing.B) {
					var rep Replicator = inlineReplicator{}
					if kind == "goroutine" {
						r := newGoroutineReplicator()
						defer r.close()
						rep = r
					}
					benchEngineWith(b, "commit", keys, batch, rep)
				})
			}
		}
	}
}

// inlineReplicator confirms every write at once.
type inlineReplicator struct{}

func (inlineReplicator) Replicate(_ []persist.Record, done func(error)) { done(nil) }

// goroutineReplicator confirms every write from a goroutine of its own.
type goroutineReplicator struct {
	ch   chan func(error)
	quit chan struct{}
	wg   sync.WaitGroup
}

func newGoroutineReplicator() *goroutineReplicator {
	r := &goroutineReplicator{ch: make(chan func(error), 1<<16), quit: make(chan struct{})}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case done := <-r.ch:
				done(nil)
			case <-r.quit:
				return
			}
		}
	}()
	return r
}

func (r *goroutineReplicator) Replicate(_ []persist.Record, done func(error)) {
	select {
	case r.ch <- done:
	default:
		go done(nil) // never block the actor
	}
}

// close stops the goroutine once the engine is closed.
func (r *goroutineReplicator) close() {
	close(r.quit)
	r.wg.Wait()
}

func benchEngine(b *testing.B, mode string, keys, batch int) {
	benchEngineWith(b, mode, keys, batch, nil)
}

func benchEngineWith(b *testing.B, mode string, keys, batch int, rep Replicator) {
	cfg := Config{Replicator: rep}
	if mode != "memory" {
		m, _ := persist.ParseMode(mode)
		st, err := persist.Open(persist.Options{Path: filepath.Join(b.TempDir(), "sluice.db"), Mode: m})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		cfg.Store = st
	}
	eng, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("bench:tenant:%d", i)
	}
	b.SetParallelism(64)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 0))
		checks := make([]Check, batch)
		out := make([]Decision, batch)
		for pb.Next() {
			for i := range checks {
				checks[i] = Check{Key: names[rng.IntN(keys)], Limit: 1 << 40, Window: time.Second, Cost: 1}
			}
			if err := eng.Check(context.Background(), checks, out); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(0, "ns/op")
}
