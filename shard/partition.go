package shard

import "fmt"

// MaxPartitions is the most partitions a cluster may have.
const MaxPartitions = 1 << 16

// Partition returns the partition in [0, n) of a key whose hash is h (see
// Hash). n must be a power of two (see CheckPartitions).
//
// It takes the hash's low bits. Index takes its high bits (multiply-shift),
// so the two do not correlate: the keys of one partition spread over every
// actor of a node, as they must for a node leading a few partitions to use
// all its cores. Reduce(h, n) instead would put partition p on actor
// p·actors/n. Clients compute partitions to route by them, so the mapping
// must never change (TestPartitionStable).
func Partition(h uint64, n int) int { return int(h & uint64(n-1)) }

// CheckPartitions returns an error unless n is a valid partition count: a
// power of two from 1 to MaxPartitions.
func CheckPartitions(n int) error {
	if n < 1 || n > MaxPartitions || n&(n-1) != 0 {
		return fmt.Errorf("shard: %d partitions: want a power of two from 1 to %d", n, MaxPartitions)
	}
	return nil
}
