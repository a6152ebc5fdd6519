package actor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
)

// TestMeasureReplicaCost measures what a standby's copies cost: the data
// file of an owner holding n keys of one hit each, and of a standby holding
// their copies (PutReplicas of the owner's records), and the Go heap the
// copies keep on the standby. Run it with the number of keys:
//
//	SLUICE_MEASURE_REPLICAS=100000 go test ./actor/ -run MeasureReplicaCost -v
func TestMeasureReplicaCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_REPLICAS"))
	if n <= 0 {
		t.Skip("set SLUICE_MEASURE_REPLICAS=<keys> to measure")
	}
	rep := &recReplicator{}
	owner := newHarness(t, "commit", func(c *Config) { c.Replicator = rep })
	for i := range n {
		owner.hit(fmt.Sprintf("user:%08d", i), 100, 1)
	}
	owner.settle()
	owner.stop()
	owner.eng = nil

	standby := newHarness(t, "commit", nil)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	rep.mu.Lock()
	recs := rep.recs
	rep.recs = nil
	rep.mu.Unlock()
	before := heap()
	for start := 0; start < len(recs); start += 2000 {
		if err := standby.eng.PutReplicas(context.Background(), recs[start:min(start+2000, len(recs))]); err != nil {
			t.Fatal(err)
		}
	}
	after := heap()
	runtime.KeepAlive(recs)
	standby.stop()
	standby.eng = nil

	size := func(dir string) int64 {
		fi, err := os.Stat(filepath.Join(dir, "sluice.db"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	t.Logf("%d keys: owner's data file %.1f MiB (%.0f B/key), standby's %.1f MiB (%.0f B/key); Go heap the copies keep on the standby %.0f B/key (the store's overlay, until its next checkpoint)",
		n, float64(size(owner.dir))/(1<<20), float64(size(owner.dir))/float64(n),
		float64(size(standby.dir))/(1<<20), float64(size(standby.dir))/float64(n),
		(float64(after)-float64(before))/float64(n))
}
