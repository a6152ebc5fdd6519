package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/client"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Report is the outcome of a run. Its JSON field names are stable: scripts
// may rely on them. Counts cover the calls recorded: those started (closed
// loop) or due (open loop) after the warmup and before the end. Latencies
// are per call, from the moment it was sent (closed loop) or due (open
// loop) to its answer, failed calls included, in microseconds.
type Report struct {
	// Settings are the settings of the run.
	Settings Settings `json:"settings"`
	// ElapsedS is the time calls were recorded, in seconds: Duration, or
	// less if the run was interrupted.
	ElapsedS float64 `json:"elapsed_s"`
	// Calls is the number of calls recorded, failed ones included.
	Calls int64 `json:"calls"`
	// Decisions is the number of checks decided: Batch per call that did
	// not fail. Allowed + Denied = Decisions.
	Decisions int64 `json:"decisions"`
	// Allowed is the number of checks allowed.
	Allowed int64 `json:"allowed"`
	// Denied is the number of checks denied (OVER_LIMIT for Envoy).
	Denied int64 `json:"denied"`
	// Errors is the number of calls that failed.
	Errors int64 `json:"errors"`
	// ErrorCodes counts the failed calls by gRPC code name ("Unavailable",
	// "DeadlineExceeded", ...); empty without errors.
	ErrorCodes map[string]int64 `json:"error_codes"`
	// FirstError is the message of the earliest failed call, "" if none.
	FirstError string `json:"first_error"`
	// CallsPerS is Calls / ElapsedS.
	CallsPerS float64 `json:"calls_per_s"`
	// DecisionsPerS is Decisions / ElapsedS.
	DecisionsPerS float64 `json:"decisions_per_s"`
	// P50us, P90us, P99us and P999us are latency percentiles (50, 90, 99,
	// 99.9) in microseconds, within 0.1%; 0 without calls.
	P50us  float64 `json:"p50_us"`
	P90us  float64 `json:"p90_us"`
	P99us  float64 `json:"p99_us"`
	P999us float64 `json:"p999_us"`
	// MaxUs is the exact longest latency, in microseconds.
	MaxUs float64 `json:"max_us"`
	// MeanUs is the exact mean latency, in microseconds.
	MeanUs float64 `json:"mean_us"`
	// Unsent is, in an open loop, the number of calls due before the end
	// that no worker was free to send by then: the generator fell behind
	// (too few workers for the rate, or the server too slow). Always 0 in
	// a closed loop.
	Unsent int64 `json:"unsent"`
	// Unfinished is the number of recorded calls cut by an interruption;
	// they are not counted in Calls.
	Unfinished int64 `json:"unfinished"`
	// Interrupted is true when the run was cancelled (SIGINT) before the
	// end of Duration.
	Interrupted bool `json:"interrupted"`
	// WakeLateMeanUs and WakeLateMaxUs are, in an open loop, how late the
	// workers that were waiting for a call's scheduled time woke to send
	// it (mean and exact maximum, in microseconds): the generator's own
	// delay (Go's timers fire up to a millisecond late in an idle
	// process), which the latencies of those calls leave out. 0 in a
	// closed loop.
	WakeLateMeanUs float64 `json:"wake_late_mean_us"`
	WakeLateMaxUs  float64 `json:"wake_late_max_us"`
}

