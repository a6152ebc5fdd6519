// Package shard maps limiter keys to the actors that own them inside a node.
//
// The mapping is pure: it depends only on the key and the number of shards,
// so a key's actor changes only when that number does. The hash is xxHash64
// with a fixed seed (0), which mixes every byte of the key into every bit of
// the result: keys that differ only in their last character spread as evenly
// as random keys. The hash value is reduced to a shard with a multiply-shift
// (Lemire's fast range reduction) instead of a modulo, which keeps the
// distribution uniform for any shard count.
//
// Shard imports nothing from the rest of Sluice and may be used by any of it.
package shard

import (
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Hash returns the 64-bit hash of key. It is stable across processes,
// machines and releases: changing it would move keys between owners.
func Hash(key string) uint64 { return xxhash.Sum64String(key) }

// Index returns the shard in [0, n) that owns key. n must be positive.
func Index(key string, n int) int { return Reduce(Hash(key), n) }

// Reduce maps a hash value uniformly onto [0, n). n must be positive.
func Reduce(h uint64, n int) int {
	hi, _ := bits.Mul64(h, uint64(n))
	return int(hi)
}
