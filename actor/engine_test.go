package actor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/persist"
	"github.com/sluice-io/sluice/scripts/testkit"
	"github.com/sluice-io/sluice/shard"
)

func TestMain(m *testing.M) {
	if dir := crashChildDir(); dir != "" {
		runCrashChild(dir)
		return
	}
	goleak.VerifyTestMain(m)
}

// epoch is where fake clocks start: a little before a minute boundary, so
// that tests cross clock-aligned boundaries.
var epoch = time.Date(2026, 11, 30, 12, 0, 59, 500_000_000, time.UTC)

// countObserver counts keys in memory, evictions, expiries, damaged
// records and the batches the actors decided.
type countObserver struct {
	keys, evicted, expired, damaged, batches atomic.Int64
}

func (o *countObserver) Batch(int, int, int) { o.batches.Add(1) }
func (o *countObserver) Keys(d int)          { o.keys.Add(int64(d)) }
func (o *countObserver) Evicted(n int)       { o.evicted.Add(int64(n)) }
func (o *countObserver) Damaged()            { o.damaged.Add(1) }
func (o *countObserver) Expired(n int)       { o.expired.Add(int64(n)) }

// harness is one engine on a real data file with a fake clock.
type harness struct {
	t     testing.TB
	dir   string
	mode  string // "memory" or a persist mode
	cfg   Config
	clk   *clock.Fake
	obs   *countObserver
	store *persist.Store
	eng   *Engine
	// fault, if set, is the store's persist.Options.WriteFault.
	fault func() error
}

// newHarness starts an engine in t.TempDir(). mode is "memory", "commit",
// "fsync" or "async"; edit may change the config.
func newHarness(t testing.TB, mode string, edit func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, dir: t.TempDir(), mode: mode, clk: clock.NewFake(epoch)}
	h.cfg = Config{Actors: 4, Clock: h.clk}
	if edit != nil {
		edit(&h.cfg)
	}
	h.start()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) start() {
	h.t.Helper()
	h.obs = &countObserver{}
	h.cfg.Observer = h.obs
	h.cfg.Store = nil
	if h.mode != "memory" {
		m, err := persist.ParseMode(h.mode)
		if err != nil {
			h.t.Fatal(err)
		}
		h.store, err = persist.Open(persist.Options{Path: filepath.Join(h.dir, "sluice.db"), Mode: m, WriteFault: h.fault})
		if err != nil {
			h.t.Fatal(err)
		}
		h.cfg.Store = h.store
	}
	var err error
	if h.eng, err = New(h.cfg); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) stop() {
	if h.eng == nil {
		return
	}
	if err := h.eng.Close(); err != nil {
		h.t.Errorf("Close: %v", err)
	}
	if h.store != nil {
		if err := h.store.Close(); err != nil {
			h.t.Errorf("store Close: %v", err)
		}
	}
	h.eng, h.store = nil, nil
}

func (h *harness) restart() {
	h.t.Helper()
	h.stop()
	h.start()
}

func (h *harness) check(c Check) Decision {
	h.t.Helper()
	var d [1]Decision
	if err := h.eng.Check(context.Background(), []Check{c}, d[:]); err != nil {
		h.t.Fatalf("Check(%+v): %v", c, err)
	}
	return d[0]
}

// hit records cost hits on key with a limit per minute.
func (h *harness) hit(key string, limit, cost int64) Decision {
	h.t.Helper()
	return h.check(Check{Key: key, Limit: limit, Window: time.Minute, Cost: cost})
}

// settle waits until every actor has decided everything sent so far: a peek
// on a key of every actor is answered only after what was queued before it.
func (h *harness) settle() {
	h.t.Helper()
	for _, key := range probeKeys(h.eng) {
		var d [1]Decision
		if err := h.eng.Check(context.Background(), []Check{{Key: key, Limit: 1, Window: time.Second}}, d[:]); err != nil {
			h.t.Fatal(err)
		}
	}
	if h.store != nil {
		if err := h.store.Flush(); err != nil {
			h.t.Fatal(err)
		}
	}
}

// probeKeys returns a key of each actor, in actor order.
func probeKeys(e *Engine) []string {
	keys := make([]string, len(e.actors))
	for n, left := 0, len(keys); left > 0; n++ {
		k := fmt.Sprintf("probe-%d", n)
		if i := shardOf(e, k); keys[i] == "" {
			keys[i] = k
			left--
		}
	}
	return keys
}

