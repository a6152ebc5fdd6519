package loadgen

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeCaller answers after a fixed time, allowing the checks whose key
// passes allow (all if nil), and failing the calls fail says.
type fakeCaller struct {
	latency time.Duration
	allow   func(key int) bool
	fail    func(call int64) error
	calls   *atomic.Int64
	keys    *sync.Map // key → times checked, if not nil
}

func (f *fakeCaller) call(ctx context.Context, keys []int) (int, error) {
	n := f.calls.Add(1)
	if f.latency > 0 {
		select {
		case <-time.After(f.latency):
		case <-ctx.Done():
			return 0, status.FromContextError(ctx.Err()).Err()
		}
	}
	if f.fail != nil {
		if err := f.fail(n); err != nil {
			return 0, err
		}
	}
	allowed := 0
	for _, k := range keys {
		if f.keys != nil {
			v, _ := f.keys.LoadOrStore(k, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
		if f.allow == nil || f.allow(k) {
			allowed++
		}
	}
	return allowed, nil
}

// testConfig is a small run: 4 workers, 1s after 100ms of warmup.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Concurrency = 4
	cfg.Connections = 1
	cfg.Duration = time.Second
	cfg.Warmup = 100 * time.Millisecond
	return cfg
}

// runFake runs cfg with a fakeCaller per worker, sharing f's counters.
func runFake(t *testing.T, ctx context.Context, cfg Config, f fakeCaller) (*Report, error) {
	t.Helper()
	if f.calls == nil {
		f.calls = new(atomic.Int64)
	}
	return run(ctx, cfg, func(int) caller { c := f; return &c })
}

// TestClosedLoop: each worker sends a call as soon as the last one is
// answered; latency is the time the server took; the warmup is not
// recorded.
func TestClosedLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Batch = 3
		rep, err := runFake(t, t.Context(), cfg, fakeCaller{latency: 10 * time.Millisecond, allow: func(k int) bool { return k%2 == 0 }})
		if err != nil {
			t.Fatal(err)
		}
		// 4 workers × 1s / 10ms; the warmup's 4 × 10 calls are not counted.
		if rep.Calls != 400 || rep.Decisions != 1200 || rep.Errors != 0 || rep.ElapsedS != 1 {
			t.Errorf("closed loop, 4 workers, 10ms calls, 1s: %d calls, %d decisions, %d errors in %gs; want 400, 1200, 0 in 1s",
				rep.Calls, rep.Decisions, rep.Errors, rep.ElapsedS)
		}
		if rep.Allowed+rep.Denied != rep.Decisions || rep.Allowed == 0 || rep.Denied == 0 {
			t.Errorf("allowed %d + denied %d; want both, summing to the %d decisions", rep.Allowed, rep.Denied, rep.Decisions)
		}
		if rep.P50us != 10000 || rep.P999us != 10000 || rep.MaxUs != 10000 || rep.MeanUs != 10000 {
			t.Errorf("latency p50 %gµs p99.9 %gµs max %gµs mean %gµs; want 10000µs each", rep.P50us, rep.P999us, rep.MaxUs, rep.MeanUs)
		}
		if rep.CallsPerS != 400 || rep.DecisionsPerS != 1200 || rep.Unsent != 0 || rep.Interrupted {
			t.Errorf("report %+v; want 400 calls/s, 1200 decisions/s, nothing unsent, not interrupted", rep)
		}
		if s := rep.Settings; s.Mode != "closed" || s.Batch != 3 || s.Concurrency != 4 || s.DurationS != 1 || s.WarmupS != 0.1 {
			t.Errorf("settings %+v; want closed loop, batch 3, 4 workers, 1s after 0.1s", s)
		}
	})
}

