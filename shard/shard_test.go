package shard

import (
	"fmt"
	"math"
	"testing"
)

// TestIndexStable pins the mapping: a change here moves keys between actors
// and owners, which a rolling upgrade must never do silently.
func TestIndexStable(t *testing.T) {
	tests := []struct {
		key  string
		n    int
		want int
	}{
		{"a", 16, 13},
		{"user:1", 7, 5},
		{"user:2", 7, 1},
		{"user:1", 1, 0},
	}
	for _, tt := range tests {
		if got := Index(tt.key, tt.n); got != tt.want {
			t.Errorf("Index(%q, %d) = %d; want %d", tt.key, tt.n, got, tt.want)
		}
	}
	if got, want := Hash("sluice"), uint64(0x4251fdf4a288237c); got != want {
		t.Errorf("Hash(%q) = %#x; want %#x (the hash must never change)", "sluice", got, want)
	}
}

// TestIndexUniform checks that keys differing only in their last characters
// spread like random keys: every shard within five standard deviations of
// the mean over 100k keys.
func TestIndexUniform(t *testing.T) {
	for _, n := range []int{3, 8, 16, 64} {
		counts := make([]int, n)
		const keys = 100_000
		for i := 0; i < keys; i++ {
			idx := Index(fmt.Sprintf("tenant:%d", i), n)
			if idx < 0 || idx >= n {
				t.Fatalf("Index(tenant:%d, %d) = %d; out of range", i, n, idx)
			}
			counts[idx]++
		}
		mean := float64(keys) / float64(n)
		sigma := math.Sqrt(mean * (1 - 1/float64(n)))
		for s, c := range counts {
			if dev := math.Abs(float64(c) - mean); dev > 5*sigma {
				t.Errorf("n=%d: shard %d holds %d keys, %.1f sigma off the mean %.0f", n, s, c, dev/sigma, mean)
			}
		}
	}
}

func BenchmarkIndex(b *testing.B) {
	key := "domain/remote_address=203.0.113.7/path=/api/v1/orders"
	for b.Loop() {
		_ = Index(key, 16)
	}
}