func keyOfActor(e *Engine, i int) string {
	for n := 0; ; n++ {
		k := fmt.Sprintf("probe-%d", n)
		if shardOf(e, k) == i {
			return k
		}
	}
}

func shardOf(e *Engine, key string) int { return shard.Index(key, len(e.actors)) }

var modes = []string{"memory", "commit", "fsync", "async"}

// TestLimitThenDeny: exactly limit hits are allowed in a window, then every
// hit is denied until the oldest leaves the window.
func TestLimitThenDeny(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, mode, nil)
			for i := int64(1); i <= 5; i++ {
				d := h.hit("user:1", 5, 1)
				if !d.Allowed || d.Remaining != 5-i {
					t.Fatalf("hit %d = %+v; want allowed with %d remaining", i, d, 5-i)
				}
				h.clk.Advance(time.Second)
			}
			d := h.hit("user:1", 5, 1)
			if d.Allowed || d.RetryAfter != 55*time.Second {
				t.Fatalf("hit 6 = %+v; want denied, retry after 55s", d)
			}
			// Another key has its own budget.
			if d := h.hit("user:2", 5, 5); !d.Allowed {
				t.Fatalf("user:2 cost 5 = %+v; want allowed: keys never share a budget", d)
			}
			h.clk.Advance(d.RetryAfter - time.Nanosecond)
			if d := h.hit("user:1", 5, 1); d.Allowed {
				t.Fatalf("1ns before retry_after: %+v; want denied", d)
			}
			h.clk.Advance(time.Nanosecond)
			if d := h.hit("user:1", 5, 1); !d.Allowed {
				t.Fatalf("at retry_after: %+v; want allowed", d)
			}
		})
	}
}

// TestNoDoubleBurst: a full window's worth at the end of one clock minute
// leaves nothing for the start of the next.
func TestNoDoubleBurst(t *testing.T) {
	h := newHarness(t, "commit", nil)
	// epoch is 12:00:59.5: spend the whole limit there.
	if d := h.hit("k", 100, 100); !d.Allowed {
		t.Fatalf("burst = %+v; want allowed", d)
	}
	h.clk.Advance(600 * time.Millisecond) // 12:01:00.1, a new clock minute
	d := h.hit("k", 100, 1)
	if d.Allowed {
		t.Fatalf("after the minute boundary: %+v; want denied (no double burst)", d)
	}
	if want := 59400 * time.Millisecond; d.RetryAfter != want {
		t.Fatalf("retry_after = %v; want %v", d.RetryAfter, want)
	}
}

// TestClosedDoor: a client that keeps hitting a closed door is let in once
// the window has passed, because denied hits are not recorded.
func TestClosedDoor(t *testing.T) {
	h := newHarness(t, "commit", nil)
	h.hit("door", 3, 3)
	for i := 0; i < 60; i++ {
		h.clk.Advance(time.Second - time.Millisecond)
		if d := h.hit("door", 3, 1); d.Allowed {
			t.Fatalf("knock %d at +%v = %+v; want denied", i, time.Duration(i+1)*(time.Second-time.Millisecond), d)
		}
	}
	h.clk.Advance(time.Second)
	if d := h.hit("door", 3, 1); !d.Allowed {
		t.Fatalf("after the window: %+v; want allowed", d)
	}
}

// TestRetryAfterCost: retry_after for a cost above 1 is when enough hits
// have left, not when the oldest does.
func TestRetryAfterCost(t *testing.T) {
	h := newHarness(t, "memory", nil)
	for i := 0; i < 4; i++ { // hits at 0s, 10s, 20s, 30s
		h.hit("c", 4, 1)
		h.clk.Advance(10 * time.Second)
	}
	d := h.check(Check{Key: "c", Limit: 4, Window: time.Minute, Cost: 3})
	if d.Allowed || d.RetryAfter != 40*time.Second { // now 40s; the third hit (20s) leaves at 80s
		t.Fatalf("cost 3 = %+v; want denied, retry after 40s", d)
	}
	h.clk.Advance(d.RetryAfter)
	if d := h.check(Check{Key: "c", Limit: 4, Window: time.Minute, Cost: 3}); !d.Allowed {
		t.Fatalf("cost 3 after retry_after = %+v; want allowed", d)
	}
}

