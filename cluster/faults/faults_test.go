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

// sluiceBinary builds ./cmd/sluice of this module and returns its path.
// Under -race the nodes are built with it too: the build reuses what the
// tests compiled (one build of every package, not two), and the race
// detector watches the nodes through every fault; a race it reports
// fails the scenario (raceReports).
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
		args := []string{"build", "-o", built.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/sluice")...)
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

// freshLead is how long before the fault the fresh keys enter the load.
const freshLead = time.Second

// suiteAdminToken is the admin token of the suite's nodes: they serve
// gRPC on their namespace's address, where the peer service needs a
// credential.
const suiteAdminToken = "fault-suite-token"

// timing is how long each phase of a scenario lasts.
type timing struct {
	// warmup is the steady load before the fault.
	warmup time.Duration
	// fault is how long a partition, pause or cut lasts
	// (SLUICE_FAULT_SECONDS, default 6 s: longer than failure detection,
	// about 2.4 s, and a lease, 1 s, together).
	fault time.Duration
	// down is how long a killed node stays down: 2/3 of fault.
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
	fault := 6 * time.Second
	if s := os.Getenv("SLUICE_FAULT_SECONDS"); s != "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs <= 0 {
			t.Fatalf("SLUICE_FAULT_SECONDS=%q: want a positive number of seconds", s)
		}
		fault = time.Duration(secs * float64(time.Second))
	}
	return timing{
		warmup:   2 * time.Second,
		fault:    fault,
		down:     fault * 2 / 3,
		between:  time.Second,
		cooldown: 3 * time.Second,
		settle:   60 * time.Second,
	}
}

// parallelism is how many scenarios run at once (SLUICE_FAULT_PARALLEL,
// default 2): each has its own namespaces, so only the cores are shared.
func parallelism(t *testing.T) int {
	t.Helper()
	s := os.Getenv("SLUICE_FAULT_PARALLEL")
	if s == "" {
		return 2
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("SLUICE_FAULT_PARALLEL=%q: want a positive number", s)
	}
	return n
}

// slots bounds the scenarios that run at once across the test binary
// (TestFaults and TestDoubleFaults together); made by runScenarios.
var slots struct {
	once sync.Once
	ch   chan struct{}
}

// scenario is one fault (or several), injected into a fresh cluster under
// load. The nodes run with a standby per key (--replicas 2) unless the
// scenario says otherwise.
type scenario struct {
	// name names the subtest.
	name string
	// event describes the fault for the table.
	event func(tm timing) string
	// nodes is the number of nodes (3 if 0); expect their --expect (nodes
	// if 0).
	nodes, expect int
	// joinAll makes every node join all of them (else node 1).
	joinAll bool
	// available runs the nodes with --owner-policy available: a down
	// owner's keys are decided by others once it is fenced. With a standby
	// per key they go on from its copy, so the ledger allows no excess
	// here either.
	available bool
	// replicas is --replicas (2 if 0).
	replicas int
	// extraLimits is the excess the scenario's configuration documents,
	// in limits a window: with `available` and one copy, a key taken over
	// is decided from nothing (one extra limit). A key over by more fails
	// the row; S1 and S2 are checked as everywhere, so that the lease
	// alone keeps one decider at a time.
	extraLimits int64
	// peerAddr serves the peer service on each host's second address.
	peerAddr bool
	// gossipSecond runs gossip on each host's second address, the peer
	// service on the first.
	gossipSecond bool
	// nodeFlags, deferred and mayExit are clusterConfig's.
	nodeFlags         map[int][]string
	deferred, mayExit []int
	// keep chooses the scenario's keys by their rendezvous order over the
	// node names (owner first, standby next); nil takes any.
	keep func(order []string) bool
	// takeOver requires, of each fault that cuts, pauses or kills a node,
	// that another node decided some of the keys the victim decided before
	// it (their standby took them over): the fault mattered.
	takeOver bool
	// freshAtFault lets the fresh keys enter the load at the moment the
	// fault strikes, rather than freshLead before: new keys that a node
	// decides for the first time as it is cut off.
	freshAtFault bool
	// inject injects the fault and heals it, then returns.
	inject func(t *testing.T, c *cluster, tm timing)
}

