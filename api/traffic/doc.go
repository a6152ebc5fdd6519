// Package traffic keeps what a node's decision APIs were asked, for the
// operator's view (the web UI and `sluice top`): the keys decided and
// denied most over the last minute, each with an error bound (api/topk),
// decisions, denials, errors and requests per second over the last
// minutes, and the latency of requests over the last minute. It keeps
// nothing on disk and nothing per key beyond a fixed number of counters:
// its memory is bounded by Config whatever keys clients send.
//
// # Time
//
// Key counts and latencies are kept in buckets of Config.Bucket (10 s) of
// the node's clock, the last Config.Buckets (6) of them: a snapshot covers
// the current, partial bucket and the five before it, between 50 and 60
// seconds (Snapshot.Window says exactly). Per-second counts go back
// Config.Seconds (300). A bucket or a second is cleared when the clock
// comes back to its slot, so idle costs nothing.
//
// # Concurrency
//
// Request is on the decision path and must stay cheap: one call per
// decision request, one mutex, no allocation. The Recorder is split into
// stripes, each with its own mutex, sketches and counters. A request goes
// to the stripe its first key's hash picks, so that a key's counts usually
// sit in one sketch; if that stripe is busy, the next free one takes it
// (TryLock), so a request never waits for another; only when every stripe
// is busy does it wait for its own. Snapshot merges the
// stripes with topk.Merge, whose bounds hold for any split of the stream.
package traffic