// TestBadInputRecordsNothing: one invalid check fails the call and nothing
// of the call is recorded.
func TestBadInputRecordsNothing(t *testing.T) {
	h := newHarness(t, "commit", nil)
	good := Check{Key: "fine", Limit: 10, Window: time.Minute, Cost: 1}
	long := string(make([]byte, DefaultMaxKeyLen+1))
	tests := []struct {
		name  string
		bad   Check
		field string
	}{
		{"empty key", Check{Limit: 1, Window: time.Second}, "key"},
		{"long key", Check{Key: long, Limit: 1, Window: time.Second}, "key"},
		{"zero limit", Check{Key: "x", Window: time.Second}, "limit"},
		{"negative limit", Check{Key: "x", Limit: -1, Window: time.Second}, "limit"},
		{"zero window", Check{Key: "x", Limit: 1}, "window"},
		{"window too long", Check{Key: "x", Limit: 1, Window: DefaultMaxWindow + 1}, "window"},
		{"negative cost", Check{Key: "x", Limit: 1, Window: time.Second, Cost: -1}, "cost"},
		{"cost above limit", Check{Key: "x", Limit: 1, Window: time.Second, Cost: 2}, "cost"},
		{"unknown algorithm", Check{Key: "x", Limit: 1, Window: time.Second, Algorithm: 9}, "algorithm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make([]Decision, 2)
			err := h.eng.Check(context.Background(), []Check{good, tt.bad}, out)
			var ice *InvalidCheckError
			if !errors.As(err, &ice) || ice.Index != 1 || ice.Field != tt.field {
				t.Fatalf("Check(good, %+v) = %v; want InvalidCheckError on check 1 field %q", tt.bad, err, tt.field)
			}
		})
	}
	if d := h.check(Check{Key: "fine", Limit: 10, Window: time.Minute}); d.Remaining != 10 {
		t.Fatalf("after %d refused calls, fine has %d remaining; want 10 (nothing recorded)", len(tests), d.Remaining)
	}
	out := make([]Decision, DefaultMaxBatch+1)
	checks := make([]Check, len(out))
	if err := h.eng.Check(context.Background(), checks, out); !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("Check(%d checks) = %v; want ErrBatchTooLarge", len(checks), err)
	}
}

// TestBatchAcrossActors: a call whose keys live on different actors gets one
// decision per check, in order, and a key named twice counts twice.
func TestBatchAcrossActors(t *testing.T) {
	h := newHarness(t, "commit", nil)
	var checks []Check
	for i := 0; i < 10; i++ {
		checks = append(checks, Check{Key: fmt.Sprintf("k%d", i), Limit: 2, Window: time.Minute, Cost: 1})
	}
	checks = append(checks, checks[3])
	out := make([]Decision, len(checks))
	for round := 0; round < 2; round++ {
		if err := h.eng.Check(context.Background(), checks, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out {
			// k3 is checked twice a round: both fit its limit of 2 in
			// round 0, neither in round 1.
			want := !(round == 1 && (i == 3 || i == 10))
			if d.Allowed != want {
				t.Errorf("round %d check %d (%s) = %+v; want allowed=%v", round, i, checks[i].Key, d, want)
			}
		}
	}
}

// TestRestartKeepsHits: no free window after a graceful restart.
func TestRestartKeepsHits(t *testing.T) {
	for _, mode := range []string{"commit", "fsync", "async"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, mode, nil)
			for i := 0; i < 100; i++ {
				h.hit(fmt.Sprintf("key-%d", i), 10, int64(i%10)+1)
			}
			h.restart()
			for i := 0; i < 100; i++ {
				d := h.check(Check{Key: fmt.Sprintf("key-%d", i), Limit: 10, Window: time.Minute})
				if want := 10 - int64(i%10) - 1; d.Remaining != want {
					t.Errorf("after restart key-%d remaining = %d; want %d", i, d.Remaining, want)
				}
			}
		})
	}
}

