package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// BenchmarkCheck: one check at a time, and from many goroutines at once
// (coalesced), against a node in this process (memory mode), on 10,000
// keys that are never denied; and a key the cache denies.
//
//	go test -run '^$' -bench . -benchtime 2s ./client
func BenchmarkCheck(b *testing.B) {
	n := nodetest.Start(b, "n1", nil)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("bench-", i)
	}
	b.Run("sequential", func(b *testing.B) {
		c := newClient(b, n.Addr, nil)
		ctx := context.Background()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := c.Check(ctx, client.Check{Key: keys[i%len(keys)], Limit: 1 << 40, Window: time.Minute}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		c := newClient(b, n.Addr, nil)
		ctx := context.Background()
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if _, err := c.Check(ctx, client.Check{Key: keys[i%len(keys)], Limit: 1 << 40, Window: time.Minute}); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
		s := c.Stats()
		b.ReportMetric(float64(s.Batched)/float64(max(s.Calls, 1)), "checks/call")
	})
	b.Run("cached-denial", func(b *testing.B) {
		c := newClient(b, n.Addr, nil)
		ctx := context.Background()
		ch := client.Check{Key: "denied", Limit: 1, Window: time.Hour}
		c.Check(ctx, ch)
		c.Check(ctx, ch)
		b.ReportAllocs()
		for b.Loop() {
			if d, _ := c.Check(ctx, ch); d.Source != client.SourceCache {
				b.Fatalf("decision %+v; want from the cache", d)
			}
		}
	})
}

// BenchmarkHotKey: one key checked from 16 goroutines at once, against a
// node in this process: each hit asked of Sluice (coalesced), or spent
// from quota leases (slices of 1,000 hits lasting 100 ms).
//
//	go test -run '^$' -bench HotKey -benchtime 2s -count 6 ./client
func BenchmarkHotKey(b *testing.B) {
	n := nodetest.Start(b, "n1", nil)
	hot := client.Check{Key: "hot", Limit: 1 << 40, Window: time.Minute}
	b.Run("check", func(b *testing.B) {
		c := newClient(b, n.Addr, nil)
		ctx := context.Background()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Check(ctx, hot); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("lease", func(b *testing.B) {
		c := newClient(b, n.Addr, nil)
		ctx := context.Background()
		l, err := c.Lease(hot, client.LeaseConfig{Slice: 1000, TTL: 100 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if d, err := l.Allow(ctx); err != nil || !d.Allowed {
					b.Errorf("Allow = %+v, %v", d, err)
					return
				}
			}
		})
		st := l.Stats()
		b.ReportMetric(float64(st.Local)/float64(max(st.Local+st.Direct, 1)), "local/hit")
		l.Close(ctx)
	})
}
