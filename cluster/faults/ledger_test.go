//go:build linux

package faults

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// The keys of a scenario: limited keys reach their limit within the first
// seconds of load and must then be denied for the rest of the hour; ledger
// keys are never denied, so their count is the number of hits the cluster
// acknowledged.
const (
	keysPerKind  = 16
	limitedLimit = 40
	ledgerLimit  = 1_000_000_000
	window       = time.Hour
)

// testKey is a key the load checks, with its limit per window.
type testKey struct {
	name  string
	limit int64
}

// limited reports whether the key is meant to reach its limit.
func (k testKey) limited() bool { return k.limit == limitedLimit }

// scenarioKeys returns the limited keys, then the ledger keys.
func scenarioKeys() []testKey {
	var keys []testKey
	for i := range keysPerKind {
		keys = append(keys, testKey{fmt.Sprintf("limited:%02d", i), limitedLimit})
	}
	for i := range keysPerKind {
		keys = append(keys, testKey{fmt.Sprintf("ledger:%02d", i), ledgerLimit})
	}
	return keys
}

// check is a sliding-log check of cost hits on k; cost 0 peeks.
func (k testKey) check(cost int64) *sluicepb.Check {
	return &sluicepb.Check{
		Key:       []byte(k.name),
		Limit:     k.limit,
		Window:    durationpb.New(window),
		Algorithm: sluicepb.Algorithm_ALGORITHM_SLIDING_LOG,
		Cost:      proto.Int64(cost),
	}
}

// loadConfig shapes the load of a scenario.
type loadConfig struct {
	// rate is the calls per second of all callers together.
	rate float64
	// callers is the number of caller goroutines per client.
	callers int
	// deadline bounds each call.
	deadline time.Duration
	// maxCalls bounds the calls of each caller.
	maxCalls int
}

// defaultLoad is about 2,000 checks/s from 32 callers per client: enough to
// keep every key busy, little enough that the three nodes and the test
// share two cores.
func defaultLoad() loadConfig {
	return loadConfig{rate: 2000, callers: 32, deadline: time.Second, maxCalls: 50_000}
}

// outcome is what a client was told about one check.
type outcome uint8

const (
	allowed outcome = iota
	denied
	failed
)

// call is one check as its client saw it.
type call struct {
	key           int // index in the scenario's keys
	client        int // index of the node whose client sent it
	sent, replied time.Time
	outcome       outcome
	node          string     // allowed or denied: the node that decided
	code          codes.Code // failed: the call's status
	msg           string     // failed: the status message
}

// load is callers checking keys through every node's client until stopped.
type load struct {
	stop       chan struct{}
	wg         sync.WaitGroup
	start, end time.Time
	calls      [][]call // one history per caller, written by that caller only
}

// startLoad starts cfg.callers callers on each node's client, each pacing
// its calls so that all of them together send about cfg.rate calls per
// second, on keys picked at random. A caller that falls behind skips ticks
// rather than bursting.
func startLoad(nodes []*node, keys []testKey, cfg loadConfig) *load {
	l := &load{stop: make(chan struct{}), start: time.Now()}
	total := cfg.callers * len(nodes)
	l.calls = make([][]call, total)
	interval := time.Duration(float64(total) / cfg.rate * float64(time.Second))
	for i := range total {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			client := i % len(nodes)
			l.calls[i] = runCaller(nodes[client], client, keys, interval, cfg, l.stop)
		}()
	}
	return l
}

