package loadgen

import (
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Histogram bounds, in nanoseconds: 3 significant digits (a value is
// recorded within 0.1%) from 1ns to an hour. A longer latency is recorded
// as an hour; the exact maximum is kept apart.
const (
	histLowest  = 1
	histHighest = int64(time.Hour)
	histDigits  = 3
)

func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(histLowest, histHighest, histDigits)
}

// maxStripes bounds the histograms of a run (each is about 270 KiB).
const maxStripes = 16

// recorder gathers the outcomes of calls. Workers record into stripes (a
// worker always into the same one), each behind its own mutex, so that they
// rarely wait for each other; the progress and the report merge them.
type recorder struct {
	stripes []stripe
}

// stripe is the share of a recorder some workers write.
type stripe struct {
	mu sync.Mutex
	// Of the calls recorded (those that started after the warmup):
	hist       *hdrhistogram.Histogram
	sumNs      float64
	maxNs      int64
	calls      int64
	decisions  int64
	allowed    int64
	errors     int64
	codes      map[codes.Code]int64
	firstErr   error
	firstErrAt time.Time
	unsent     int64
	unfinished int64
	// Of the calls whose worker waited for their scheduled time: how late
	// it woke.
	wakes     int64
	lateNs    float64
	lateMaxNs int64
	// Of every call answered, warmup included: for the live rates.
	answered          int64
	answeredDecisions int64

	_ [64]byte // keeps stripes off each other's cache lines
}

func newRecorder(workers int) *recorder {
	r := &recorder{stripes: make([]stripe, min(workers, maxStripes))}
	for i := range r.stripes {
		r.stripes[i].hist = newHistogram()
		r.stripes[i].codes = make(map[codes.Code]int64)
	}
	return r
}

// stripe returns the stripe of worker.
func (r *recorder) stripe(worker int) *stripe { return &r.stripes[worker%len(r.stripes)] }

// outcome is what one call did.
type outcome struct {
	measured  bool          // started after the warmup
	at        time.Time     // when it started (open loop: was due)
	latency   time.Duration // from at (or at + late) to the answer
	waited    bool          // open loop: the worker waited for at
	late      time.Duration // then, how late it woke
	decisions int           // checks decided, 0 on error
	allowed   int
	err       error
}

// record adds the outcome of one call.
func (s *stripe) record(o outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answered++
	s.answeredDecisions += int64(o.decisions)
	if !o.measured {
		return
	}
	ns := max(int64(o.latency), 0)
	_ = s.hist.RecordValue(min(ns, histHighest)) // clamped to the range: cannot fail
	s.sumNs += float64(ns)
	s.maxNs = max(s.maxNs, ns)
	s.calls++
	if o.waited {
		s.wakes++
		s.lateNs += float64(o.late)
		s.lateMaxNs = max(s.lateMaxNs, int64(o.late))
	}
	if o.err != nil {
		s.errors++
		s.codes[status.Code(o.err)]++
		if s.firstErr == nil || o.at.Before(s.firstErrAt) {
			s.firstErr, s.firstErrAt = o.err, o.at
		}
		return
	}
	s.decisions += int64(o.decisions)
	s.allowed += int64(o.allowed)
}

// addUnsent counts a measured open-loop call that was due before the end
// but never sent.
func (s *stripe) addUnsent() {
	s.mu.Lock()
	s.unsent++
	s.mu.Unlock()
}

// addUnfinished counts a measured call cut by the cancellation of the run.
func (s *stripe) addUnfinished() {
	s.mu.Lock()
	s.unfinished++
	s.mu.Unlock()
}

// totals is the sum of the stripes.
type totals struct {
	hist                        *hdrhistogram.Histogram
	sumNs                       float64
	maxNs                       int64
	calls, decisions, allowed   int64
	errors, unsent, unfinished  int64
	wakes, lateMaxNs            int64
	lateNs                      float64
	codes                       map[codes.Code]int64
	firstErr                    error
	firstErrAt                  time.Time
	answered, answeredDecisions int64
}

// sum merges the stripes into t, which it resets first (its histogram is
// reused). The histograms are merged only if withHist.
func (r *recorder) sum(t *totals, withHist bool) {
	if t.hist == nil {
		t.hist = newHistogram()
	}
	hist := t.hist
	hist.Reset()
	*t = totals{hist: hist, codes: make(map[codes.Code]int64)}
	for i := range r.stripes {
		s := &r.stripes[i]
		s.mu.Lock()
		if withHist {
			t.hist.Merge(s.hist)
		}
		t.sumNs += s.sumNs
		t.maxNs = max(t.maxNs, s.maxNs)
		t.calls += s.calls
		t.decisions += s.decisions
		t.allowed += s.allowed
		t.errors += s.errors
		t.unsent += s.unsent
		t.unfinished += s.unfinished
		t.wakes += s.wakes
		t.lateNs += s.lateNs
		t.lateMaxNs = max(t.lateMaxNs, s.lateMaxNs)
		for c, n := range s.codes {
			t.codes[c] += n
		}
		if s.firstErr != nil && (t.firstErr == nil || s.firstErrAt.Before(t.firstErrAt)) {
			t.firstErr, t.firstErrAt = s.firstErr, s.firstErrAt
		}
		t.answered += s.answered
		t.answeredDecisions += s.answeredDecisions
		s.mu.Unlock()
	}
}

// quantile returns the latency below which fraction q of the calls fell,
// never above the exact maximum; 0 without calls.
func (t *totals) quantile(q float64) time.Duration {
	if t.hist.TotalCount() == 0 {
		return 0
	}
	return time.Duration(min(t.hist.ValueAtQuantile(q*100), t.maxNs))
}
