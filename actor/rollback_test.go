package actor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// errDiskFull is what the tests' disk answers a write while it is full.
var errDiskFull = errors.New("no space left on device")

// newFaultHarness is newHarness on a store whose WAL writes first call
// fault (persist.Options.WriteFault): an error fails the commit, as a full
// disk would.
func newFaultHarness(t testing.TB, mode string, fault func() error, edit func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, dir: t.TempDir(), mode: mode, clk: clock.NewFake(epoch), fault: fault}
	h.cfg = Config{Actors: 4, Clock: h.clk}
	if edit != nil {
		edit(&h.cfg)
	}
	h.start()
	t.Cleanup(h.stop)
	return h
}

// fullDisk is a disk that fails every write while full is set.
type fullDisk struct{ full atomic.Bool }

func (d *fullDisk) write() error {
	if d.full.Load() {
		return errDiskFull
	}
	return nil
}

// tryCheck is harness.check that returns the error instead of failing.
func (h *harness) tryCheck(c Check) (Decision, error) {
	var d [1]Decision
	err := h.eng.Check(context.Background(), []Check{c}, d[:])
	return d[0], err
}

// remaining peeks at c's key and returns its remaining hits.
func (h *harness) remaining(c Check) int64 {
	h.t.Helper()
	c.Cost = 0
	return h.check(c).Remaining
}

// drainFailure returns what Flush reports: the failed commits the test
// caused, which Engine.Close would report otherwise.
func (h *harness) drainFailure() error {
	return h.store.Flush()
}

// TestFailedCommitRecordsNothing: a check whose commit fails (the disk is
// full) gets an error and records nothing: once the disk works again, the
// key holds what it held before, in memory and after a restart, and a
// later write of the key does not carry the failed hits to disk. For every
// algorithm, in the durable modes.
func TestFailedCommitRecordsNothing(t *testing.T) {
	for _, mode := range []string{"commit", "fsync"} {
		for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
			t.Run(mode+"/"+algo.String(), func(t *testing.T) {
				disk := &fullDisk{}
				h := newFaultHarness(t, mode, disk.write, nil)
				c := Check{Key: "k", Limit: 5, Window: time.Hour, Algorithm: algo}

				c.Cost = 3
				if d := h.check(c); !d.Allowed || d.Remaining != 2 {
					t.Fatalf("Check(cost 3) = %+v; want allowed, 2 remaining", d)
				}
				h.clk.Advance(time.Second)
				disk.full.Store(true)
				c.Cost = 2
				if d, err := h.tryCheck(c); err == nil || !strings.Contains(err.Error(), errDiskFull.Error()) {
					t.Fatalf("Check(cost 2) on a full disk = %+v, %v; want the disk's error", d, err)
				}
				disk.full.Store(false)
				if got := h.remaining(c); got != 2 {
					t.Errorf("in memory, after the failed check: remaining %d; want 2", got)
				}
				if err := h.drainFailure(); err == nil {
					t.Errorf("Flush after the failed commit = nil; want its error")
				}
				h.restart()
				if got := h.remaining(c); got != 2 {
					t.Errorf("after a restart: remaining %d; want 2", got)
				}

				// The key's next write holds what was recorded, no more.
				h.clk.Advance(time.Second)
				c.Cost = 1
				if d := h.check(c); !d.Allowed || d.Remaining != 1 {
					t.Errorf("Check(cost 1) once the disk works = %+v; want allowed, 1 remaining", d)
				}
				h.restart()
				if got := h.remaining(c); got != 1 {
					t.Errorf("after that write and a restart: remaining %d; want 1", got)
				}
			})
		}
	}
}

// gatedDisk makes each WAL write wait, while armed, for the test to say
// how it goes: the writer sends on entered, then fails the write with what
// it receives on result (nil: the write succeeds).
type gatedDisk struct {
	armed   atomic.Bool
	entered chan struct{}
	result  chan error
}

func newGatedDisk() *gatedDisk {
	return &gatedDisk{entered: make(chan struct{}), result: make(chan error)}
}

func (g *gatedDisk) write() error {
	if !g.armed.Load() {
		return nil
	}
	g.entered <- struct{}{}
	return <-g.result
}