// runCaller sends one check every interval through n's client until stop
// closes or it has sent cfg.maxCalls, and returns what it was told.
func runCaller(n *node, client int, keys []testKey, interval time.Duration, cfg loadConfig, stop <-chan struct{}) []call {
	var calls []call
	// Spread the callers over the interval.
	select {
	case <-stop:
		return nil
	case <-time.After(rand.N(interval)):
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for range cfg.maxCalls {
		select {
		case <-stop:
			return calls
		case <-tick.C:
		}
		select {
		case <-stop: // stop wins over a tick that was ready too
			return calls
		default:
		}
		c := call{key: rand.IntN(len(keys)), client: client, sent: time.Now()}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.deadline)
		resp, err := n.limit.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{keys[c.key].check(1)}})
		cancel()
		c.replied = time.Now()
		switch {
		case err != nil:
			s := status.Convert(err)
			c.outcome, c.code, c.msg = failed, s.Code(), s.Message()
		case len(resp.Decisions) != 1:
			c.outcome, c.code, c.msg = failed, codes.Internal, fmt.Sprintf("%d decisions for 1 check", len(resp.Decisions))
		case resp.Decisions[0].Allowed:
			c.outcome, c.node = allowed, resp.Decisions[0].Node
		default:
			c.outcome, c.node = denied, resp.Decisions[0].Node
		}
		calls = append(calls, c)
	}
	return calls
}

// finish stops the callers, waits for them and returns every call they
// made.
func (l *load) finish() []call {
	close(l.stop)
	l.wg.Wait()
	l.end = time.Now()
	var all []call
	for _, calls := range l.calls {
		all = append(all, calls...)
	}
	return all
}

// peek is what the cluster says about a key through one node.
type peek struct {
	used int64  // limit - remaining
	node string // the node that answered for the key (its owner)
}

// peekAll peeks at every key through every node: peeks[key][node]. It
// fails if any node fails to answer for any key.
func (c *cluster) peekAll(keys []testKey) ([][]peek, error) {
	req := &sluicepb.CheckRequest{}
	for _, k := range keys {
		req.Checks = append(req.Checks, k.check(0))
	}
	peeks := make([][]peek, len(keys))
	for i := range peeks {
		peeks[i] = make([]peek, len(c.nodes))
	}
	for j, n := range c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := n.limit.Check(ctx, req)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("peek through %s: %v", n.name, err)
		}
		if len(resp.Decisions) != len(keys) {
			return nil, fmt.Errorf("peek through %s: %d decisions for %d checks", n.name, len(resp.Decisions), len(keys))
		}
		for i, d := range resp.Decisions {
			peeks[i][j] = peek{used: keys[i].limit - d.Remaining, node: d.Node}
		}
	}
	return peeks, nil
}

