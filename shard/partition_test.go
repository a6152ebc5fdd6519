package shard

import (
	"fmt"
	"math"
	"testing"
)

// TestPartitionStable pins the partition function: clients route by it, so
// a change would send every call to the wrong leader.
func TestPartitionStable(t *testing.T) {
	tests := []struct {
		key  string
		n    int
		want int
	}{
		{"a", 256, 0x5b},
		{"user:1", 256, 0xf3},
		{"user:1", 1, 0},
		{"sluice", 1024, 0x37c},
	}
	for _, tt := range tests {
		if got := Partition(Hash(tt.key), tt.n); got != tt.want {
			t.Errorf("Partition(%q, %d) = %#x; want %#x", tt.key, tt.n, got, tt.want)
		}
	}
}

func TestCheckPartitions(t *testing.T) {
	for _, n := range []int{1, 2, 64, 256, MaxPartitions} {
		if err := CheckPartitions(n); err != nil {
			t.Errorf("CheckPartitions(%d) = %v; want nil", n, err)
		}
	}
	for _, n := range []int{-1, 0, 3, 100, MaxPartitions * 2} {
		if err := CheckPartitions(n); err == nil {
			t.Errorf("CheckPartitions(%d) = nil; want an error", n)
		}
	}
}

// TestPartitionSpreadsOverActors checks that partitions and actors do not
// correlate: the keys of every partition land on every actor about evenly,
// each (partition, actor) cell within six standard deviations of its mean.
// With Reduce in place of Partition each partition would fill one actor.
func TestPartitionSpreadsOverActors(t *testing.T) {
	const parts, actors, keys = 64, 16, 400_000
	var cells [parts][actors]int
	for i := range keys {
		h := Hash(fmt.Sprintf("tenant:%d", i))
		p := Partition(h, parts)
		if p < 0 || p >= parts {
			t.Fatalf("Partition(tenant:%d, %d) = %d; out of range", i, parts, p)
		}
		cells[p][Reduce(h, actors)]++
	}
	mean := float64(keys) / (parts * actors)
	sigma := math.Sqrt(mean)
	for p := range cells {
		for a, c := range cells[p] {
			if dev := math.Abs(float64(c) - mean); dev > 6*sigma {
				t.Errorf("partition %d holds %d keys on actor %d, %.1f sigma off the mean %.0f", p, c, a, dev/sigma, mean)
			}
		}
	}
}