// TestOpenLoopRate: an open loop sends rate × duration calls, whatever the
// number of workers.
func TestOpenLoopRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Rate = 250
		cfg.Warmup = 500 * time.Millisecond
		var calls atomic.Int64
		rep, err := runFake(t, t.Context(), cfg, fakeCaller{latency: time.Millisecond, calls: &calls})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Calls != 250 || rep.Unsent != 0 || rep.CallsPerS != 250 {
			t.Errorf("open loop at 250/s for 1s: %d calls (%g/s), %d unsent; want 250, none unsent", rep.Calls, rep.CallsPerS, rep.Unsent)
		}
		if got := calls.Load(); got != 250+125 {
			t.Errorf("open loop at 250/s for 0.5s + 1s: %d calls sent; want 375", got)
		}
		if rep.P50us != 1000 || rep.MaxUs != 1000 {
			t.Errorf("open loop with 1ms calls and free workers: p50 %gµs, max %gµs; want 1000µs", rep.P50us, rep.MaxUs)
		}
		if rep.Settings.Mode != "open" || rep.Settings.Rate != 250 {
			t.Errorf("settings %+v; want open loop at 250/s", rep.Settings)
		}
	})
}

// TestOpenLoopLateWake: a worker that waits for a call's time and wakes
// late (Go's timers fire up to a millisecond late in an idle process)
// does not count its own delay in the call's latency; the report gives it
// apart. A call already overdue when a worker takes it still counts its
// whole wait (TestOpenLoopNoCoordinatedOmission).
func TestOpenLoopLateWake(t *testing.T) {
	wokeLate = func() { time.Sleep(3 * time.Millisecond) }
	defer func() { wokeLate = nil }()
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Rate = 100 // a call every 10ms, 4 free workers
		cfg.Warmup = 0
		rep, err := runFake(t, t.Context(), cfg, fakeCaller{latency: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Calls != 100 || rep.Unsent != 0 {
			t.Errorf("open loop at 100/s for 1s: %d calls, %d unsent; want 100, none unsent", rep.Calls, rep.Unsent)
		}
		if rep.P50us != 1000 || rep.MaxUs != 1000 {
			t.Errorf("1ms calls sent 3ms after their time by workers that woke late: p50 %gµs, max %gµs; want 1000µs", rep.P50us, rep.MaxUs)
		}
		// Call 0 is due at once: its worker does not wait.
		if rep.WakeLateMeanUs != 3000 || rep.WakeLateMaxUs != 3000 {
			t.Errorf("wake_late_mean_us %g, wake_late_max_us %g; want 3000 and 3000", rep.WakeLateMeanUs, rep.WakeLateMaxUs)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		rep, err := runFake(t, t.Context(), cfg, fakeCaller{latency: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if rep.WakeLateMeanUs != 0 || rep.WakeLateMaxUs != 0 {
			t.Errorf("closed loop: wake_late_mean_us %g, wake_late_max_us %g; want 0", rep.WakeLateMeanUs, rep.WakeLateMaxUs)
		}
	})
}

// TestOpenLoopNoCoordinatedOmission: when the server is slower than the
// schedule, an open loop measures latency from the scheduled times, so the
// queueing shows; the calls it could not send are counted. A closed loop
// on the same server sees only the service time.
func TestOpenLoopNoCoordinatedOmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Concurrency = 1
		cfg.Warmup = 0
		cfg.Rate = 100 // one call every 10ms, for a server that takes 50ms
		rep, err := runFake(t, t.Context(), cfg, fakeCaller{latency: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		// Call k is due at 10k ms, sent at 50k ms, answered at 50(k+1) ms:
		// latency 50 + 40k ms. Calls 0..19 are sent before 1s; 20..99
		// were due but never sent.
		if rep.Calls != 20 || rep.Unsent != 80 {
			t.Errorf("open loop at 100/s on a 20/s server: %d calls, %d unsent; want 20 and 80", rep.Calls, rep.Unsent)
		}
		if rep.MaxUs != 810_000 || rep.P50us < 400_000 || rep.P99us < 800_000 {
			t.Errorf("open loop latency p50 %gµs p99 %gµs max %gµs; want max 810ms (50 + 40×19), p50 ≥ 400ms", rep.P50us, rep.P99us, rep.MaxUs)
		}

		cfg.Rate = 0
		rep, err = runFake(t, t.Context(), cfg, fakeCaller{latency: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Calls != 20 || rep.MaxUs != 50_000 {
			t.Errorf("closed loop on the same server: %d calls, max %gµs; want 20 calls of 50ms", rep.Calls, rep.MaxUs)
		}
	})
}

// TestErrorsCounted: failed calls count as calls and errors, by code,
// with the first message; they decide nothing.
func TestErrorsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Concurrency = 1
		cfg.Batch = 2
		cfg.Warmup = 0
		fail := func(n int64) error {
			switch {
			case n%5 == 0:
				return status.Error(codes.Unavailable, "owner unreachable")
			case n%7 == 0:
				return status.Error(codes.ResourceExhausted, "queue full")
			}
			return nil
		}
		rep, err := runFake(t, t.Context(), cfg, fakeCaller{latency: 10 * time.Millisecond, fail: fail})
		if err != nil {
			t.Fatal(err)
		}
		// Calls 1..100: 20 multiples of 5, 14 of 7, 2 of 35.
		if rep.Calls != 100 || rep.Errors != 32 || rep.Decisions != 2*68 || rep.Allowed != 2*68 {
			t.Errorf("100 calls, every 5th and 7th failing: %d calls, %d errors, %d decisions, %d allowed; want 100, 32, 136, 136",
				rep.Calls, rep.Errors, rep.Decisions, rep.Allowed)
		}
		if rep.ErrorCodes["Unavailable"] != 20 || rep.ErrorCodes["ResourceExhausted"] != 12 || len(rep.ErrorCodes) != 2 {
			t.Errorf("error codes %v; want Unavailable 20, ResourceExhausted 12", rep.ErrorCodes)
		}
		if rep.FirstError != "Unavailable: owner unreachable" {
			t.Errorf("first error %q; want the 5th call's", rep.FirstError)
		}
		if got := rep.ErrorCodeNames(); len(got) != 2 || got[0] != "Unavailable" {
			t.Errorf("ErrorCodeNames() = %v; want the most frequent first", got)
		}
	})
}

// TestFatalErrorStops: a call the server refuses as bad input stops the
// run with its error at once.
func TestFatalErrorStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		start := time.Now()
		_, err := runFake(t, t.Context(), cfg, fakeCaller{latency: time.Millisecond, fail: func(n int64) error {
			if n == 10 {
				return status.Error(codes.InvalidArgument, "window out of range")
			}
			return nil
		}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "window out of range") {
			t.Errorf("run with a refused check = %v; want the InvalidArgument error", err)
		}
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Errorf("run with a refused check took %v; want it to stop at once", d)
		}
	})
}

