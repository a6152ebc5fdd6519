//go:build linux

package faults

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster/clustertest"
)

// TestMain checks for leaked goroutines after the tests, and removes the
// built binary.
func TestMain(m *testing.M) {
	code := clustertest.Run(m)
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// built is the sluice binary, built once by sluiceBinary for the whole
// test binary and removed by TestMain.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// sluiceBinary builds ./cmd/sluice of this module (without -race: the
// nodes are the system under test, not the code under the race detector)
// and returns its path.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			built.err = fmt.Errorf("go env GOMOD: %v", err)
			return
		}
		mod := strings.TrimSpace(string(out))
		if mod == "" || mod == os.DevNull {
			built.err = fmt.Errorf("go env GOMOD: not in a module")
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "sluice-faults-bin-"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "sluice")
		cmd := exec.Command("go", "build", "-o", built.path, "./cmd/sluice")
		cmd.Dir = filepath.Dir(mod)
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/sluice: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// serveFlags returns the flags every node's sluice serve gets beyond the
// harness's own: the suite's, then SLUICE_FAULT_FLAGS split on spaces.
func serveFlags() []string {
	// Three nodes are meant to be: a node decides nothing without a lease
	// from two of them. The nodes serve gRPC on their namespace's address:
	// the peer service needs a credential there.
	flags := []string{"--expect", "3", "--admin-token", suiteAdminToken}
	return append(flags, strings.Fields(os.Getenv("SLUICE_FAULT_FLAGS"))...)
}

// suiteAdminToken is the admin token of the suite's nodes.
const suiteAdminToken = "fault-suite-token"

// timing is how long each phase of a scenario lasts.
type timing struct {
	// warmup is the steady load before the fault.
	warmup time.Duration
	// fault is how long a partition, pause or cut lasts
	// (SLUICE_FAULT_SECONDS, default 15 s).
	fault time.Duration
	// down is how long a killed node stays down: 10/15 of fault.
	down time.Duration
	// between is how long a rolling restart waits after a node is ready
	// before it stops the next one.
	between time.Duration
	// cooldown is the load after the fault has healed.
	cooldown time.Duration
	// settle bounds the wait for the cluster to recover after the load.
	settle time.Duration
}

// suiteTiming returns the timing of the scenarios, with the fault's length
// from SLUICE_FAULT_SECONDS.
func suiteTiming(t *testing.T) timing {
	t.Helper()
	fault := 15 * time.Second
	if s := os.Getenv("SLUICE_FAULT_SECONDS"); s != "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs <= 0 {
			t.Fatalf("SLUICE_FAULT_SECONDS=%q: want a positive number of seconds", s)
		}
		fault = time.Duration(secs * float64(time.Second))
	}
	return timing{
		warmup:   3 * time.Second,
		fault:    fault,
		down:     fault * 10 / 15,
		between:  2 * time.Second,
		cooldown: 5 * time.Second,
		settle:   60 * time.Second,
	}
}

// scenario is one fault, injected into a fresh cluster under load. The
// nodes run with the default standby per key (--replicas 2) unless the
// scenario says otherwise.
type scenario struct {
	name    string
	joinAll bool // every node joins all three (else node 1)
	// available runs the nodes with --owner-policy available: a down
	// owner's keys are decided by others once it is fenced. With a standby
	// per key they go on from its copy, so the ledger allows no excess
	// here either.
	available bool
	// inject injects the fault and heals it, then returns.
	inject func(t *testing.T, c *cluster, tm timing)
}

// scenarios returns the faults of the suite.
func scenarios() []scenario {
	return []scenario{
		{name: "rolling-restart/join-first", inject: rollingRestart},
		{name: "rolling-restart/join-all", joinAll: true, inject: rollingRestart},
		{name: "partition", inject: partition},
		{name: "pause", inject: pause},
		{name: "one-way-cut", inject: oneWayCut},
		{name: "kill9-return", inject: kill9Return},
		{name: "kill9-wiped-disk", inject: kill9WipedDisk},
		{name: "kill9-return/available", available: true, inject: kill9Return},
		{name: "partition/available", available: true, inject: partition},
	}
}

// TestFaults runs each scenario on a fresh three-node cluster under load
// and checks the cluster's exactness: no limited key allows more than its
// limit within the hour, and no acknowledged hit is lost, whatever the
// fault. It logs what each fault cost as one row of a table, and the whole
// table at the end.
func TestFaults(t *testing.T) {
	requireNetns(t)
	bin := sluiceBinary(t)
	tm := suiteTiming(t)
	var reports []report
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			r := report{event: sc.name}
			defer func() { reports = append(reports, r) }()
			r = runScenario(t, bin, sc, tm)
		})
	}
	t.Logf("what each fault cost (faults of %.1fs, kill -9 down %.1fs, about %.0f checks/s):\n%s",
		tm.fault.Seconds(), tm.down.Seconds(), defaultLoad().rate, table(reports))
}

