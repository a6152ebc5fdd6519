package shard

import (
	"fmt"
	"math"
	"testing"
)

func nodeHashes(names ...string) []uint64 {
	hs := make([]uint64, len(names))
	for i, n := range names {
		hs[i] = NodeHash(n)
	}
	return hs
}

func nodeNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("sluice-%d", i)
	}
	return names
}

// TestOwnerStable pins the ownership hash: a change here moves keys between
// nodes, which a rolling upgrade must never do silently (two versions would
// disagree on owners).
func TestOwnerStable(t *testing.T) {
	if got, want := NodeHash("sluice-0"), uint64(0x9f4f9bf04e4ade2c); got != want {
		t.Errorf("NodeHash(%q) = %#x; want %#x (the hash must never change)", "sluice-0", got, want)
	}
	if got, want := Score(Hash("user:1"), NodeHash("sluice-0")), uint64(0x957b528d909e9f93); got != want {
		t.Errorf("Score(user:1, sluice-0) = %#x; want %#x (the score must never change)", got, want)
	}
	hs := nodeHashes(nodeNames(3)...)
	tests := []struct {
		key  string
		want int
	}{
		{"user:1", 1},
		{"user:2", 0},
		{"a", 0},
		{"b", 2},
		{"", 2},
	}
	for _, tt := range tests {
		if got := Owner(Hash(tt.key), hs); got != tt.want {
			t.Errorf("Owner(%q, 3 nodes) = %d; want %d", tt.key, got, tt.want)
		}
	}
}

func TestOwnerEdges(t *testing.T) {
	if got := Owner(Hash("k"), nil); got != -1 {
		t.Errorf("Owner(k, no nodes) = %d; want -1", got)
	}
	if got := Owner(Hash("k"), nodeHashes("only")); got != 0 {
		t.Errorf("Owner(k, one node) = %d; want 0", got)
	}
	// Equal scores (here: the same node hash twice) go to the lowest index.
	h := NodeHash("twin")
	for i := 0; i < 100; i++ {
		if got := Owner(Hash(fmt.Sprint(i)), []uint64{h, h}); got != 0 {
			t.Fatalf("Owner(%d, [twin twin]) = %d; want 0 (ties to the lowest index)", i, got)
		}
	}
}

// TestOwnerLastCharacterSpread: keys that differ only in their last
// character spread over the nodes like random keys.
func TestOwnerLastCharacterSpread(t *testing.T) {
	hs := nodeHashes(nodeNames(4)...)
	counts := make([]int, len(hs))
	const prefixes = 400
	for p := 0; p < prefixes; p++ {
		for c := 0; c < 256; c++ {
			key := fmt.Sprintf("tenant-%d/route:%c", p, rune(c))
			counts[Owner(Hash(key), hs)]++
		}
	}
	checkUniform(t, "last character", counts, prefixes*256)
	// And within one prefix, the 256 variants do not all land together.
	for p := 0; p < 50; p++ {
		per := make([]int, len(hs))
		for c := 0; c < 256; c++ {
			per[Owner(Hash(fmt.Sprintf("k%d:%c", p, rune(c))), hs)]++
		}
		for i, n := range per {
			if n < 32 || n > 100 {
				t.Errorf("prefix k%d: node %d owns %d of 256 keys differing in their last byte; want about 64", p, i, n)
			}
		}
	}
}

func checkUniform(t *testing.T, what string, counts []int, total int) {
	t.Helper()
	n := len(counts)
	mean := float64(total) / float64(n)
	sigma := math.Sqrt(mean * (1 - 1/float64(n)))
	for i, c := range counts {
		if dev := math.Abs(float64(c) - mean); dev > 5*sigma {
			t.Errorf("%s, %d nodes: node %d owns %d keys, %.1f sigma off the mean %.0f", what, n, i, c, dev/sigma, mean)
		}
	}
}

// TestOwnerUniform: over 100k keys each of N nodes owns close to 1/N.
func TestOwnerUniform(t *testing.T) {
	for _, n := range []int{2, 3, 5, 10, 33, 100} {
		hs := nodeHashes(nodeNames(n)...)
		counts := make([]int, n)
		const keys = 100_000
		for i := 0; i < keys; i++ {
			counts[Owner(Hash(fmt.Sprintf("user:%d", i)), hs)]++
		}
		checkUniform(t, "user:%d keys", counts, keys)
	}
}

// TestOwnerMinimalMovement states the rendezvous invariants: when a node
// joins, every key that moves goes to the new node; when a node leaves, only
// its keys move.
func TestOwnerMinimalMovement(t *testing.T) {
	names := nodeNames(5)
	four := nodeHashes(names[:4]...)
	five := nodeHashes(names...)
	withoutTwo := nodeHashes(names[0], names[1], names[3])
	for i := 0; i < 20_000; i++ {
		h := Hash(fmt.Sprintf("key-%d", i))
		before, after := Owner(h, four), Owner(h, five)
		if before != after && after != 4 {
			t.Fatalf("key-%d moved from node %d to node %d when node 4 joined; only moves to the joiner are allowed", i, before, after)
		}
		gone := Owner(h, withoutTwo)
		// Map the index in withoutTwo back to the index in four.
		back := []int{0, 1, 3}[gone]
		if before != 2 && back != before {
			t.Fatalf("key-%d moved from node %d to node %d when node 2 left; only the leaver's keys may move", i, before, back)
		}
	}
}

func TestOwnerAllocs(t *testing.T) {
	hs := nodeHashes(nodeNames(100)...)
	h := Hash("user:1")
	if got := testing.AllocsPerRun(100, func() { Owner(h, hs) }); got != 0 {
		t.Errorf("Owner over 100 nodes allocates %v times; want 0", got)
	}
}

func BenchmarkOwner(b *testing.B) {
	for _, n := range []int{3, 10, 100} {
		hs := nodeHashes(nodeNames(n)...)
		keys := make([]uint64, 1024)
		for i := range keys {
			keys[i] = Hash(fmt.Sprintf("user:%d", i))
		}
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			sink := 0
			for i := 0; b.Loop(); i++ {
				sink += Owner(keys[i&1023], hs)
			}
			_ = sink
		})
	}
}