// TestInterrupted: a cancelled context ends the run early with what was
// recorded; the calls it cuts are unfinished, not errors.
func TestInterrupted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Duration = time.Hour
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(600*time.Millisecond+5*time.Millisecond, cancel)
		rep, err := runFake(t, ctx, cfg, fakeCaller{latency: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Interrupted || rep.ElapsedS != 0.505 || rep.Errors != 0 || rep.Unfinished != 4 || rep.Calls != 4*50 {
			t.Errorf("run cancelled after 605ms: interrupted %v, %gs, %d calls, %d errors, %d unfinished; want interrupted, 0.505s, 200 calls, no errors, 4 unfinished",
				rep.Interrupted, rep.ElapsedS, rep.Calls, rep.Errors, rep.Unfinished)
		}
	})
}

// TestProgress: the progress comes every interval with the rates of the
// last interval and the p99 so far.
func TestProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Warmup = time.Second
		cfg.Duration = 2 * time.Second
		cfg.Batch = 2
		cfg.ProgressInterval = 701 * time.Millisecond // never at a call's end (every 10ms), nor the warmup's
		var got []Progress
		cfg.Progress = func(p Progress) { got = append(got, p) }
		if _, err := runFake(t, t.Context(), cfg, fakeCaller{latency: 10 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if len(got) != 4 {
			t.Fatalf("progress of a 3s run every 701ms: %d reports %+v; want 4", len(got), got)
		}
		near := func(got, want float64) bool { return got >= want*0.98 && got <= want*1.02 }
		for i, p := range got {
			at := time.Duration(i+1) * 701 * time.Millisecond
			recorded := float64(max(at-time.Second, 0)/(10*time.Millisecond)) * 4
			if p.Elapsed != at || p.Warmup != (i <= 1) || !near(p.CallsPerS, 400) || !near(p.DecisionsPerS, 800) ||
				!near(float64(p.Calls), recorded) || p.Errors != 0 {
				t.Errorf("progress %d = %+v; want at %v, warmup %v, 400 calls/s, 800 decisions/s, %.0f calls recorded", i, p, at, i <= 1, recorded)
			}
			if want := 10 * time.Millisecond * time.Duration(min(p.Calls, 1)); p.P99 != want {
				t.Errorf("progress %d: p99 %v after %d calls; want %v", i, p.P99, p.Calls, want)
			}
		}
	})
}