// copies is the number of copies of a key the scenario keeps.
func (sc scenario) copies() int { return cmp0(sc.replicas, 2) }

// cmp0 is v, or def if v is 0.
func cmp0(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// serveFlags returns the flags every node of sc gets beyond the harness's
// own: the scenario's, then SLUICE_FAULT_FLAGS split on spaces.
func (sc scenario) serveFlags() []string {
	nodes := cmp0(sc.nodes, 3)
	flags := []string{"--expect", strconv.Itoa(cmp0(sc.expect, nodes)), "--admin-token", suiteAdminToken}
	if sc.replicas != 0 {
		flags = append(flags, "--replicas", strconv.Itoa(sc.replicas))
	}
	if sc.available {
		flags = append(flags, "--owner-policy", "available")
	}
	return append(flags, strings.Fields(os.Getenv("SLUICE_FAULT_FLAGS"))...)
}

// scenarios returns the single faults of the suite.
func scenarios() []scenario {
	return []scenario{
		{name: "rolling-restart/join-first", inject: rollingRestart,
			event: fixed("rolling SIGTERM restart, each node joining through the first")},
		{name: "rolling-restart/join-all", joinAll: true, inject: rollingRestart,
			event: fixed("rolling SIGTERM restart, every node in every join list")},
		{name: "partition", inject: partition, takeOver: true,
			event: func(tm timing) string {
				return fmt.Sprintf("node 2 cut off %s, its own client still reaching it", secs(tm.fault))
			}},
		{name: "pause", inject: pause, takeOver: true,
			event: func(tm timing) string { return fmt.Sprintf("node 2 paused (SIGSTOP) %s", secs(tm.fault)) }},
		{name: "one-way-cut", inject: oneWayCut, takeOver: true,
			event: func(tm timing) string {
				return fmt.Sprintf("one-way cut: node 2 sends, receives nothing, %s", secs(tm.fault))
			}},
		{name: "kill9-return", inject: kill9Return, takeOver: true,
			event: func(tm timing) string { return fmt.Sprintf("kill -9 of node 2, back %s later", secs(tm.down)) }},
		{name: "kill9-wiped-disk", inject: kill9WipedDisk, takeOver: true,
			event: func(tm timing) string {
				return fmt.Sprintf("kill -9 of node 2, its data directory wiped, back %s later", secs(tm.down))
			}},
		{name: "kill9-return/available", available: true, inject: kill9Return, takeOver: true,
			event: func(tm timing) string { return fmt.Sprintf("kill -9, back %s later, `available`", secs(tm.down)) }},
		{name: "partition/available", available: true, inject: partition, takeOver: true,
			event: func(tm timing) string { return fmt.Sprintf("node 2 cut off %s, `available`", secs(tm.fault)) }},
		{name: "slow-link", inject: slowLink,
			event: func(tm timing) string { return fmt.Sprintf("node 2's link %s, %s", slowShape, secs(tm.fault)) }},
		{name: "lossy-link", inject: lossyLink,
			event: func(tm timing) string { return fmt.Sprintf("node 2's link %s, %s", lossyShape, secs(tm.fault)) }},
		{name: "lease-only/slow-clock", available: true, replicas: 1, extraLimits: 1, inject: partition,
			nodeFlags: map[int][]string{2: {"--test-lease-clock-rate", "0.95"}},
			event:     fixed("as lease-only/partition, n2's lease clock at 0.95 of real time (within ρ = 0.1: a lease of L lasts 1.05 L, the leader waits 1.1 L)")},
		{name: "lease-only/pauses-at-the-edge", available: true, replicas: 1, extraLimits: 1, inject: pausesAtTheEdge,
			event: fixed("`available`, `--replicas 1`: n2 paused right after a lease renewal for 0.9, 1.0, 1.1 and 1.3 L in turn")},
		{name: "lease-only/partition", available: true, replicas: 1, extraLimits: 1, inject: partition,
			event: func(tm timing) string {
				return fmt.Sprintf("node 2 cut off %s, `available`, `--replicas 1`: only the lease keeps n2 from deciding beside the others (one extra limit a window is the documented trade)", secs(tm.fault))
			}},
	}
}

// fixed is an event that does not depend on the timing.
func fixed(s string) func(timing) string { return func(timing) string { return s } }

// secs formats d for the table: "6 s", "1.5 s".
func secs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s" }

// TestFaults runs each single fault on a fresh three-node cluster under
// load, two at a time, and checks that the fault happened and that the
// cluster stayed exact through it: no key decided by two nodes at once
// (S1), no limited key over its limit, and every copy of every key holding
// every acknowledged hit and nothing no call could have recorded (S2). It
// logs what each fault cost as one row of a table, and the whole table at
// the end, in the shape of docs/cluster.md's.
func TestFaults(t *testing.T) {
	requireNetns(t)
	runScenarios(t, scenarios(), "what each fault cost")
}

// runScenarios runs scs as parallel subtests, at most parallelism(t) at
// once in the whole test binary, and logs their table once all are done.
// t runs in parallel with the other suites of rows and with TestChurn, so
// that no slot idles while another suite's last row or the soak runs.
func runScenarios(t *testing.T, scs []scenario, title string) {
	t.Parallel()
	bin := sluiceBinary(t)
	tm := suiteTiming(t)
	slots.once.Do(func() { slots.ch = make(chan struct{}, parallelism(t)) })
	var mu sync.Mutex
	reports := make([]report, len(scs))
	start := time.Now()
	t.Cleanup(func() {
		t.Logf("%s (faults of %s, kill -9 down %s, about %.0f checks/s and %.0f on fresh keys per scenario; %.0f s):\n%s",
			title, secs(tm.fault), secs(tm.down), defaultLoad().rate, defaultLoad().freshRate, time.Since(start).Seconds(), table(reports))
	})
	for i, sc := range scs {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			slots.ch <- struct{}{}
			defer func() { <-slots.ch }()
			r := report{name: sc.name, event: sc.event(tm), ran: true}
			defer func() {
				r.failed = t.Failed()
				mu.Lock()
				reports[i] = r
				mu.Unlock()
			}()
			r = runScenario(t, bin, sc, tm)
			r.ran = true
		})
	}
}