// TestIdleKeyLeaves: a key's alarm removes it from memory and disk when its
// last hit leaves the window; an empty key arms nothing; once every key is
// gone, no timer is armed, so no goroutine will wake.
func TestIdleKeyLeaves(t *testing.T) {
	for _, mode := range []string{"memory", "commit"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, mode, nil)
			h.hit("a", 10, 1)
			h.clk.Advance(30 * time.Second)
			h.hit("a", 10, 1)
			h.hit("b", 10, 1)
			h.check(Check{Key: "peek", Limit: 10, Window: time.Minute}) // never written
			h.settle()
			if got := h.obs.keys.Load(); got != 2 {
				t.Fatalf("keys in memory = %d; want 2 (a peek keeps nothing)", got)
			}
			h.clk.Advance(30 * time.Second) // a's first hit leaves; a and b stay
			h.settle()
			if got := h.obs.keys.Load(); got != 2 {
				t.Fatalf("after 60s keys in memory = %d; want 2", got)
			}
			h.clk.Advance(30 * time.Second)
			testkit.Eventually(t, 10*time.Second, func() bool { return h.obs.keys.Load() == 0 }, "keys in memory to reach 0")
			if h.store != nil {
				testkit.Eventually(t, 10*time.Second, func() bool { return h.store.NextDeadline() == 0 }, "the store's deadline index to empty")
				n := 0
				if err := h.store.Scan("", "", 0, func(string, int64, []byte) bool { n++; return true }); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Fatalf("keys on disk = %d; want 0", n)
				}
			}
			testkit.Eventually(t, 10*time.Second, func() bool { return h.clk.Pending() == 0 }, "no timer armed")
		})
	}
}

// TestCanceledCallNotDecided: a call whose context is cancelled before an
// actor reaches it records nothing and returns an error (the context's),
// never a nil error with empty decisions (the caller may read the outcome the
// actor left, rather than its context, when both are ready).
func TestCanceledCallNotDecided(t *testing.T) {
	h := newHarness(t, "memory", nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 2000 {
		var d [1]Decision
		err := h.eng.Check(ctx, []Check{{Key: "canceled", Limit: 5, Window: time.Minute, Cost: 1}}, d[:])
		if err == nil { // context.Canceled, or ErrOverloaded: the cancelled calls queue faster than the actor drops them
			t.Fatalf("Check %d with a cancelled context = nil, %+v; want an error", i, d[0])
		}
	}
	// The actor drains the cancelled calls; then a peek sees nothing.
	var d [1]Decision
	var err error
	testkit.Eventually(t, 10*time.Second, func() bool {
		err = h.eng.Check(context.Background(), []Check{{Key: "canceled", Limit: 5, Window: time.Minute}}, d[:])
		return !errors.Is(err, ErrOverloaded)
	}, "the actor to drain the cancelled calls (a peek is still refused as overloaded)")
	if err != nil {
		t.Fatalf("peek after cancelled calls: %v", err)
	}
	if d[0].Remaining != 5 {
		t.Errorf("after cancelled calls, remaining %d; want 5 (nothing recorded)", d[0].Remaining)
	}
}

// batchObserver counts the batches the actors decided and their checks.
type batchObserver struct {
	countObserver
	batches, checks atomic.Int64
}

func (o *batchObserver) Batch(_, checks, _ int) {
	o.batches.Add(1)
	o.checks.Add(int64(checks))
}

// TestBatchesGroupOnOneCore: on one P, the checks that many callers send
// an actor at once are decided in one batch. The actor used to run as soon
// as the first arrived and decide it alone, a batch (and a storage commit)
// per check on a node with one core.
func TestBatchesGroupOnOneCore(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const (
		callers = 64
		rounds  = 20
	)
	obs := &batchObserver{}
	eng, err := New(Config{Actors: 1, Clock: clock.NewFake(epoch), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			var d [1]Decision
			for range rounds {
				c := Check{Key: fmt.Sprintf("k%02d", g), Limit: 1000, Window: time.Minute, Cost: 1}
				if err := eng.Check(context.Background(), []Check{c}, d[:]); err != nil || !d[0].Allowed {
					t.Errorf("Check = %+v, %v; want allowed", d[0], err)
				}
			}
		})
	}
	wg.Wait()
	if n := obs.checks.Load(); n != callers*rounds {
		t.Fatalf("%d checks decided; want %d", n, callers*rounds)
	}
	// With the actor's yield: 22 or 23 batches, also beside two busy
	// loops. Without it: 1,280, or 25 to 56 under the race detector, whose
	// instrumentation gives the first check time to gather company.
	if n := obs.batches.Load(); n > rounds+rounds/5 {
		t.Errorf("%d checks in %d batches; want at most %d: the checks sent at once share a batch", obs.checks.Load(), n, rounds+rounds/5)
	}
}