// TestFailedCommitUndoesLaterDecisions: an actor decides a key's next
// checks on top of hits whose commit is still under way. When that commit
// fails, those later checks fail too, even though the disk works again by
// the time their own write comes, and the key holds what it held before
// the first failed check, in memory and on disk.
func TestFailedCommitUndoesLaterDecisions(t *testing.T) {
	for _, mode := range []string{"commit", "fsync"} {
		t.Run(mode, func(t *testing.T) {
			disk := newGatedDisk()
			h := newFaultHarness(t, mode, disk.write, nil)
			c := Check{Key: "k", Limit: 5, Window: time.Hour, Cost: 3}
			// other shares k's actor, and is written with k's later check.
			other := Check{Key: otherKeyOfActor(h.eng, "k"), Limit: 5, Window: time.Hour, Cost: 1}
			h.check(c)
			h.check(other)

			disk.armed.Store(true)
			h.clk.Advance(time.Second)
			c.Cost = 1
			first := checkAsync(h, c)
			<-disk.entered // the writer is writing the first check's hit
			h.clk.Advance(time.Second)
			second := checkAsync(h, c)
			third := checkAsync(h, other)
			// The second check is decided on top of the first's hit.
			testkit.Eventually(t, 10*time.Second, func() bool { return h.remaining(c) == 0 }, "the second check to be decided")
			testkit.Eventually(t, 10*time.Second, func() bool { return h.remaining(other) == 3 }, "the check on the other key to be decided")
			disk.armed.Store(false)
			disk.result <- errDiskFull
			for name, res := range map[string]<-chan error{"first": first, "second": second, "other key's": third} {
				if err := <-res; err == nil || !strings.Contains(err.Error(), errDiskFull.Error()) {
					t.Errorf("%s check: %v; want the failure of the first check's commit", name, err)
				}
			}
			if got := h.remaining(c); got != 2 {
				t.Errorf("in memory: %q remaining %d; want 2", c.Key, got)
			}
			if got := h.remaining(other); got != 4 {
				t.Errorf("in memory: %q remaining %d; want 4", other.Key, got)
			}
			_ = h.drainFailure()
			h.restart()
			if got := h.remaining(c); got != 2 {
				t.Errorf("after a restart: %q remaining %d; want 2", c.Key, got)
			}
			if got := h.remaining(other); got != 4 {
				t.Errorf("after a restart: %q remaining %d; want 4", other.Key, got)
			}
		})
	}
}

// otherKeyOfActor returns a key other than key that key's actor owns.
func otherKeyOfActor(e *Engine, key string) string {
	for n := 0; ; n++ {
		k := fmt.Sprintf("other-%d", n)
		if shardOf(e, k) == shardOf(e, key) {
			return k
		}
	}
}