// runScenario starts a cluster and its load, lets the fresh keys in and
// injects sc's fault, waits for the cluster to settle, and checks that the
// fault was seen and the ledger. It returns the scenario's report.
func runScenario(t *testing.T, bin string, sc scenario, tm timing) report {
	r := report{name: sc.name, event: sc.event(tm)}
	c, err := startCluster(t, clusterConfig{
		bin: bin, nodes: sc.nodes, joinAll: sc.joinAll, extraFlags: sc.serveFlags(),
		nodeFlags: sc.nodeFlags, peerAddr: sc.peerAddr, gossipSecond: sc.gossipSecond, deferred: sc.deferred, mayExit: sc.mayExit,
	})
	if err != nil {
		r.checked = []string{"the cluster never started: " + err.Error()}
		t.Error(err)
		return r
	}
	cfg := defaultLoad()
	keys := scenarioKeys(c.names(), cfg.freshLimit(tm.fault, 1), sc.keep)
	ld := startLoad(c.nodes, keys, cfg)
	var once sync.Once
	var calls []call
	finish := func() { once.Do(func() { calls = ld.finish() }) }
	t.Cleanup(finish) // if the scenario fails before the load ends

	// The fresh keys enter a moment before the fault (so that each has a
	// copy on its standby when it strikes), or with freshAtFault at the
	// very moment it strikes.
	lead := freshLead
	if sc.freshAtFault {
		lead = 0
	}
	time.Sleep(tm.warmup - lead) // not a poll: the load runs this long before the fault
	ld.startFresh(tm.fault + lead)
	time.Sleep(lead) // not a poll: the fresh keys enter this long before the fault
	start := time.Now()
	sc.inject(t, c, tm)
	ld.boostFresh()
	t.Logf("%s: fault injected and healed in %.1fs", sc.name, time.Since(start).Seconds())
	time.Sleep(tm.cooldown) // not a poll: the load runs this long after the fault healed
	// The fresh keys reach their limit after the fault; on a busy machine
	// that may take a few seconds more.
	ld.waitFresh(time.Now().Add(5 * time.Second))
	finish()

	live := c.running()
	st, err := settle(live, keys, sc.copies(), time.Now().Add(tm.settle))
	if err != nil {
		t.Errorf("after the fault: %v", err)
	}
	if len(st.strays) > 0 {
		t.Logf("after the fault, %d states or standby copies are held by nodes that neither decide the key nor are its standby, such as: %s",
			len(st.strays), strings.Join(st.strays[:min(3, len(st.strays))], "; "))
	}
	c.mu.Lock()
	lostBefore := c.lostBefore
	c.mu.Unlock()
	results := ledger(keys, calls, st.copies, ld.end, lostBefore)
	for i := range results {
		results[i].slack = sc.extraLimits * results[i].key.limit
	}
	if sc.takeOver {
		c.mu.Lock()
		for _, f := range c.faults {
			if f.kind == cutOff || f.kind == paused || f.kind == killed {
				f.mustTakeOver = true
			}
		}
		c.mu.Unlock()
	}
	checked := c.verifyFaults(t, calls)
	if st.copies != nil {
		what := fmt.Sprintf("%d keys read on %d nodes", len(keys), len(live))
		if st.withStandby > 0 {
			what += fmt.Sprintf(", %d of them on their standby too", st.withStandby)
		}
		checked = append(checked, what)
	}
	r = newReport(sc.name, sc.event(tm), calls, results, st.copies != nil, checked)
	logLoad(t, calls, ld.end.Sub(ld.start), keys, results)
	for _, code := range slices.Sorted(maps.Keys(r.firstErrByCode)) {
		t.Logf("first %v: %s", code, r.firstErrByCode[code])
	}
	if r.s1First != "" {
		t.Logf("first evidence of two deciders: %s", r.s1First)
	}
	checkResults(t, results)
	r.failed = t.Failed()
	t.Logf("%s\n%s", tableHeader, r.row())
	return r
}

