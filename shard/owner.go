package shard

// Ownership across nodes uses rendezvous hashing (highest random weight):
// every node gets a score for a key, and the node with the highest score
// owns it. Scores depend only on the key and the node's name, so
//
//   - a node that joins takes, from every other node, only the keys on which
//     it now scores highest (about 1/N of them), and nothing else moves;
//   - a node that leaves gives away only its own keys, each to the node that
//     scored second on it;
//   - a node that restarts on a new address keeps its keys: its address is
//     never hashed.
//
// The functions here are pure and allocation-free; cluster keeps each
// member's NodeHash next to the member so that finding an owner costs one
// multiply-xorshift mix per member.

// nodeSeed separates node hashes from key hashes: a key spelled like a node
// name must not get a special score on that node.
const nodeSeed = 0x9e3779b97f4a7c15

// NodeHash returns the hash of a node name used in rendezvous scores. Like
// Hash it is stable across processes, machines and releases.
func NodeHash(name string) uint64 { return Mix(Hash(name) ^ nodeSeed) }

// Score returns the rendezvous weight of a key (its Hash) on a node (its
// NodeHash). It is a bijective 64-bit mix of their XOR, so that for a fixed
// key the scores of different nodes are independent and uniform, and for a
// fixed node the scores of different keys are too.
func Score(keyHash, nodeHash uint64) uint64 { return Mix(keyHash ^ nodeHash) }

// Owner returns the index in nodeHashes of the node that owns the key whose
// Hash is keyHash: the one with the highest Score. Equal scores go to the
// lowest index, so a caller that sorts its nodes by name breaks ties by
// name. It returns -1 when nodeHashes is empty.
func Owner(keyHash uint64, nodeHashes []uint64) int {
	if len(nodeHashes) == 0 {
		return -1
	}
	best, bestScore := 0, Score(keyHash, nodeHashes[0])
	for i := 1; i < len(nodeHashes); i++ {
		if s := Score(keyHash, nodeHashes[i]); s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// Mix is a bijective 64-bit finalizer (splitmix64's, variant 13 of David
// Stafford's mixers): every input bit flips each output bit with probability
// close to one half.
func Mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
