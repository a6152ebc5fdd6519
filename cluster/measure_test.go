package cluster

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestMeasureFailureDetection measures how long the survivors of a cluster
// take to declare a stopped node dead, with Sluice's defaults and with
// memberlist's LAN profile, over several trials. It is slow and runs only
// with SLUICE_MEASURE_DETECTION set to the number of trials:
//
//	SLUICE_MEASURE_DETECTION=10 go test ./cluster/ -run MeasureFailureDetection -v
func TestMeasureFailureDetection(t *testing.T) {
	trials, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_DETECTION"))
	if trials <= 0 {
		t.Skip("set SLUICE_MEASURE_DETECTION=<trials> to measure failure detection")
	}
	lan := func(c *Config) {
		c.ProbeInterval, c.ProbeTimeout = time.Second, 500*time.Millisecond
		c.SuspicionMult, c.SuspicionMaxTimeoutMult = 4, 6
		c.GossipInterval, c.PushPullInterval, c.TCPTimeout = 200*time.Millisecond, 30*time.Second, 10*time.Second
	}
	for _, profile := range []struct {
		name string
		tune func(*Config)
	}{{"sluice", func(*Config) {}}, {"lan", lan}} {
		for _, size := range []int{3, 5} {
			var got []time.Duration
			for trial := 0; trial < trials; trial++ {
				got = append(got, measureDetection(t, size, profile.tune))
			}
			slices.Sort(got)
			t.Logf("%s, %d nodes, %d trials: min %v, median %v, max %v", profile.name, size, trials,
				got[0].Round(10*time.Millisecond), got[len(got)/2].Round(10*time.Millisecond), got[len(got)-1].Round(10*time.Millisecond))
		}
	}
}

// measureDetection starts size nodes, stops the last without leaving, and
// returns when every survivor has declared it dead.
func measureDetection(t *testing.T, size int, tune func(*Config)) time.Duration {
	var nodes []*testNode
	for i := 0; i < size; i++ {
		cfg, l := testConfig(t, fmt.Sprintf("m-%d", i))
		l.stop() // quiet: many trials
		tune(&cfg)
		if i > 0 {
			cfg.Join = []string{nodes[0].Local().GossipAddr}
		}
		n := newNode(t, cfg, l)
		if err := n.Start(t.Context()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		nodes = append(nodes, n)
	}
	waitMembers(t, 5*time.Second, nodes, size)
	// Let the cluster settle as it would in production (not a poll: the
	// measurement starts from a cluster that has gossiped for a while).
	time.Sleep(time.Second)
	victim, survivors := nodes[size-1], nodes[:size-1]
	start := time.Now()
	_ = victim.Shutdown()
	waitMembers(t, 30*time.Second, survivors, size-1)
	d := time.Since(start)
	for _, n := range nodes {
		_ = n.Shutdown()
	}
	return d
}