// logLoad logs how many calls the load made and what they were told, and
// how far the fresh keys got.
func logLoad(t *testing.T, calls []call, d time.Duration, keys []testKey, results []keyResult) {
	t.Helper()
	var n [3]int
	ambiguous := 0
	for i := range calls {
		n[calls[i].outcome]++
		if calls[i].ambiguous() {
			ambiguous++
		}
	}
	atLimit, fresh, freshCalls := 0, 0, 0
	var limit int64
	for i := range results {
		if results[i].key.kind == freshKey {
			fresh++
			freshCalls += results[i].calls
			limit = results[i].key.limit
			if results[i].allowed >= results[i].key.limit {
				atLimit++
			}
		}
	}
	t.Logf("load: %d calls in %.1fs (%.0f/s), %d of them on fresh keys: %d allowed, %d denied, %d failed (%d that may have recorded their hit); %d of %d fresh keys reached their limit of %d",
		len(calls), d.Seconds(), float64(len(calls))/d.Seconds(), freshCalls, n[allowed], n[denied], n[failed], ambiguous, atLimit, fresh, limit)
}

// rollingRestart stops each node in turn with SIGTERM, checks that it
// exits 0, starts it again on its data dir, waits until it is ready and
// then a little longer (a StatefulSet's minReadySeconds) before the next.
// Nobody fails in a rolling restart, so nobody may be fenced: a restarted
// node that fenced the members it had not met yet forced them into new
// incarnations, and cost every key seconds.
func rollingRestart(t *testing.T, c *cluster, tm timing) {
	restart(t, c, tm, c.nodes, nil)
}

