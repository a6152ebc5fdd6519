package persist

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCheckpointSortsKeys: a checkpoint writes an overlay's records in key
// order (bytewise, as bbolt orders them), whatever prefixes the keys share,
// including keys that are prefixes of others and keys with zero bytes
// where a shorter key ends.
func TestCheckpointSortsKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sets := map[string][]string{
		"one key":                {"solo"},
		"shared prefix":          nil,
		"prefixes of each other": {"a", "ab", "ab\x00", "ab\x00\x00", "abc", "abcdefghij", "abcdefghi", "abcdefgh\x00", "b", "\x00", "\xff\xff"},
		"random bytes":           nil,
	}
	for i := range 5000 {
		sets["shared prefix"] = append(sets["shared prefix"], fmt.Sprintf("bench:%d", rng.IntN(1_000_000)+i*1_000_000))
		b := make([]byte, 1+rng.IntN(12))
		for j := range b {
			b[j] = byte(rng.IntN(4)) // few symbols: many ties on long prefixes
		}
		sets["random bytes"] = append(sets["random bytes"], "tenant/"+string(b))
	}
	for name, keys := range sets {
		t.Run(name, func(t *testing.T) {
			ov := newOverlay()
			for _, k := range keys {
				ov.put(k, 1, []byte("v"))
			}
			var w bboltWriter
			w.sortEntries(ov)
			got := make([]string, len(w.ents))
			for i, e := range w.ents {
				got[i] = e.key
			}
			want := slices.Clone(keys)
			slices.Sort(want)
			want = slices.Compact(want)
			if !slices.Equal(got, want) {
				t.Fatalf("sorted %d keys: got %q...; want %q...", len(want), got[:min(len(got), 8)], want[:min(len(want), 8)])
			}
		})
	}
}
