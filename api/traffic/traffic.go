package traffic

import (
	"errors"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluice-io/sluice/api/topk"
)

// Config sizes a Recorder. The zero value of a field means its default.
type Config struct {
	// Stripes is how many parts the Recorder is split into, so that
	// concurrent decisions do not wait for each other. Default 8.
	Stripes int
	// Capacity is the counters of each key sketch (per stripe, per bucket,
	// one for decisions and one for denials). A snapshot's counts are
	// exact to within its Total/Capacity. Default 128.
	Capacity int
	// Bucket is the span of one bucket of key counts and latencies.
	// Default 10s.
	Bucket time.Duration
	// Buckets is how many buckets a snapshot covers, the current one
	// included. Default 6 (the last 50 to 60 seconds).
	Buckets int
	// Seconds is how many per-second counts are kept. Default 300.
	Seconds int
}

// DefaultConfig returns the default sizes: 8 stripes of 6 buckets of 10
// seconds, 128 counters per sketch, 300 seconds of per-second counts.
func DefaultConfig() Config {
	return Config{Stripes: 8, Capacity: 128, Bucket: 10 * time.Second, Buckets: 6, Seconds: 300}
}

// Validate reports negative sizes.
func (c Config) Validate() error {
	if c.Stripes < 0 || c.Capacity < 0 || c.Bucket < 0 || c.Buckets < 0 || c.Seconds < 0 {
		return errors.New("traffic: config: sizes must not be negative")
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Stripes == 0 {
		c.Stripes = d.Stripes
	}
	if c.Capacity == 0 {
		c.Capacity = d.Capacity
	}
	if c.Bucket == 0 {
		c.Bucket = d.Bucket
	}
	if c.Buckets == 0 {
		c.Buckets = d.Buckets
	}
	if c.Seconds == 0 {
		c.Seconds = d.Seconds
	}
	return c
}

// Recorder counts a node's decisions. Its methods are safe for concurrent
// use.
type Recorder struct {
	cfg     Config
	seed    maphash.Seed
	stripes []stripe
}

// stripe is one part of a Recorder, under its mutex.
type stripe struct {
	mu      sync.Mutex
	buckets []bucket
	seconds []second
	_       [64]byte // keeps two stripes' mutexes off one cache line
}

// bucket holds the key counts and latencies of one span of Config.Bucket.
type bucket struct {
	id                 int64 // start / Config.Bucket; 0 for never used
	decisions, denials *topk.Sketch
	latency            [latencyBuckets]uint32
	requests           uint64
	maxLatency         time.Duration
}

// second holds the counts of one second.
type second struct {
	unix                                 int64
	decisions, denials, errors, requests uint64
}

// New returns a Recorder sized by cfg.
func New(cfg Config) (*Recorder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Recorder{cfg: cfg, seed: maphash.MakeSeed(), stripes: make([]stripe, cfg.Stripes)}
	for i := range r.stripes {
		r.stripes[i].buckets = make([]bucket, cfg.Buckets)
		r.stripes[i].seconds = make([]second, cfg.Seconds)
	}
	return r, nil
}

// Config is the recorder's configuration, defaults filled in.
func (r *Recorder) Config() Config { return r.cfg }

// lock locks and returns a stripe: the preferred one if it is free, else
// the next free one, else (all busy) the preferred one once it is free.
func (r *Recorder) lock(preferred uint64) *stripe {
	n := uint64(len(r.stripes))
	for i := range n {
		st := &r.stripes[(preferred+i)%n]
		if st.mu.TryLock() {
			return st
		}
	}
	st := &r.stripes[preferred%n]
	st.mu.Lock()
	return st
}

// bucketID numbers the bucket of t.
func (r *Recorder) bucketID(t time.Time) int64 { return t.UnixNano() / int64(r.cfg.Bucket) }

// bucket returns st's bucket for id, cleared if it held an older one.
func (r *Recorder) bucket(st *stripe, id int64) *bucket {
	b := &st.buckets[uint64(id)%uint64(len(st.buckets))]
	if b.id != id {
		if b.decisions == nil {
			b.decisions, b.denials = topk.New(r.cfg.Capacity), topk.New(r.cfg.Capacity)
		} else {
			b.decisions.Reset()
			b.denials.Reset()
		}
		*b = bucket{id: id, decisions: b.decisions, denials: b.denials}
	}
	return b
}

// second returns st's counts of the second unix, cleared if they were of
// an older one.
func (st *stripe) second(unix int64) *second {
	s := &st.seconds[uint64(unix)%uint64(len(st.seconds))]
	if s.unix != unix {
		*s = second{unix: unix}
	}
	return s
}

// Request counts one decision request answered at now after latency: its
// n checks, each of which check describes (its key, whether it was denied,
// and whether it counts at all: a descriptor without a limit does not),
// and errors, the checks that failed (0 when the request was answered; a
// request that failed decided nothing). The Recorder keeps the keys (it
// does not copy them).
//
// The request takes one stripe: the one its first counted key hashes to
// if it is free (so that a key's counts usually sit in one sketch), else
// the next free one.
func (r *Recorder) Request(now time.Time, latency time.Duration, errors, n int, check func(i int) (key string, denied, counted bool)) {
	var preferred uint64
	first := n
	for i := range n {
		if key, _, ok := check(i); ok {
			preferred, first = maphash.String(r.seed, key), i
			break
		}
	}
	if first == n {
		preferred = rand.Uint64()
	}
	st := r.lock(preferred)
	b := r.bucket(st, r.bucketID(now))
	s := st.second(now.Unix())
	for i := first; i < n; i++ {
		key, denied, ok := check(i)
		if !ok {
			continue
		}
		h := preferred
		if i != first {
			h = maphash.String(r.seed, key)
		}
		b.decisions.AddHashed(key, h, 1)
		s.decisions++
		if denied {
			b.denials.AddHashed(key, h, 1)
			s.denials++
		}
	}
	b.latency[latencyBucket(latency)]++
	b.requests++
	b.maxLatency = max(b.maxLatency, latency)
	s.requests++
	s.errors += uint64(max(errors, 0))
	st.mu.Unlock()
}

// Snapshot is what a Recorder counted, read at one time.
type Snapshot struct {
	// At is when it was read.
	At time.Time
	// Window is the span that Decisions, Denials and Latency cover, up to
	// At.
	Window time.Duration
	// Decisions and Denials are the keys decided and denied most in the
	// window, with their bounds (see topk.Summary).
	Decisions, Denials topk.Summary
	// Latency is the requests' latency in the window.
	Latency Latency
	// Seconds are the counts of the last seconds, oldest first, the last
	// one At's (partial) second.
	Seconds []Second
}

// Second is the counts of one second.
type Second struct {
	// Unix is the second, in seconds since 1970.
	Unix int64
	// Decisions counts the checks decided, Denials those denied (shadow
	// mode apart), Errors the checks of requests that failed, Requests the
	// requests answered or failed.
	Decisions, Denials, Errors, Requests uint64
}

// Latency sums up the latency of requests: P50 and P99 are upper bounds,
// within 25% (see latencyBucket); Max is exact.
type Latency struct {
	Requests      uint64
	P50, P99, Max time.Duration
}

// Snapshot reads the counts at now: the top keys (at most top of each, all
// the sketches hold if top < 0) and the last seconds (at most
// Config.Seconds) of per-second counts.
func (r *Recorder) Snapshot(now time.Time, top, seconds int) Snapshot {
	cur := r.bucketID(now)
	oldest := cur - int64(r.cfg.Buckets) + 1
	seconds = min(max(seconds, 0), r.cfg.Seconds)
	end := now.Unix()
	snap := Snapshot{
		At:      now,
		Window:  now.Sub(time.Unix(0, oldest*int64(r.cfg.Bucket))),
		Seconds: make([]Second, seconds),
	}
	for i := range snap.Seconds {
		snap.Seconds[i].Unix = end - int64(seconds-1-i)
	}
	var decisions, denials []topk.Summary
	var latency [latencyBuckets]uint64
	for i := range r.stripes {
		st := &r.stripes[i]
		st.mu.Lock()
		for j := range st.buckets {
			b := &st.buckets[j]
			if b.id < oldest || b.id > cur || b.decisions == nil {
				continue
			}
			decisions = append(decisions, b.decisions.Summary())
			denials = append(denials, b.denials.Summary())
			for k, n := range b.latency {
				latency[k] += uint64(n)
			}
			snap.Latency.Requests += b.requests
			snap.Latency.Max = max(snap.Latency.Max, b.maxLatency)
		}
		for j := range snap.Seconds {
			out := &snap.Seconds[j]
			s := &st.seconds[uint64(out.Unix)%uint64(len(st.seconds))]
			if s.unix == out.Unix {
				out.Decisions += s.decisions
				out.Denials += s.denials
				out.Errors += s.errors
				out.Requests += s.requests
			}
		}
		st.mu.Unlock()
	}
	snap.Decisions = topk.Merge(decisions...).Truncate(top)
	snap.Denials = topk.Merge(denials...).Truncate(top)
	snap.Latency.P50 = min(quantile(&latency, snap.Latency.Requests, 0.50), snap.Latency.Max)
	snap.Latency.P99 = min(quantile(&latency, snap.Latency.Requests, 0.99), snap.Latency.Max)
	return snap
}

// Latencies are counted in log-linear buckets of microseconds: 0 to 3 µs
// one bucket each, then four buckets per power of two (4–5, 5–6, 6–7, 7–8,
// 8–10, ... µs), so that a bucket's upper bound is within 25% of any
// latency in it; the last bucket holds everything from about 2 minutes.
const latencyBuckets = 112

// latencyBucket returns the bucket of d.
func latencyBucket(d time.Duration) int {
	v := uint64(max(d, 0) / time.Microsecond)
	if v < 4 {
		return int(v)
	}
	e := bits.Len64(v) - 1 // v in [2^e, 2^(e+1))
	m := int(v>>(e-2)) & 3
	return min(4*(e-1)+m, latencyBuckets-1)
}

// latencyUpper is the upper bound of bucket i.
func latencyUpper(i int) time.Duration {
	if i < 4 {
		return time.Duration(i+1) * time.Microsecond
	}
	e, m := i/4+1, i%4
	return time.Duration(uint64(5+m)<<(e-2)) * time.Microsecond
}

// quantile returns the upper bound of the bucket that holds quantile q of
// n counts.
func quantile(counts *[latencyBuckets]uint64, n uint64, q float64) time.Duration {
	if n == 0 {
		return 0
	}
	rank := uint64(q*float64(n) + 0.999999)
	var seen uint64
	for i, c := range counts {
		if seen += c; seen >= max(rank, 1) {
			return latencyUpper(i)
		}
	}
	return latencyUpper(latencyBuckets - 1)
}