// runScenario starts a cluster and its load, injects sc's fault, waits for
// the cluster to settle and checks its ledger. It returns the scenario's
// report.
func runScenario(t *testing.T, bin string, sc scenario, tm timing) report {
	flags := serveFlags()
	if sc.available {
		flags = append(flags, "--owner-policy", "available")
	}
	c := startCluster(t, clusterConfig{bin: bin, joinAll: sc.joinAll, extraFlags: flags})
	keys := scenarioKeys()
	cfg := defaultLoad()
	ld := startLoad(c.nodes, keys, cfg)
	var once sync.Once
	var calls []call
	finish := func() { once.Do(func() { calls = ld.finish() }) }
	t.Cleanup(finish) // if the scenario fails before the load ends

	time.Sleep(tm.warmup)
	start := time.Now()
	sc.inject(t, c, tm)
	t.Logf("%s: fault injected and healed in %.1fs", sc.name, time.Since(start).Seconds())
	time.Sleep(tm.cooldown)
	finish()

	peeks, err := c.settle(keys, time.Now().Add(tm.settle))
	if err != nil {
		t.Errorf("after the fault: %v", err)
	}
	results := ledger(keys, calls, peeks, ld.end)
	r := newReport(sc.name, calls, results, peeks != nil)
	logLoad(t, calls, ld.end.Sub(ld.start))
	for _, code := range slices.Sorted(maps.Keys(r.firstErrByCode)) {
		t.Logf("first %v: %s", code, r.firstErrByCode[code])
	}
	t.Logf("%s\n%s", tableHeader, r.row())
	checkLedger(t, results)
	return r
}

// logLoad logs how many calls the load made and what they were told.
func logLoad(t *testing.T, calls []call, d time.Duration) {
	t.Helper()
	var n [3]int
	for _, c := range calls {
		n[c.outcome]++
	}
	t.Logf("load: %d calls in %.1fs (%.0f/s): %d allowed, %d denied, %d failed",
		len(calls), d.Seconds(), float64(len(calls))/d.Seconds(), n[allowed], n[denied], n[failed])
}

// rollingRestart stops each node in turn with SIGTERM, checks that it
// exits 0, starts it again on its data dir, waits until it is ready and
// then a little longer (a StatefulSet's minReadySeconds) before the next.
// Nobody fails in a rolling restart, so nobody may be fenced: a restarted
// node that fenced the members it had not met yet forced them into new
// incarnations, and cost every key seconds.
func rollingRestart(t *testing.T, c *cluster, tm timing) {
	defer func() {
		for _, n := range c.nodes {
			if lines := n.logLines("this node was fenced"); len(lines) > 0 {
				t.Errorf("%s was fenced during a rolling restart: %s", n.name, lines[0])
			}
		}
	}()
	for _, n := range c.nodes {
		if err := n.signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, err := n.wait(60 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code != 0 {
			t.Errorf("%s exited with code %d after SIGTERM; want 0", n.name, code)
		}
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
		if err := n.waitReady(time.Now().Add(60 * time.Second)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(tm.between)
	}
}

// partition takes node 2's link down for the fault's length. Its own client
// still reaches it over loopback.
func partition(t *testing.T, c *cluster, tm timing) {
	h := c.node(2).host
	if err := h.setLink(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(tm.fault)
	if err := h.setLink(true); err != nil {
		t.Fatal(err)
	}
}

// pause stops node 2 with SIGSTOP for the fault's length, then continues
// it.
func pause(t *testing.T, c *cluster, tm timing) {
	n := c.node(2)
	if err := n.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(tm.fault)
	if err := n.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// oneWayCut makes nodes 1 and 3 drop what they send to node 2 for the
// fault's length: node 2 still reaches them, and hears nothing back.
func oneWayCut(t *testing.T, c *cluster, tm timing) {
	h := c.node(2).host
	if err := h.blackhole(true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(tm.fault)
	if err := h.blackhole(false); err != nil {
		t.Fatal(err)
	}
}

// kill9Return kills node 2 with SIGKILL and starts it again on its data dir
// after the fault's down time.
func kill9Return(t *testing.T, c *cluster, tm timing) { kill9(t, c, tm, false) }

// kill9WipedDisk is kill9Return with node 2's data directory removed
// before it starts again: a node lost with its volume, replaced by an
// empty one under the same name.
func kill9WipedDisk(t *testing.T, c *cluster, tm timing) { kill9(t, c, tm, true) }

// kill9 kills node 2 with SIGKILL, waits the fault's down time, wipes its
// data directory if asked, and starts it again.
func kill9(t *testing.T, c *cluster, tm timing, wipe bool) {
	n := c.node(2)
	if err := n.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := n.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if wipe {
		if err := os.RemoveAll(n.dataDir()); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(tm.down)
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
}