// TestFailedCommitsUnderConcurrency: callers hammer a few keys while
// commits fail and succeed in turns. Invariants: no key allows more than
// its limit to the callers that were told their hits were recorded; and
// every key counts exactly the hits acknowledged without error, no more
// (a failed check recorded nothing) and no fewer, in memory and after a
// restart. With a memory bound of one key per actor too, so that keys
// leave memory and load again between failures.
func TestFailedCommitsUnderConcurrency(t *testing.T) {
	for _, maxKeys := range []int{0, 4} {
		t.Run(fmt.Sprintf("max_keys=%d", maxKeys), func(t *testing.T) {
			// Writes fail in runs: five fail, then five succeed.
			var writes atomic.Int64
			var stop atomic.Bool
			fault := func() error {
				if n := writes.Add(1); !stop.Load() && n/5%2 == 1 {
					return errDiskFull
				}
				return nil
			}
			h := newFaultHarness(t, "commit", fault, func(c *Config) { c.MaxKeys = maxKeys })
			keys := []string{"a", "b", "c", otherKeyOfActor(h.eng, "a")}
			const limit = 300
			var (
				mu     sync.Mutex
				acked  = map[string]int64{}
				failed int
			)
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for range 150 {
						c := Check{Key: keys[rng.IntN(len(keys))], Limit: limit, Window: time.Hour, Cost: 1 + rng.Int64N(3)}
						d, err := h.tryCheck(c)
						mu.Lock()
						switch {
						case err != nil && !strings.Contains(err.Error(), errDiskFull.Error()):
							t.Errorf("Check(%+v) = %v; want nil or the disk's error", c, err)
						case err != nil:
							failed++
						case d.Allowed:
							acked[c.Key] += c.Cost
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			stop.Store(true)
			_ = h.drainFailure()
			if failed == 0 {
				t.Fatalf("no check failed; the test needs failures")
			}
			verify := func(when string) {
				t.Helper()
				for _, k := range keys {
					v, err := h.eng.Inspect(context.Background(), k)
					if err != nil {
						t.Fatal(err)
					}
					if acked[k] > limit {
						t.Errorf("%s: %q allowed %d hits to callers told they were recorded; the limit is %d", when, k, acked[k], limit)
					}
					if v.Used != acked[k] {
						t.Errorf("%s: %q counts %d hits; want %d, the hits acknowledged without error", when, k, v.Used, acked[k])
					}
				}
			}
			verify("in memory")
			h.restart()
			verify("after a restart")
			t.Logf("%d writes, %d checks failed, acknowledged %v", writes.Load(), failed, acked)
		})
	}
}

// TestFailedCommitAsyncKeepsAcknowledged: in async mode a check is
// acknowledged before its commit, so a commit that fails leaves its hits
// counted (they were allowed): memory keeps them, the key does not leave
// memory for the bound (the store holds an older state), and its whole
// state is written once writes succeed again, or when the engine closes.
// With a memory bound of one key per actor too.
func TestFailedCommitAsyncKeepsAcknowledged(t *testing.T) {
	for _, maxKeys := range []int{0, 4} {
		t.Run(fmt.Sprintf("max_keys=%d", maxKeys), func(t *testing.T) {
			disk := &fullDisk{}
			h := newFaultHarness(t, "async", disk.write, func(c *Config) { c.MaxKeys = maxKeys })
			c := Check{Key: "k", Limit: 5, Window: time.Hour, Cost: 3}
			other := Check{Key: otherKeyOfActor(h.eng, "k"), Limit: 100, Window: time.Hour, Cost: 1}
			h.check(c)
			h.settle()

			disk.full.Store(true)
			h.clk.Advance(time.Second)
			c.Cost = 2
			if d := h.check(c); !d.Allowed {
				t.Fatalf("Check(cost 2) = %+v; want allowed", d)
			}
			// Async mode answers before the write is submitted: a peek
			// on the key is decided once it is.
			h.remaining(c)
			if err := h.drainFailure(); err == nil {
				t.Fatalf("Flush = nil; want the failed commit")
			}
			disk.full.Store(false)
			// The next batch of k's actor sees the failure, and writes
			// another key; the one after it sees that write succeed and
			// rewrites k. With one key per actor, the other key takes k's
			// place in memory unless k stays.
			for range 2 {
				h.check(other)
				h.remaining(other) // decided once the write is submitted
				if err := h.store.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if got := h.remaining(c); got != 0 {
				t.Errorf("in memory after the failed commit: remaining %d; want 0 (the acknowledged hits stay)", got)
			}
			if used := storedUsed(t, h, c.Key); used != 5 {
				t.Errorf("on disk once writes succeed again: %q holds %d hits; want 5", c.Key, used)
			}

			// Failed again, and closed before any other write: Close
			// writes it.
			c.Key = "k2"
			c.Cost = 3
			h.check(c)
			disk.full.Store(true)
			c.Cost = 1
			h.check(c)
			h.remaining(c)
			if err := h.drainFailure(); err == nil {
				t.Fatalf("Flush = nil; want the failed commit")
			}
			disk.full.Store(false)
			h.restart()
			if got := h.remaining(c); got != 1 {
				t.Errorf("after a restart: %q remaining %d; want 1 (the acknowledged hits stay)", c.Key, got)
			}
		})
	}
}

// storedUsed returns the hits the store holds for key, decoded as a load
// would.
func storedUsed(t *testing.T, h *harness, key string) int64 {
	t.Helper()
	var st state
	var derr error
	err := h.store.Get([]string{key}, func(_ int, _ int64, value []byte) { derr = st.decode(value) })
	if err != nil || derr != nil {
		t.Fatalf("read %q: %v, %v", key, err, derr)
	}
	return st.usedAt(h.clk.Now().UnixNano())
}

// TestFailedCommitNotReplicated: the records of a write whose commit
// failed never reach the Replicator (they were recorded nowhere), and the
// key's next write, once commits succeed again, replicates the state the
// store holds.
func TestFailedCommitNotReplicated(t *testing.T) {
	disk := &fullDisk{}
	rep := &recReplicator{}
	h := newFaultHarness(t, "commit", disk.write, func(c *Config) { c.Replicator = rep })
	c := Check{Key: "k", Limit: 5, Window: time.Hour, Cost: 3}
	h.check(c)
	if recs := rep.take(); len(recs) != 1 {
		t.Fatalf("replicated %d records for one write; want 1", len(recs))
	}
	disk.full.Store(true)
	h.clk.Advance(time.Second)
	c.Cost = 2
	if _, err := h.tryCheck(c); err == nil {
		t.Fatalf("Check on a full disk: nil error; want the disk's")
	}
	if recs := rep.take(); len(recs) != 0 {
		t.Errorf("a failed commit replicated %d records; want none", len(recs))
	}
	disk.full.Store(false)
	_ = h.drainFailure()
	c.Cost = 1
	if d := h.check(c); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("Check(cost 1) = %+v; want allowed, 1 remaining", d)
	}
	recs := rep.take()
	if len(recs) != 1 {
		t.Fatalf("replicated %d records; want 1", len(recs))
	}
	var st state
	if err := st.decode(recs[0].Value); err != nil || recs[0].Append {
		t.Fatalf("replicated %+v (decode: %v); want the whole state (a put)", recs[0], err)
	}
	if used := st.usedAt(h.clk.Now().UnixNano()); used != 4 {
		t.Errorf("the replicated state counts %d hits; want 4", used)
	}
}