// restart restarts nodes in turn as rollingRestart does, each with flags
// added to its command line.
func restart(t *testing.T, c *cluster, tm timing, nodes []*node, flags []string) {
	f := c.beginFault(restarted, "rolling restart of "+nodeNames(nodes), nodes, nil)
	defer f.heal()
	defer func() {
		for _, n := range c.nodes {
			if lines := n.logLines("this node was fenced"); len(lines) > 0 {
				t.Errorf("%s was fenced during a rolling restart: %s", n.name, lines[0])
			}
		}
	}()
	clean := true
	defer func() {
		if clean {
			f.note("each exited 0 after SIGTERM and was ready again")
		}
	}()
	for _, n := range nodes {
		if !stopGracefully(t, f, n) {
			clean = false
		}
		n.args = append(n.args, flags...)
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
		if err := n.waitReady(time.Now().Add(60 * time.Second)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(tm.between) // not a poll: a rolling restart's pause after each node is ready
	}
}

// nodeNames lists the names of nodes: "n1, n2".
func nodeNames(nodes []*node) string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.name)
	}
	return strings.Join(out, ", ")
}

// others returns c's nodes but except.
func (c *cluster) others(except ...*node) []*node {
	var out []*node
	for _, n := range c.nodes {
		if !slices.Contains(except, n) {
			out = append(out, n)
		}
	}
	return out
}

// partition takes node 2's link down for the fault's length. Its own client
// still reaches it over loopback.
func partition(t *testing.T, c *cluster, tm timing) {
	cutLink(t, c, c.node(2), tm.fault)
}

// cutLink takes n's link down for d.
func cutLink(t *testing.T, c *cluster, n *node, d time.Duration) {
	if err := n.host.setLink(false); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(cutOff, n.name+" cut off", []*node{n}, c.others(n))
	time.Sleep(d) // not a poll: the fault lasts d
	if err := n.host.setLink(true); err != nil {
		t.Fatal(err)
	}
	f.heal()
}

// pause stops node 2 with SIGSTOP for the fault's length, then continues
// it.
func pause(t *testing.T, c *cluster, tm timing) {
	pauseFor(t, c, c.node(2), tm.fault, c.others(c.node(2)))
}

// pauseFor stops n with SIGSTOP for d, then continues it; observers must
// see it down.
func pauseFor(t *testing.T, c *cluster, n *node, d time.Duration, observers []*node) {
	f := stopNode(t, c, n, observers)
	time.Sleep(d) // not a poll: the pause lasts d
	contNode(t, n, f)
}

// stopNode stops n with SIGSTOP and returns its fault, for contNode.
func stopNode(t *testing.T, c *cluster, n *node, observers []*node) *fault {
	if err := n.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(paused, n.name+" paused", []*node{n}, observers)
	f.checkStopped()
	return f
}

// contNode continues n, stopped by stopNode. The fault ends before the
// signal, so that nothing n answers once it runs again falls within it.
func contNode(t *testing.T, n *node, f *fault) {
	f.heal()
	if err := n.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// oneWayCut makes nodes 1 and 3 drop what they send to node 2 for the
// fault's length: node 2 still reaches them, and hears nothing back.
func oneWayCut(t *testing.T, c *cluster, tm timing) {
	n := c.node(2)
	if err := n.host.blackhole(true); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(cutOff, "n2 cut one way (it sends, receives nothing)", []*node{n}, c.others(n))
	time.Sleep(tm.fault) // not a poll: the fault lasts this long
	if err := n.host.blackhole(false); err != nil {
		t.Fatal(err)
	}
	f.heal()
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
	f := killNode(t, c, n, wipe, c.others(n))
	time.Sleep(tm.down) // not a poll: the node stays down this long
	returnNode(t, n, f)
}

// killNode kills n with SIGKILL, checks that its process is gone, and
// removes its data directory if wipe; observers must see it down. It
// returns its fault, for returnNode.
func killNode(t *testing.T, c *cluster, n *node, wipe bool, observers []*node) *fault {
	what := n.name + " killed"
	if wipe {
		what += ", its disk wiped"
	}
	if err := n.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(killed, what, []*node{n}, observers)
	if _, err := n.wait(10 * time.Second); err != nil {
		f.problem("%s: %v after SIGKILL", what, err)
		t.Fatal(err)
	}
	f.note("its process exited (%v)", n.cmd.ProcessState)
	if wipe {
		if err := os.RemoveAll(n.dataDir()); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// returnNode starts n, killed by killNode, again.
func returnNode(t *testing.T, n *node, f *fault) {
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
	f.heal()
}