// settle waits until the cluster has recovered from a fault: every node
// ready, every node seeing every member alive, and two peeks in a row at
// every key through every node giving the same count on all of them (so a
// handoff in flight has landed). It returns the last peeks it got, nil if
// none succeeded, and an error if the cluster did not settle by deadline.
func (c *cluster) settle(keys []testKey, deadline time.Time) ([][]peek, error) {
	for _, n := range c.nodes {
		if err := n.waitReady(deadline); err != nil {
			peeks, _ := c.peekAll(keys)
			return peeks, err
		}
	}
	if err := c.waitMembers(deadline); err != nil {
		peeks, _ := c.peekAll(keys)
		return peeks, err
	}
	var last [][]peek
	for {
		peeks, err := c.peekAll(keys)
		if err == nil {
			if err = disagreement(keys, peeks); err == nil && slices.EqualFunc(peeks, last, slices.Equal[[]peek]) {
				return peeks, nil
			}
			last = peeks
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("cluster not settled: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// disagreement returns an error naming the first key that the nodes count
// differently.
func disagreement(keys []testKey, peeks [][]peek) error {
	for i, p := range peeks {
		for _, q := range p[1:] {
			if q != p[0] {
				return fmt.Errorf("%s: %s", keys[i].name, describePeeks(p))
			}
		}
	}
	return nil
}

// describePeeks says what each node answered for one key.
func describePeeks(p []peek) string {
	var parts []string
	for j, q := range p {
		parts = append(parts, fmt.Sprintf("through n%d: %d used on %s", j+1, q.used, q.node))
	}
	return strings.Join(parts, ", ")
}

// keyResult is the ledger of one key: what its clients were told and what
// the cluster counts.
type keyResult struct {
	key        testKey
	allowed    int64          // allowed answers
	allowedBy  map[string]int // allowed answers by deciding node
	peeks      []peek         // by node; nil if the cluster never answered
	failing    time.Duration  // time covered by its failed calls
	unanswered time.Duration  // time some client went without an answer
}

// used is the smallest count any node gives (a lost hit shows on the
// lowest), or -1 if unknown.
func (r keyResult) used() int64 {
	if r.peeks == nil {
		return -1
	}
	return slices.MinFunc(r.peeks, func(a, b peek) int { return cmp.Compare(a.used, b.used) }).used
}

// over is by how many hits the key went over its limit.
func (r keyResult) over() int64 { return max(0, r.allowed-r.key.limit) }

// lost is how many acknowledged hits of a ledger key the cluster no longer
// counts (0 if unknown).
func (r keyResult) lost() int64 {
	if r.key.limited() || r.peeks == nil {
		return 0
	}
	return max(0, r.allowed-r.used())
}

// ledger sums each key's calls. end is when the load stopped.
func ledger(keys []testKey, calls []call, peeks [][]peek, end time.Time) []keyResult {
	results := make([]keyResult, len(keys))
	for i, k := range keys {
		results[i] = keyResult{key: k, allowedBy: map[string]int{}}
		if peeks != nil {
			results[i].peeks = peeks[i]
		}
	}
	byKey := make([][]call, len(keys))
	for _, c := range calls {
		byKey[c.key] = append(byKey[c.key], c)
		if c.outcome == allowed {
			results[c.key].allowed++
			results[c.key].allowedBy[c.node]++
		}
	}
	for i := range results {
		results[i].failing, results[i].unanswered = unavailable(byKey[i], end)
	}
	return results
}

// unavailable measures how long one key was unavailable, two ways:
//
//   - failing is the time covered by its failed calls (the union of their
//     [sent, replied] intervals). A call that fails fast (connection
//     refused) covers almost nothing, so this undercounts a node that is
//     down and says so at once.
//   - unanswered is the time during which at least one client went without
//     an answer for the key: for each client, from the sending of a failed
//     call to the reply of the next call that got an answer (allowed or
//     denied), or to end if none did; the union over clients.
func unavailable(calls []call, end time.Time) (failing, unanswered time.Duration) {
	calls = slices.Clone(calls)
	slices.SortFunc(calls, func(a, b call) int { return a.sent.Compare(b.sent) })
	var failedIvs, downIvs []interval
	downSince := map[int]time.Time{} // by client: since when it has had no answer
	for _, c := range calls {
		since, down := downSince[c.client]
		if c.outcome == failed {
			failedIvs = append(failedIvs, interval{c.sent, c.replied})
			if !down {
				downSince[c.client] = c.sent
			}
			continue
		}
		if down {
			downIvs = append(downIvs, interval{since, c.replied})
			delete(downSince, c.client)
		}
	}
	for _, since := range downSince {
		downIvs = append(downIvs, interval{since, end})
	}
	return covered(failedIvs), covered(downIvs)
}

// interval is the time between two instants.
type interval struct{ from, to time.Time }

// covered returns the total time the intervals cover, counting overlaps
// once.
func covered(ivs []interval) time.Duration {
	ivs = slices.Clone(ivs)
	slices.SortFunc(ivs, func(a, b interval) int { return a.from.Compare(b.from) })
	var total time.Duration
	var cur interval
	for i, iv := range ivs {
		switch {
		case i == 0:
			cur = iv
		case iv.from.After(cur.to):
			total += cur.to.Sub(cur.from)
			cur = iv
		case iv.to.After(cur.to):
			cur.to = iv.to
		}
	}
	if len(ivs) > 0 {
		total += cur.to.Sub(cur.from)
	}
	return total
}

// spread is the maximum and the median of durations.
type spread struct{ max, median time.Duration }

func spreadOf(ds []time.Duration) spread {
	if len(ds) == 0 {
		return spread{}
	}
	return spread{slices.Max(ds), median(ds)}
}

func (s spread) String() string {
	return fmt.Sprintf("%.1f / %.1f", s.max.Seconds(), s.median.Seconds())
}

// median returns the median of ds, 0 if empty.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Sorted(slices.Values(ds))
	n := len(ds)
	if n%2 == 1 {
		return ds[n/2]
	}
	return (ds[n/2-1] + ds[n/2]) / 2
}

// report is what one scenario cost: one row of the suite's table.
type report struct {
	event          string
	measured       bool // false if the scenario ended before its ledger
	known          bool // whether the cluster answered for every key at the end
	limitedKeys    int
	overKeys       int
	worst          keyResult // the limited key with the most allowed
	lostKeys       int
	worstLost      int64
	failing        spread // over keys: time covered by failed calls
	unanswered     spread // over keys: time some client had no answer
	errorsByCode   map[codes.Code]int
	firstErrByCode map[codes.Code]string
}

// newReport sums the ledger of a scenario.
func newReport(event string, calls []call, results []keyResult, known bool) report {
	r := report{event: event, measured: true, known: known, errorsByCode: map[codes.Code]int{}, firstErrByCode: map[codes.Code]string{}}
	var failing, unanswered []time.Duration
	for _, k := range results {
		failing = append(failing, k.failing)
		unanswered = append(unanswered, k.unanswered)
		if k.key.limited() {
			r.limitedKeys++
			if k.over() > 0 {
				r.overKeys++
			}
			if k.allowed > r.worst.allowed {
				r.worst = k
			}
		} else if lost := k.lost(); lost > 0 {
			r.lostKeys++
			r.worstLost = max(r.worstLost, lost)
		}
	}
	r.failing = spreadOf(failing)
	r.unanswered = spreadOf(unanswered)
	for _, c := range calls {
		if c.outcome == failed {
			if r.errorsByCode[c.code] == 0 {
				r.firstErrByCode[c.code] = c.msg
			}
			r.errorsByCode[c.code]++
		}
	}
	return r
}

// tableHeader heads the suite's table; each report is one row.
const tableHeader = "| event | keys over their limit (worst allowed/limit) | acknowledged hits lost (keys, worst) " +
	"| s per key covered by failed calls (max / median) | s per key some client had no answer (max / median) | errors by code |\n" +
	"|---|---|---|---|---|---|"

// row formats the report as a markdown table row.
func (r report) row() string {
	if !r.measured {
		return fmt.Sprintf("| %s | not measured | not measured | not measured | not measured | not measured |", r.event)
	}
	over := fmt.Sprintf("%d of %d", r.overKeys, r.limitedKeys)
	if r.worst.allowed > 0 {
		over += fmt.Sprintf(" (%d/%d)", r.worst.allowed, r.worst.key.limit)
	}
	lost := "unknown: no ledger"
	if r.known {
		lost = "0"
		if r.lostKeys > 0 {
			lost = fmt.Sprintf("%d keys, worst %d", r.lostKeys, r.worstLost)
		}
	}
	return fmt.Sprintf("| %s | %s | %s | %v | %v | %s |", r.event, over, lost, r.failing, r.unanswered, r.errorSummary())
}

// errorSummary lists the failed calls by code, most frequent first.
func (r report) errorSummary() string {
	if len(r.errorsByCode) == 0 {
		return "none"
	}
	codesSeen := slices.SortedFunc(maps.Keys(r.errorsByCode), func(a, b codes.Code) int {
		return cmp.Or(cmp.Compare(r.errorsByCode[b], r.errorsByCode[a]), cmp.Compare(a, b))
	})
	var parts []string
	for _, c := range codesSeen {
		parts = append(parts, fmt.Sprintf("%v %d", c, r.errorsByCode[c]))
	}
	return strings.Join(parts, ", ")
}

// table formats reports as a markdown table.
func table(reports []report) string {
	lines := []string{tableHeader}
	for _, r := range reports {
		lines = append(lines, r.row())
	}
	return strings.Join(lines, "\n")
}

// checkLedger fails the test for every limited key that allowed more than
// its limit in the hour and every ledger key that counts fewer hits than
// its clients were told were allowed, saying what the cluster counts now.
func checkLedger(t *testing.T, results []keyResult) {
	t.Helper()
	for _, k := range results {
		now := "the cluster did not answer for it"
		if k.peeks != nil {
			now = "the cluster now counts " + describePeeks(k.peeks)
		}
		if k.key.limited() && k.over() > 0 {
			t.Errorf("%s: %d hits allowed within the hour (%s); limit %d; %s",
				k.key.name, k.allowed, describeAllowedBy(k.allowedBy), k.key.limit, now)
		}
		if lost := k.lost(); lost > 0 {
			t.Errorf("%s: %d hits acknowledged (%s); %s: %d lost",
				k.key.name, k.allowed, describeAllowedBy(k.allowedBy), now, lost)
		}
	}
}

// describeAllowedBy lists allowed answers by deciding node.
func describeAllowedBy(by map[string]int) string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%d by %s", by[n], n))
	}
	return strings.Join(parts, ", ")
}

// TestCovered: the unavailability of a key is the time its failed calls
// cover, overlaps counted once.
func TestCovered(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))) }
	for _, tc := range []struct {
		name string
		ivs  [][2]float64
		want time.Duration
	}{
		{"none", nil, 0},
		{"one", [][2]float64{{1, 2}}, time.Second},
		{"disjoint", [][2]float64{{5, 6}, {1, 2}}, 2 * time.Second},
		{"overlapping", [][2]float64{{1, 3}, {2, 4}}, 3 * time.Second},
		{"nested", [][2]float64{{1, 5}, {2, 3}, {4.5, 6}}, 5 * time.Second},
		{"touching", [][2]float64{{1, 2}, {2, 3}}, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ivs []interval
			for _, iv := range tc.ivs {
				ivs = append(ivs, interval{at(iv[0]), at(iv[1])})
			}
			if got := covered(ivs); got != tc.want {
				t.Errorf("covered(%v) = %v; want %v", tc.ivs, got, tc.want)
			}
		})
	}
}

