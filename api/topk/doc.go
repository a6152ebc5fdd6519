// Package topk finds the keys counted most in a stream, in bounded memory,
// with a stated error: the space-saving algorithm of Metwally, Agrawal and
// El Abbadi ("Efficient computation of frequent and top-k elements in data
// streams", 2005), and the merge of its summaries (Agarwal et al.,
// "Mergeable summaries", 2012).
//
// A Sketch keeps at most Capacity counters. A key that has a counter adds
// to it; a new key, when every counter is taken, takes over the smallest
// counter m: its count becomes m plus its weight, and its error m. So a
// counter's count never undercounts its key, and overcounts it by at most
// its error, which is at most N/Capacity for a stream of total weight N.
// A key that has no counter was counted at most the smallest count: every
// key counted more than N/Capacity has a counter.
//
// A Summary states these bounds: for each listed key, its true count is in
// [Count−Err, Count]; a key not listed had at most Floor. Merge combines
// the summaries of any split of a stream (per stripe, per time bucket, per
// node) into one with the same guarantees, and Truncate keeps the largest
// counts without breaking them (Floor rises to the largest count dropped).
// The error of a merged summary is at most the sum of its parts' errors.
//
// A Sketch is not safe for concurrent use; its owner locks it (see
// api/traffic, which keeps one per stripe and time bucket). Add does not
// allocate once Capacity keys were seen; Reset keeps the memory.
package topk