// Settings are the settings of a run, as the report shows them: those of
// Config, in the units of their JSON names.
type Settings struct {
	// Addr is Config.Addr.
	Addr string `json:"addr"`
	// API is "native" or "envoy".
	API API `json:"api"`
	// Mode is "closed" (Rate 0) or "open".
	Mode string `json:"mode"`
	// Rate is the open loop's target in calls per second, 0 in a closed
	// loop.
	Rate float64 `json:"rate"`
	// Concurrency is the number of workers.
	Concurrency int `json:"concurrency"`
	// Connections is the number of gRPC connections.
	Connections int `json:"connections"`
	// DurationS is the recorded time asked for, in seconds.
	DurationS float64 `json:"duration_s"`
	// WarmupS is the warmup, in seconds.
	WarmupS float64 `json:"warmup_s"`
	// Keys is the number of distinct keys: 1 for the hot distribution.
	Keys int `json:"keys"`
	// Dist is "uniform", "zipf" or "hot".
	Dist Dist `json:"dist"`
	// ZipfS is the Zipf exponent; 0 unless Dist is "zipf".
	ZipfS float64 `json:"zipf_s"`
	// KeyPrefix starts every key.
	KeyPrefix string `json:"key_prefix"`
	// Batch is the number of checks per call.
	Batch int `json:"batch"`
	// Limit is the limit of every check, in hits per window.
	Limit int64 `json:"limit"`
	// WindowMs is the window of every check, in milliseconds.
	WindowMs float64 `json:"window_ms"`
	// Algorithm is the algorithm sent ("sliding_log", ...), or "" to let
	// the server choose.
	Algorithm string `json:"algorithm"`
	// TimeoutMs is the deadline of each call, in milliseconds.
	TimeoutMs float64 `json:"timeout_ms"`
	// Seed seeds the key pickers.
	Seed uint64 `json:"seed"`
}

// Progress is the state of a run as the live progress shows it.
type Progress struct {
	// Elapsed is the time since the run started, warmup included.
	Elapsed time.Duration
	// Warmup is true when the interval since the last progress included
	// some of the warmup, whose calls are counted in the rates but not
	// recorded.
	Warmup bool
	// CallsPerS and DecisionsPerS are the rates of answers since the last
	// progress, warmup included.
	CallsPerS, DecisionsPerS float64
	// P99 is the 99th percentile of the latency of the calls recorded so
	// far; 0 before any.
	P99 time.Duration
	// Calls and Errors count the calls recorded so far, and those that
	// failed.
	Calls, Errors int64
}

// fatalCodes are the errors that would fail every call of the run the same
// way: the run stops at the first of them and Run returns it.
var fatalCodes = map[codes.Code]bool{
	codes.InvalidArgument:  true,
	codes.Unimplemented:    true,
	codes.Unauthenticated:  true,
	codes.PermissionDenied: true,
}

// Run drives the server behind conns (worker i uses conns[i mod
// len(conns)]) as cfg says and returns the report. It returns early, with
// what was recorded until then and Interrupted set, when ctx ends. It
// returns an error, and no report, if cfg is not valid, or if a call fails
// in a way every call would (a check the server refuses as
// INVALID_ARGUMENT, an API it does not serve, a missing token).
func Run(ctx context.Context, cfg Config, conns []grpc.ClientConnInterface) (*Report, error) {
	if len(conns) == 0 {
		return nil, errors.New("loadgen: no connections")
	}
	return run(ctx, cfg, func(worker int) caller {
		return newCaller(&cfg, conns[worker%len(conns)])
	})
}

// RunClient is Run through c, which every worker shares (cfg.API is
// Client; cfg.Connections is not used: c has its own).
func RunClient(ctx context.Context, cfg Config, c *client.Client) (*Report, error) {
	return run(ctx, cfg, func(int) caller { return newClientCaller(&cfg, c) })
}

// run is Run with the callers of newCaller, one per worker.
func run(ctx context.Context, cfg Config, newCaller func(worker int) caller) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)

	rec := newRecorder(cfg.Concurrency)
	start := time.Now()
	r := &runner{
		cfg:          &cfg,
		ctx:          runCtx,
		stop:         stopRun,
		rec:          rec,
		measureStart: start.Add(cfg.Warmup),
		end:          start.Add(cfg.Warmup + cfg.Duration),
	}
	if cfg.open() {
		r.sched = newSchedule(start, cfg.Rate)
	}
	var workers sync.WaitGroup
	for w := range cfg.Concurrency {
		workers.Go(func() { r.work(w, newCaller(w)) })
	}
	progressDone := make(chan struct{})
	var progress sync.WaitGroup
	if cfg.Progress != nil {
		progress.Go(func() { r.progress(start, progressDone) })
	}

	// The run ends at r.end, or earlier if ctx ends or a worker stops it.
	endTimer := time.NewTimer(time.Until(r.end))
	stoppedAt := r.end
	select {
	case <-endTimer.C:
	case <-runCtx.Done():
		stoppedAt = time.Now()
	}
	endTimer.Stop()
	workers.Wait()
	close(progressDone)
	progress.Wait()

	var fe *fatalError
	if errors.As(context.Cause(runCtx), &fe) {
		return nil, fe.err
	}
	return r.report(stoppedAt, ctx.Err() != nil && stoppedAt.Before(r.end)), nil
}