// TestMedian: the median of an even count is the mean of the middle two.
func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3, 1, 2}, 2},
		{[]time.Duration{4, 1, 3, 2}, 2},
		{[]time.Duration{0, 0, 10, 10}, 5},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v; want %v", tc.in, got, tc.want)
		}
	}
}

// TestUnavailable: a key is unavailable to a client from its first failed
// call to its next answer, however fast the calls fail; the key's figure
// is the union over clients.
func TestUnavailable(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))) }
	c := func(client int, sent, replied float64, o outcome) call {
		return call{client: client, sent: at(sent), replied: at(replied), outcome: o}
	}
	for _, tc := range []struct {
		name                        string
		calls                       []call
		wantFailing, wantUnanswered time.Duration
	}{
		{"all answered", []call{c(0, 1, 1.5, allowed), c(1, 2, 2.5, denied)}, 0, 0},
		{"fast failures until an answer", []call{c(0, 1, 1, failed), c(0, 2, 2, failed), c(0, 5, 5.5, allowed)}, 0, 4500 * time.Millisecond},
		{"slow failure", []call{c(0, 1, 2, failed), c(0, 3, 3, allowed)}, time.Second, 2 * time.Second},
		{"no answer before the end", []call{c(0, 8, 8, failed)}, 0, 2 * time.Second},
		{"two clients overlap", []call{c(0, 1, 1, failed), c(1, 2, 2, failed), c(0, 3, 3, allowed), c(1, 4, 4, allowed)}, 0, 3 * time.Second},
		{"one client fails, the other answers", []call{c(0, 1, 1, failed), c(1, 2, 2, allowed), c(0, 3, 3, denied)}, 0, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failing, unanswered := unavailable(tc.calls, at(10))
			if failing != tc.wantFailing || unanswered != tc.wantUnanswered {
				t.Errorf("unavailable = %v failing, %v unanswered; want %v, %v", failing, unanswered, tc.wantFailing, tc.wantUnanswered)
			}
		})
	}
}