// TestKeysReachTheCaller: every key the caller sees is one of the keys
// asked for.
func TestKeysReachTheCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.Keys = 5
		cfg.Batch = 10
		var keys sync.Map
		if _, err := runFake(t, t.Context(), cfg, fakeCaller{latency: time.Millisecond, keys: &keys}); err != nil {
			t.Fatal(err)
		}
		n := 0
		keys.Range(func(k, _ any) bool {
			if k.(int) < 0 || k.(int) >= 5 {
				t.Errorf("the caller saw key %d; want 0 to 4", k)
			}
			n++
			return true
		})
		if n != 5 {
			t.Errorf("the caller saw %d distinct keys; want all 5", n)
		}
	})
}

// TestValidate: a config that cannot run names its field.
func TestValidate(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v; want nil", err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"API", func(c *Config) { c.API = "grpc" }},
		{"Concurrency", func(c *Config) { c.Concurrency = 0 }},
		{"Connections", func(c *Config) { c.Connections = 0 }},
		{"Connections", func(c *Config) { c.Concurrency, c.Connections = 2, 3 }},
		{"Duration", func(c *Config) { c.Duration = 0 }},
		{"Warmup", func(c *Config) { c.Warmup = -time.Second }},
		{"Rate", func(c *Config) { c.Rate = -1 }},
		{"Rate", func(c *Config) { c.Rate = 0.01 }},
		{"Keys", func(c *Config) { c.Keys = 0 }},
		{"Dist", func(c *Config) { c.Dist = "pareto" }},
		{"ZipfS", func(c *Config) { c.Dist, c.ZipfS = Zipf, 1 }},
		{"Batch", func(c *Config) { c.Batch = 0 }},
		{"Limit", func(c *Config) { c.Limit = 0 }},
		{"Limit", func(c *Config) { c.API, c.Limit = Envoy, 1<<32 }},
		{"Window", func(c *Config) { c.Window = 0 }},
		{"Window", func(c *Config) { c.API, c.Window = Envoy, 1500*time.Millisecond }},
		{"Algorithm", func(c *Config) { c.Algorithm = 42 }},
		{"Algorithm", func(c *Config) { c.API, c.Algorithm = Envoy, 3 }},
		{"Timeout", func(c *Config) { c.Timeout = 0 }},
		{"ProgressInterval", func(c *Config) { c.Progress, c.ProgressInterval = func(Progress) {}, 0 }},
	} {
		cfg := DefaultConfig()
		tc.edit(&cfg)
		var ce *ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("Validate(%+v) = %v; want a ConfigError on %s", cfg, err, tc.field)
		}
	}
}