// fatalError is the cause of a run stopped by a call that failed in a way
// every call would.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// wokeLate, if not nil, runs each time a worker's timer has fired for a
// scheduled call, before the worker reads the clock: tests set it to stand
// for a timer that fires late.
var wokeLate func()

// runner is the state of one run the workers share.
type runner struct {
	cfg          *Config
	ctx          context.Context
	stop         context.CancelCauseFunc
	rec          *recorder
	sched        *schedule // nil in a closed loop
	measureStart time.Time // the end of the warmup
	end          time.Time // no call starts at or after it
}

// work runs worker w until the end of the run.
func (r *runner) work(w int, c caller) {
	cfg := r.cfg
	pick := newPicker(cfg.Dist, cfg.Keys, cfg.ZipfS, cfg.Seed, uint64(w))
	keys := make([]int, cfg.Batch)
	st := r.rec.stripe(w)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for r.ctx.Err() == nil {
		// at is when the call starts or is due; woke, in an open loop, when
		// a worker that waited for at woke (at or a little later).
		var at, woke time.Time
		if r.sched == nil {
			at = time.Now()
			if !at.Before(r.end) {
				return
			}
		} else {
			at = r.sched.claim()
			if !at.Before(r.end) {
				return
			}
			if wait := time.Until(at); wait > 0 {
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				select {
				case <-timer.C:
				case <-r.ctx.Done():
					return
				}
				if wokeLate != nil {
					wokeLate()
				}
				woke = time.Now()
			}
			if !time.Now().Before(r.end) {
				// Due in time, but the workers were too busy to send it
				// before the end.
				if !at.Before(r.measureStart) {
					st.addUnsent()
				}
				continue
			}
		}
		for i := range keys {
			keys[i] = pick()
		}
		callCtx, cancel := context.WithTimeout(r.ctx, cfg.Timeout)
		allowed, err := c.call(callCtx, keys)
		cancel()
		done := time.Now()
		measured := !at.Before(r.measureStart)
		if err != nil && r.ctx.Err() != nil {
			// Cut by the interruption of the run, not failed.
			if measured {
				st.addUnfinished()
			}
			return
		}
		o := outcome{measured: measured, at: at, latency: done.Sub(at), allowed: allowed, err: err}
		if !woke.IsZero() {
			// The worker was free and waiting: how late its timer fired
			// is the generator's delay, not the server's.
			o.late = max(woke.Sub(at), 0)
			o.latency -= o.late
			o.waited = true
		}
		if err == nil {
			o.decisions = len(keys)
		}
		st.record(o)
		if err != nil && fatalCodes[status.Code(err)] {
			r.stop(&fatalError{err})
			return
		}
	}
}

// progress calls cfg.Progress every interval until done is closed.
func (r *runner) progress(start time.Time, done <-chan struct{}) {
	ticker := time.NewTicker(r.cfg.ProgressInterval)
	defer ticker.Stop()
	var t totals
	var lastCalls, lastDecisions int64
	last := start
	for {
		select {
		case <-done:
			return
		case now := <-ticker.C:
			r.rec.sum(&t, true)
			secs := now.Sub(last).Seconds()
			r.cfg.Progress(Progress{
				Elapsed:       now.Sub(start),
				Warmup:        last.Before(r.measureStart),
				CallsPerS:     float64(t.answered-lastCalls) / secs,
				DecisionsPerS: float64(t.answeredDecisions-lastDecisions) / secs,
				P99:           t.quantile(0.99),
				Calls:         t.calls,
				Errors:        t.errors,
			})
			lastCalls, lastDecisions, last = t.answered, t.answeredDecisions, now
		}
	}
}

