// Package loadgen is the engine of "sluice bench": it drives a Sluice node
// with checks through the native API (sluice.v1.RateLimitService/Check) or
// Envoy's Rate Limit Service v3 (ShouldRateLimit) and measures what came
// back.
//
// # Loops
//
// In a closed loop (Config.Rate 0) each of Config.Concurrency workers sends
// a call, waits for its answer and sends the next one: the load adapts to
// the server, which measures its capacity. Latency is measured from the
// moment a call is sent.
//
// In an open loop (Config.Rate > 0) calls are scheduled evenly, call i at
// start + i/Rate, whatever the server does; a free worker takes the next
// scheduled call, waits for its time and sends it. Latency is measured from
// the scheduled time, not from the moment the call left, so that when the
// server (or the generator) falls behind, the wait shows up in the latency
// instead of silently lowering the load (no coordinated omission). A
// worker that was free and waiting for the time, though, measures from
// when its timer woke it: Go's timers fire up to a millisecond late in an
// idle process (the network poller sleeps in whole milliseconds), which at
// low rates added 0.5 ms to the median of a node that answers in 0.25 ms.
// That delay is the generator's own; Report.WakeLateMeanUs and
// WakeLateMaxUs give it. A call
// whose time came before the end of the run but that no worker was free to
// send by then is counted in Report.Unsent.
//
// # Timeline
//
// A run lasts Config.Warmup, then Config.Duration. Calls sent (closed
// loop) or scheduled (open loop) during the warmup are not recorded. No
// call starts after the end; calls in flight then get Config.Timeout to
// finish and are recorded. A cancelled context (SIGINT) stops the run
// early: calls it cuts are counted in Report.Unfinished, not as errors, and
// the report covers the time until the cancellation.
//
// # Latency histogram
//
// Latencies are recorded in HDR histograms (github.com/HdrHistogram/
// hdrhistogram-go) with 3 significant digits: a reported percentile is
// within 0.1% of the true value, from 1µs to 1h (longer latencies are
// recorded as 1h; the maximum is exact whatever its size). Workers record
// into a few histograms, each behind its own mutex, which are merged for the
// live progress (once a second) and for the report.
//
// # Concurrency
//
// Run starts Config.Concurrency worker goroutines and a progress goroutine
// and waits for all of them before it returns. Each worker owns its key
// picker, its caller (with a request it reuses from call to call) and its
// timer; the only shared state is the open-loop schedule (an atomic
// counter) and the recorders (mutexes).
package loadgen