// report sums up the run, which stopped recording at stoppedAt.
func (r *runner) report(stoppedAt time.Time, interrupted bool) *Report {
	cfg := r.cfg
	var t totals
	r.rec.sum(&t, true)
	elapsed := max(stoppedAt.Sub(r.measureStart), 0)
	rep := &Report{
		Settings:    settingsOf(cfg),
		ElapsedS:    elapsed.Seconds(),
		Calls:       t.calls,
		Decisions:   t.decisions,
		Allowed:     t.allowed,
		Denied:      t.decisions - t.allowed,
		Errors:      t.errors,
		ErrorCodes:  make(map[string]int64, len(t.codes)),
		P50us:       micros(t.quantile(0.50)),
		P90us:       micros(t.quantile(0.90)),
		P99us:       micros(t.quantile(0.99)),
		P999us:      micros(t.quantile(0.999)),
		MaxUs:       micros(time.Duration(t.maxNs)),
		Unsent:      t.unsent,
		Unfinished:  t.unfinished,
		Interrupted: interrupted,
	}
	for c, n := range t.codes {
		rep.ErrorCodes[c.String()] = n
	}
	if t.firstErr != nil {
		rep.FirstError = t.firstErr.Error()
		if st, ok := status.FromError(t.firstErr); ok {
			rep.FirstError = fmt.Sprintf("%s: %s", st.Code(), st.Message())
		}
	}
	if t.calls > 0 {
		rep.MeanUs = math.Round(t.sumNs/float64(t.calls)/100) / 10
	}
	if t.wakes > 0 {
		rep.WakeLateMeanUs = math.Round(t.lateNs/float64(t.wakes)/100) / 10
		rep.WakeLateMaxUs = micros(time.Duration(t.lateMaxNs))
	}
	if secs := elapsed.Seconds(); secs > 0 {
		rep.CallsPerS = math.Round(float64(t.calls)/secs*10) / 10
		rep.DecisionsPerS = math.Round(float64(t.decisions)/secs*10) / 10
	}
	return rep
}

// micros returns d in microseconds, to a tenth.
func micros(d time.Duration) float64 {
	return math.Round(float64(d)/100) / 10
}

func settingsOf(cfg *Config) Settings {
	s := Settings{
		Addr:        cfg.Addr,
		API:         cfg.API,
		Mode:        "closed",
		Rate:        cfg.Rate,
		Concurrency: cfg.Concurrency,
		Connections: cfg.Connections,
		DurationS:   cfg.Duration.Seconds(),
		WarmupS:     cfg.Warmup.Seconds(),
		Keys:        cfg.Keys,
		Dist:        cfg.Dist,
		KeyPrefix:   cfg.KeyPrefix,
		Batch:       cfg.Batch,
		Limit:       cfg.Limit,
		WindowMs:    float64(cfg.Window) / float64(time.Millisecond),
		TimeoutMs:   float64(cfg.Timeout) / float64(time.Millisecond),
		Seed:        cfg.Seed,
	}
	if cfg.open() {
		s.Mode = "open"
	}
	switch cfg.Dist {
	case Hot:
		s.Keys = 1
	case Zipf:
		s.ZipfS = cfg.ZipfS
	}
	if cfg.Algorithm != sluicepb.Algorithm_ALGORITHM_UNSPECIFIED {
		s.Algorithm = AlgorithmName(cfg.Algorithm)
	}
	return s
}

// AlgorithmName is the name of a, as users type it: "sliding_log".
func AlgorithmName(a sluicepb.Algorithm) string {
	return strings.ToLower(strings.TrimPrefix(a.String(), "ALGORITHM_"))
}

// ErrorCodeNames returns the codes of r.ErrorCodes, most frequent first.
func (r *Report) ErrorCodeNames() []string {
	names := make([]string, 0, len(r.ErrorCodes))
	for n := range r.ErrorCodes {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(r.ErrorCodes[b], r.ErrorCodes[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return names
}
