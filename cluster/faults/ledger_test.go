//go:build linux

package faults

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// hitRun is a number of hits a copy of a key holds at one instant.
type hitRun struct {
	at time.Time
	n  int64
}

// runsOf returns the runs of a sliding-log key state, oldest first (none
// if it was not found).
func runsOf(ks *sluicepb.KeyState) []hitRun {
	if !ks.GetFound() {
		return nil
	}
	var out []hitRun
	for _, r := range ks.GetSlidingLog().GetRuns() {
		out = append(out, hitRun{r.Time.AsTime(), r.Count})
	}
	return out
}

// s2 is how one copy of a key stands against what its clients were told
// (see the package doc, "S2: nothing acknowledged lost"). At every instant
// T, the copy must hold at least the hits acknowledged by then, and at
// most the hits of calls sent by then that were allowed or may have
// recorded their hit.
type s2 struct {
	// lost is the most acknowledged hits the copy lacks at any instant,
	// and lostAt that instant.
	lost   int64
	lostAt time.Time
	// over is the most hits the copy holds, at any instant, beyond the
	// calls that could have recorded them, and overAt that instant.
	over   int64
	overAt time.Time
}

// checkS2 holds one copy of k (its runs) against k's calls. A call's hit is
// recorded at the instant the node decided it, between the call's send and
// its reply, rounded up to k's resolution; so, with r that rounding and δ
// the clock margin, at every instant T:
//
//	#{allowed c: r(replied c) + δ ≤ T}  ≤  hits at or before T
//	hits at or before T  ≤  #{c allowed or ambiguous: r(sent c) − δ ≤ T}
//
// lost is the largest shortfall of the first, over the largest excess of
// the second. At the end of time they are allowed ≤ used ≤ allowed +
// ambiguous; checked at every instant, they also catch a loss that extra
// hits elsewhere in time make up for, which the totals cannot.
func checkS2(k testKey, calls []call, runs []hitRun) s2 {
	res := k.resolution()
	round := func(t time.Time) time.Time {
		if res <= 0 {
			return t
		}
		ns := t.UnixNano()
		q := ns / int64(res) * int64(res)
		if q > ns {
			q -= int64(res)
		}
		if q != ns {
			q += int64(res)
		}
		return time.Unix(0, q)
	}
	runs = slices.Clone(runs)
	slices.SortFunc(runs, func(a, b hitRun) int { return a.at.Compare(b.at) })
	var acked, possible []time.Time
	for i := range calls {
		c := &calls[i]
		if c.outcome == allowed {
			acked = append(acked, round(c.replied).Add(clockMargin))
		}
		if c.outcome == allowed || c.ambiguous() {
			possible = append(possible, round(c.sent).Add(-clockMargin))
		}
	}
	slices.SortFunc(acked, time.Time.Compare)
	slices.SortFunc(possible, time.Time.Compare)
	var out s2
	// The shortfall can only grow where an acknowledgement comes in.
	var held int64
	r := 0
	for i, at := range acked {
		if i+1 < len(acked) && !acked[i+1].After(at) {
			continue // count every acknowledgement at this instant
		}
		for r < len(runs) && !runs[r].at.After(at) {
			held += runs[r].n
			r++
		}
		if short := int64(i+1) - held; short > out.lost {
			out.lost, out.lostAt = short, at
		}
	}
	// The excess can only grow where the copy holds hits.
	held = 0
	p := 0
	for i, run := range runs {
		held += run.n
		if i+1 < len(runs) && !runs[i+1].at.After(run.at) {
			continue
		}
		for p < len(possible) && !possible[p].After(run.at) {
			p++
		}
		if excess := held - int64(p); excess > out.over {
			out.over, out.overAt = excess, run.at
		}
	}
	return out
}

// oldLost is the check this suite made before checkS2: the acknowledged
// hits a key's count falls short of, in total, at the end. Hits recorded
// but not acknowledged (a standby that did not confirm in time) make the
// count larger than the acknowledged hits, and hide as many lost ones.
func oldLost(allowedHits, used int64) int64 { return max(0, allowedHits-used) }

// keyCopy is one copy of a key a scenario's ledger was held against.
type keyCopy struct {
	what string // "n2's state", "n3's standby copy"
	used int64
	runs []hitRun
	s2   s2
}

// keyResult is the ledger of one key: what its clients were told and what
// the cluster holds.
type keyResult struct {
	key       testKey
	calls     int
	allowed   int64          // allowed answers
	ambiguous int64          // failed calls that may have recorded their hit
	allowedBy map[string]int // allowed answers by deciding node
	overlaps  []overlap      // evidence of two deciders at once (S1)
	callsOf   []call         // the key's calls
	// copies are the key's copies after the fault: the acting node's own
	// state and, with a standby, its copy; nil if the cluster never
	// settled.
	copies []keyCopy
	// peak is, for an edge key, the most allowed calls that were
	// certainly decided within one window (see windowPeak).
	peak      int64
	peakCalls []call
	// slack is the excess the scenario documents (scenario.extraLimits).
	slack int64
	// early counts the key's denials made while it was certainly below
	// its limit (earlyDenials).
	early int
	// short is the most acknowledged hits a decision of the key did not
	// count (decidedShort), and shortAt that decision.
	short      int64
	shortAt    string
	failing    time.Duration // time covered by its failed calls
	unanswered time.Duration // time some client went without an answer
}

// inWindow is the most hits allowed within one window of the key: all of
// them for a key whose window is longer than the scenario, the peak for
// an edge key.
func (r *keyResult) inWindow() int64 {
	if r.key.kind == edgeKey {
		return r.peak
	}
	return r.allowed
}

// over is by how many hits a limited key went over its limit.
func (r *keyResult) over() int64 {
	if !r.key.limited() {
		return 0
	}
	return max(0, r.inWindow()-r.key.limit-r.slack)
}

// windowPeak returns the most allowed calls of calls that were certainly
// decided within one window: a set of calls such that the last reply and
// the first send lie less than the window (less the clock margin) apart,
// whenever within its call each was decided. For each call in order of
// sending, it takes the calls sent no earlier that replied soonest.
func windowPeak(calls []call, window time.Duration) int64 {
	n, _ := windowPeakAt(calls, window)
	return n
}

// windowPeakAt is windowPeak, and the calls of the peak, in order of
// sending.
func windowPeakAt(calls []call, window time.Duration) (int64, []call) {
	var ok []call
	for _, c := range calls {
		if c.outcome == allowed {
			ok = append(ok, c)
		}
	}
	slices.SortFunc(ok, func(a, b call) int { return a.sent.Compare(b.sent) })
	var best []call
	for i := range ok {
		var in []call
		for _, c := range ok[i:] {
			if c.sent.Sub(ok[i].sent) >= window {
				break // sent in order: no later call can reply in time
			}
			if c.replied.Sub(ok[i].sent) < window-clockMargin {
				in = append(in, c)
			}
		}
		if len(in) > len(best) {
			best = in
		}
	}
	return int64(len(best)), best
}

// describeCalls lists calls as "node [sent, replied] ms" from the first's
// send, with its wall time.
func describeCalls(calls []call) string {
	if len(calls) == 0 {
		return "none"
	}
	t0 := calls[0].sent
	var parts []string
	for _, c := range calls {
		parts = append(parts, fmt.Sprintf("%s (client of n%d) [%.1f, %.1f]", c.node, c.client+1,
			float64(c.sent.Sub(t0).Microseconds())/1000, float64(c.replied.Sub(t0).Microseconds())/1000))
	}
	return fmt.Sprintf("from %s: %s ms", t0.Format("15:04:05.000"), strings.Join(parts, ", "))
}

// s2Checked reports whether the key's copies are held against the ledger:
// always for ledger keys; for limited and fresh keys unless they went over
// their limit (a log keeps only its newest limit+1 hits, and the excess is
// the finding); never for edge keys, whose hits expire within seconds.
func (r *keyResult) s2Checked() bool {
	return r.copies != nil && r.over() == 0 && r.key.kind != edgeKey
}

// lost is the most acknowledged hits any copy of the key lacks at some
// instant (0 if not checked). A copy of a limited key that holds more than
// its limit keeps only its newest limit+1 hits: its older ones are not
// lost, only not kept, so it is not checked for losses (the excess is).
func (r *keyResult) lost() (int64, string) {
	var worst int64
	var where string
	if r.s2Checked() {
		for _, c := range r.copies {
			if r.key.limited() && c.used > r.key.limit {
				continue
			}
			if c.s2.lost > worst {
				worst, where = c.s2.lost, fmt.Sprintf("%s at %s", c.what, c.s2.lostAt.Format("15:04:05.000"))
			}
		}
	}
	return worst, where
}

// shortChecked reports whether a decision of the key counted fewer hits
// than were acknowledged before it, where that is a failure: not where
// the scenario documents an excess (a key decided from nothing).
func (r *keyResult) shortChecked() bool { return r.short > 0 && r.slack == 0 }

// overCounted is the most hits any copy holds at some instant beyond the
// calls that could have recorded them (0 if not checked).
func (r *keyResult) overCounted() (int64, string) {
	var worst int64
	var where string
	if r.s2Checked() {
		for _, c := range r.copies {
			if c.s2.over > worst {
				worst, where = c.s2.over, fmt.Sprintf("%s at %s", c.what, c.s2.overAt.Format("15:04:05.000"))
			}
		}
	}
	return worst, where
}

// ledger sums each key's calls and holds each of its copies against them.
// end is when the load stopped.
func ledger(keys []testKey, calls []call, copies [][]keyCopy, end, lostBefore time.Time) []keyResult {
	results := make([]keyResult, len(keys))
	byKey := make([][]call, len(keys))
	for _, c := range calls {
		byKey[c.key] = append(byKey[c.key], c)
	}
	for i, k := range keys {
		r := &results[i]
		*r = keyResult{key: k, allowedBy: map[string]int{}, calls: len(byKey[i]), callsOf: byKey[i]}
		for _, c := range byKey[i] {
			switch {
			case c.outcome == allowed:
				r.allowed++
				r.allowedBy[c.node]++
			case c.ambiguous():
				r.ambiguous++
			}
		}
		r.overlaps = s1Overlaps(byKey[i])
		if k.kind == edgeKey {
			r.peak, r.peakCalls = windowPeakAt(byKey[i], k.window)
		}
		if k.limited() {
			r.early = earlyDenials(byKey[i], k)
		}
		s2calls := byKey[i]
		if !lostBefore.IsZero() {
			s2calls = mayBeLost(s2calls, lostBefore)
		}
		r.short, r.shortAt = decidedShort(s2calls, k)
		if copies != nil {
			s2calls := byKey[i]
			if !lostBefore.IsZero() {
				s2calls = mayBeLost(s2calls, lostBefore)
			}
			for _, cp := range copies[i] {
				cp.s2 = checkS2(k, s2calls, cp.runs)
				r.copies = append(r.copies, cp)
			}
		}
		r.failing, r.unanswered = unavailable(byKey[i], end)
	}
	return results
}

// earlyDenials counts the denials of k's calls made while k was certainly
// below its limit: fewer calls than the limit were allowed or may have
// recorded a hit and could fall in the window that ends at the denial
// (sent before the denied call was answered, answered after its send less
// a window). Counting hits twice (a state added up from two histories, a
// late copy applied again) shows here; so do the denials of a forgotten
// member's keys, which deny on purpose.
func earlyDenials(calls []call, k testKey) int {
	var hits []call
	for _, c := range calls {
		if c.outcome == allowed || c.ambiguous() {
			hits = append(hits, c)
		}
	}
	slices.SortFunc(hits, func(a, b call) int { return a.sent.Compare(b.sent) })
	// A hit sent more than a window and the longest call before a denial
	// cannot fall in its window: the scan starts there.
	var longest time.Duration
	for _, h := range hits {
		longest = max(longest, h.replied.Sub(h.sent))
	}
	n := 0
	for _, c := range calls {
		if c.outcome != denied {
			continue
		}
		from, _ := slices.BinarySearchFunc(hits, c.sent.Add(-k.window-longest-clockMargin), func(h call, t time.Time) int { return h.sent.Compare(t) })
		var possible int64
		for _, h := range hits[from:] {
			if h.sent.After(c.replied.Add(clockMargin)) {
				break
			}
			if h.replied.Add(k.window + clockMargin).After(c.sent) {
				possible++
			}
		}
		if possible < k.limit {
			n++
		}
	}
	return n
}

// decidedShort holds every decision of k, made while the load ran, to the
// hits acknowledged before it: a decision's remaining tells how many hits
// its state counted in its window (limit − remaining, its own included
// when allowed), and that must be at least the calls allowed and answered
// before the decided call was sent that were certainly decided within the
// window before it (sent less than a window before the decided call was
// answered; every one, for a window longer than the run). A decider that
// worked from a copy lacking acknowledged hits shows here at the moment
// it decided, whatever a later handoff or merge repairs. It returns the
// largest shortfall and the decision it was found at. A decision at or
// over the limit (remaining 0) only says its state counted at least the
// limit.
func decidedShort(calls []call, k testKey) (int64, string) {
	var acked []call
	for _, c := range calls {
		if c.outcome == allowed {
			acked = append(acked, c)
		}
	}
	slices.SortFunc(acked, func(a, b call) int { return a.replied.Compare(b.replied) })
	var longest time.Duration
	for _, h := range acked {
		longest = max(longest, h.replied.Sub(h.sent))
	}
	var worst int64
	var at string
	for _, c := range calls {
		if c.outcome == failed {
			continue
		}
		// The acknowledged calls answered before c was sent, then those
		// of them sent within the window before c was answered: scanned
		// back from the newest, no further than the longest call.
		n, _ := slices.BinarySearchFunc(acked, c.sent.Add(-clockMargin), func(h call, t time.Time) int {
			if h.replied.Before(t) {
				return -1
			}
			return 1
		})
		from := c.replied.Add(-k.window + clockMargin)
		want := int64(n)
		if len(acked) > 0 && !acked[0].sent.After(from) {
			want = 0 // the window is shorter than the run: count within it
			for j := n - 1; j >= 0 && acked[j].replied.Add(longest).After(from); j-- {
				if acked[j].sent.After(from) {
					want++
				}
			}
		}
		before := want
		if c.outcome == allowed {
			want++
		}
		counted := k.limit - c.remaining
		if c.remaining == 0 {
			counted = max(counted, want) // at the limit: it counted at least the limit
		}
		if short := want - counted; short > worst {
			worst = short
			at = fmt.Sprintf("%s by %s (client of %s) sent %s, answered %.1f ms later: counted %d, %d acknowledged before it in its window",
				[...]string{"allowed", "denied"}[c.outcome], c.node, fmt.Sprint("n", c.client+1), c.sent.Format("15:04:05.000"), float64(c.replied.Sub(c.sent).Microseconds())/1000, counted, before)
		}
	}
	return worst, at
}

// mayBeLost returns calls with those allowed and answered before
// lostBefore turned into calls that may have recorded their hit: their
// only copy was on a node forgotten with its disk, so S2 holds the copies
// to them only as possible hits, not acknowledged ones.
func mayBeLost(calls []call, lostBefore time.Time) []call {
	out := slices.Clone(calls)
	for i := range out {
		if out[i].outcome == allowed && out[i].replied.Before(lostBefore) {
			out[i].outcome, out[i].maybe = failed, true
		}
	}
	return out
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

// report is what one scenario cost and checked: one row of the suite's
// table.
type report struct {
	ran      bool   // whether the scenario ran (-run may leave it out)
	name     string // the subtest's name
	event    string // what happened, for the table
	measured bool   // false if the scenario ended before its ledger
	known    bool   // whether the cluster settled, so that copies were read
	checked  []string
	calls    int
	// Limited keys over their limit, and the worst of them.
	limitedKeys, overKeys int
	worst                 keyResult
	// Keys with evidence of two deciders at once, and the first evidence.
	s1Keys  int
	s1First string
	// Keys whose copies lack acknowledged hits, or hold hits beyond the
	// ambiguous calls, and the worst count of each.
	lostKeys, overCountKeys   int
	worstLost, worstOverCount int64
	// Keys denied while certainly below their limit, and those denials.
	earlyKeys, earlyDenials int
	// What the check of the suite before would have said: keys whose
	// count is short of their acknowledged hits in total.
	oldLostKeys    int
	failing        spread // over keys: time covered by failed calls
	unanswered     spread // over keys: time some client had no answer
	errorsByCode   map[codes.Code]int
	firstErrByCode map[codes.Code]string
	failed         bool // the row's checks failed
}

// newReport sums the ledger of a scenario.
func newReport(name, event string, calls []call, results []keyResult, known bool, checked []string) report {
	r := report{name: name, event: event, measured: true, known: known, checked: checked, calls: len(calls),
		errorsByCode: map[codes.Code]int{}, firstErrByCode: map[codes.Code]string{}}
	var failing, unanswered []time.Duration
	for i := range results {
		k := &results[i]
		failing = append(failing, k.failing)
		unanswered = append(unanswered, k.unanswered)
		if k.key.limited() {
			r.limitedKeys++
			if k.over() > 0 {
				r.overKeys++
			}
			if k.inWindow()-k.key.limit > r.worst.inWindow()-r.worst.key.limit || r.worst.key.name == "" {
				r.worst = *k
			}
		}
		if len(k.overlaps) > 0 {
			if r.s1Keys == 0 {
				r.s1First = fmt.Sprintf("%s: %v", k.key.name, k.overlaps[0])
			}
			r.s1Keys++
		}
		lost, _ := k.lost()
		if k.shortChecked() {
			lost = max(lost, k.short)
		}
		if lost > 0 {
			r.lostKeys++
			r.worstLost = max(r.worstLost, lost)
		}
		if k.early > 0 {
			r.earlyKeys++
			r.earlyDenials += k.early
		}
		if over, _ := k.overCounted(); over > 0 {
			r.overCountKeys++
			r.worstOverCount = max(r.worstOverCount, over)
		}
		if k.key.kind == ledgerKey && len(k.copies) > 0 && oldLost(k.allowed, k.copies[0].used) > 0 {
			r.oldLostKeys++
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

// tableHeader heads the suite's table, in the shape of docs/cluster.md's
// "What each failure costs"; each report is one row.
const tableHeader = "| event | checked | keys over their limit (worst allowed/limit) | keys decided by two nodes at once | " +
	"acknowledged hits lost (keys, worst) | hits counted beyond the ambiguous calls (keys, worst) | " +
	"keys denied below their limit (reported, not failed) | " +
	"s refused per key: failed calls (max / median) | s until answered again (max / median) | errors by code |\n" +
	"|---|---|---|---|---|---|---|---|---|---|"

// row formats the report as a markdown table row.
func (r report) row() string {
	event := r.event
	if r.failed {
		event += " **(failed)**"
	}
	checked := strings.Join(r.checked, "; ")
	if !r.measured {
		return fmt.Sprintf("| %s | %s | not measured | not measured | not measured | not measured | not measured | not measured | not measured | not measured |", event, checked)
	}
	over := fmt.Sprintf("%d of %d", r.overKeys, r.limitedKeys)
	if r.worst.key.name != "" {
		over += fmt.Sprintf(" (%d/%d)", r.worst.inWindow(), r.worst.key.limit)
	}
	lost, counted := "unknown: not settled", "unknown: not settled"
	if r.known {
		lost, counted = "0", "0"
		if r.lostKeys > 0 {
			lost = fmt.Sprintf("%d keys, worst %d", r.lostKeys, r.worstLost)
		}
		if r.overCountKeys > 0 {
			counted = fmt.Sprintf("%d keys, worst %d", r.overCountKeys, r.worstOverCount)
		}
	}
	early := "0"
	if r.earlyKeys > 0 {
		early = fmt.Sprintf("%d keys, %d denials", r.earlyKeys, r.earlyDenials)
	}
	return fmt.Sprintf("| %s | %s | %s | %d | %s | %s | %s | %v | %v | %s |",
		event, checked, over, r.s1Keys, lost, counted, early, r.failing, r.unanswered, r.errorSummary())
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
		if r.ran {
			lines = append(lines, r.row())
		}
	}
	return strings.Join(lines, "\n")
}

// checkResults fails the test for every limited key that allowed more
// than its limit, every key two nodes decided at once, and every copy of
// a key that lacks acknowledged hits or holds hits no call could have
// recorded, saying what the cluster holds.
func checkResults(t *testing.T, results []keyResult) {
	t.Helper()
	for i := range results {
		k := &results[i]
		if k.over() > 0 {
			t.Errorf("%s: %d hits allowed within the window (%s in the whole run); limit %d; %s",
				k.key.name, k.inWindow(), describeAllowedBy(k.allowedBy), k.key.limit, describeCopies(k.copies))
			if k.key.kind == edgeKey {
				t.Logf("%s: the allowed calls of its fullest window: %s", k.key.name, describeCalls(k.peakCalls))
			}
		}
		if len(k.overlaps) > 0 {
			t.Errorf("%s: decided by two nodes at once (S1), %d times; first: %v", k.key.name, len(k.overlaps), k.overlaps[0])
		}
		if k.shortChecked() {
			t.Errorf("%s: a decision counted %d acknowledged hits fewer than were acknowledged before it (S2, while the load ran): %s; %s",
				k.key.name, k.short, k.shortAt, describeAllowedBy(k.allowedBy))
		}
		if lost, where := k.lost(); lost > 0 {
			t.Errorf("%s: %d acknowledged hits missing from %s (S2); %d acknowledged in all (%s), %d ambiguous; %s",
				k.key.name, lost, where, k.allowed, describeAllowedBy(k.allowedBy), k.ambiguous, describeCopies(k.copies))
		}
		if over, where := k.overCounted(); over > 0 {
			t.Errorf("%s: %d hits in %s beyond the calls that could have recorded them (S2); %d acknowledged, %d ambiguous; %s; around that instant: %s",
				k.key.name, over, where, k.allowed, k.ambiguous, describeCopies(k.copies), k.around(k.worstOverAt()))
		}
	}
}

// describeCopies says what each copy of a key holds.
func describeCopies(copies []keyCopy) string {
	if copies == nil {
		return "the cluster did not settle"
	}
	var parts []string
	for _, c := range copies {
		parts = append(parts, fmt.Sprintf("%s counts %d", c.what, c.used))
	}
	return strings.Join(parts, ", ")
}

// worstOverAt is the instant of the largest excess of any copy.
func (r *keyResult) worstOverAt() time.Time {
	var worst s2
	for _, c := range r.copies {
		if c.s2.over > worst.over {
			worst = c.s2
		}
	}
	return worst.overAt
}

// around lists, for a closer look, the key's failed calls by what they
// said, then its calls and the runs of its first copy within the
// resolution and 150 ms before at.
func (r *keyResult) around(at time.Time) string {
	from := at.Add(-r.key.resolution() - 150*time.Millisecond)
	var parts []string
	failures := map[string]int{}
	for _, c := range r.callsOf {
		if c.outcome == failed {
			failures[fmt.Sprintf("%v %s, may have recorded: %v", c.code, c.reason, c.maybe)]++
		}
	}
	for _, f := range slices.Sorted(maps.Keys(failures)) {
		parts = append(parts, fmt.Sprintf("%d failed (%s)", failures[f], f))
	}
	for _, c := range r.callsOf {
		if c.sent.Before(from) || c.sent.After(at) {
			continue
		}
		what := [...]string{"allowed by " + c.node, "denied by " + c.node, fmt.Sprintf("failed (%v %s, may have recorded: %v)", c.code, c.reason, c.maybe)}[c.outcome]
		parts = append(parts, fmt.Sprintf("call %s–%s %s", c.sent.Format("05.000"), c.replied.Format("05.000"), what))
	}
	if len(r.copies) > 0 {
		for _, h := range r.copies[0].runs {
			if !h.at.Before(from) && !h.at.After(at) {
				parts = append(parts, fmt.Sprintf("run %s ×%d", h.at.Format("05.000"), h.n))
			}
		}
	}
	return strings.Join(parts, "; ")
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

// TestCheckS2: a copy of a key passes when it holds every acknowledged hit
// and no hit beyond the calls that may have recorded one, at every
// instant; it fails on a lost hit, even when a hit that was recorded but
// not acknowledged makes up for it in the total (which the check before,
// oldLost, let pass), and on a hit no call could have recorded.
func TestCheckS2(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	exact := testKey{name: "exact", kind: ledgerKey, limit: 500, window: time.Hour}
	rounded := testKey{name: "rounded", kind: ledgerKey, limit: ledgerLimit, window: ledgerWindow}
	// ok is a call allowed at s seconds; amb one that failed and may have
	// recorded; refused one that failed and recorded nothing.
	ok := func(s float64) call { return call{sent: at(s), replied: at(s + 0.001), outcome: allowed} }
	amb := func(s float64) call { return call{sent: at(s), replied: at(s + 0.5), outcome: failed, maybe: true} }
	refused := func(s float64) call { return call{sent: at(s), replied: at(s + 0.001), outcome: failed} }
	hits := func(times ...float64) []hitRun {
		var out []hitRun
		for _, s := range times {
			out = append(out, hitRun{at(s), 1})
		}
		return out
	}
	// Ten calls allowed at 1..10 s, decided a moment after they were sent.
	var ten []call
	var tenHits []float64
	for i := 1; i <= 10; i++ {
		ten = append(ten, ok(float64(i)))
		tenHits = append(tenHits, float64(i)+0.0005)
	}
	without5 := slices.DeleteFunc(slices.Clone(tenHits), func(s float64) bool { return s == 5.0005 })
	for _, tc := range []struct {
		name             string
		key              testKey
		calls            []call
		runs             []hitRun
		wantLost         int64
		wantOver         int64
		wantOldLostSaid0 bool // the check before saw no loss
	}{
		{"every hit held", exact, ten, hits(tenHits...), 0, 0, true},
		{"a hit lost", exact, ten, hits(without5...), 1, 0, false},
		{"a lost hit made up for by an unacknowledged one", exact, append(slices.Clone(ten), amb(20)), hits(append(without5, 20.1)...), 1, 0, true},
		{"an unacknowledged hit recorded", exact, append(slices.Clone(ten), amb(20)), hits(append(slices.Clone(tenHits), 20.1)...), 0, 0, true},
		{"an unacknowledged hit not recorded", exact, append(slices.Clone(ten), amb(20)), hits(tenHits...), 0, 0, true},
		{"a hit recorded by a refusal that said it recorded nothing", exact, append(slices.Clone(ten), refused(20)), hits(append(slices.Clone(tenHits), 20.0005)...), 0, 1, true},
		{"a hit nobody sent", exact, ten, hits(append(slices.Clone(tenHits), 30)...), 0, 1, true},
		{"a hit counted twice", exact, ten, append(hits(tenHits...), hitRun{at(3.0005), 1}), 0, 1, true},
		{"a hit moved earlier than its call", exact, ten, hits(append(without5, 0.5)...), 0, 1, true},
		{"rounded up to the resolution", rounded, ten, func() []hitRun {
			// The node rounds a hit's time up to a multiple of the
			// resolution since the epoch.
			res := int64(rounded.resolution())
			var out []hitRun
			for _, s := range tenHits {
				ns := at(s).UnixNano()
				out = append(out, hitRun{time.Unix(0, (ns+res-1)/res*res), 1})
			}
			return out
		}(), 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkS2(tc.key, tc.calls, tc.runs)
			if got.lost != tc.wantLost || got.over != tc.wantOver {
				t.Errorf("checkS2 = %d lost, %d over; want %d lost, %d over", got.lost, got.over, tc.wantLost, tc.wantOver)
			}
			var allowedHits, used int64
			for _, c := range tc.calls {
				if c.outcome == allowed {
					allowedHits++
				}
			}
			for _, r := range tc.runs {
				used += r.n
			}
			if saw0 := oldLost(allowedHits, used) == 0; saw0 != tc.wantOldLostSaid0 {
				t.Errorf("oldLost(%d allowed, %d used) = %d; want it to say 0: %v", allowedHits, used, oldLost(allowedHits, used), tc.wantOldLostSaid0)
			}
		})
	}
}

// TestWindowPeak: the peak of an edge key counts the allowed calls that
// were decided within one window whenever within their calls they were
// decided, and no call that might have been decided outside it.
func TestWindowPeak(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))) }
	c := func(sent, replied float64, o outcome) call {
		return call{sent: at(sent), replied: at(replied), outcome: o}
	}
	const w = 2 * time.Second
	for _, tc := range []struct {
		name  string
		calls []call
		want  int64
	}{
		{"none", nil, 0},
		{"within a window", []call{c(0, 0.01, allowed), c(0.5, 0.51, allowed), c(1.9, 1.91, allowed)}, 3},
		{"denied and failed calls do not count", []call{c(0, 0.01, allowed), c(0.5, 0.51, denied), c(1, 1.01, failed)}, 1},
		{"a reply a window after the first send", []call{c(0, 0.01, allowed), c(1.9, 2.1, allowed), c(1, 1.01, allowed)}, 2},
		{"a sliding window, not a fixed one", []call{c(0, 0.01, allowed), c(1.5, 1.51, allowed), c(2.5, 2.51, allowed), c(3, 3.01, allowed), c(3.4, 3.41, allowed)}, 4},
		{"a slow call spans the window", []call{c(0, 2.5, allowed), c(1, 1.01, allowed), c(1.5, 1.51, allowed)}, 2},
	} {
		if got := windowPeak(tc.calls, w); got != tc.want {
			t.Errorf("%s: windowPeak = %d; want %d", tc.name, got, tc.want)
		}
	}
}

// TestEarlyDenials: a denial counts as early only when fewer calls than
// the limit could have recorded a hit in the window that ends at it.
func TestEarlyDenials(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))) }
	c := func(sent, replied float64, o outcome, maybe bool) call {
		return call{sent: at(sent), replied: at(replied), outcome: o, maybe: maybe}
	}
	k := testKey{name: "k", kind: edgeKey, limit: 2, window: 2 * time.Second}
	for _, tc := range []struct {
		name  string
		calls []call
		want  int
	}{
		{"denied at the limit", []call{c(0, 0.01, allowed, false), c(0.5, 0.51, allowed, false), c(1, 1.01, denied, false)}, 0},
		{"denied below it", []call{c(0, 0.01, allowed, false), c(1, 1.01, denied, false)}, 1},
		{"an ambiguous call may have recorded", []call{c(0, 0.01, allowed, false), c(0.2, 0.3, failed, true), c(1, 1.01, denied, false)}, 0},
		{"a refused call recorded nothing", []call{c(0, 0.01, allowed, false), c(0.2, 0.3, failed, false), c(1, 1.01, denied, false)}, 1},
		{"hits out of the window do not count", []call{c(0, 0.01, allowed, false), c(0.5, 0.51, allowed, false), c(3, 3.01, denied, false)}, 1},
		{"a hit sent after the denial's answer does not count", []call{c(0, 0.01, allowed, false), c(1, 1.01, denied, false), c(1.5, 1.51, allowed, false)}, 1},
	} {
		if got := earlyDenials(tc.calls, k); got != tc.want {
			t.Errorf("%s: earlyDenials = %d; want %d", tc.name, got, tc.want)
		}
	}
}

// TestDecidedShort: a decision must count every hit acknowledged before
// its call was sent, its own too when allowed; one at the limit counts at
// least the limit.
func TestDecidedShort(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))) }
	c := func(sent, replied float64, o outcome, remaining int64) call {
		return call{sent: at(sent), replied: at(replied), outcome: o, remaining: remaining, node: "n1"}
	}
	k := testKey{name: "k", kind: ledgerKey, limit: 10, window: time.Hour}
	for _, tc := range []struct {
		name  string
		calls []call
		want  int64
	}{
		{"every decision counts what came before", []call{c(0, 0.1, allowed, 9), c(1, 1.1, allowed, 8), c(2, 2.1, denied, 8)}, 0},
		{"a decision from a state one hit short", []call{c(0, 0.1, allowed, 9), c(1, 1.1, allowed, 8), c(2, 2.1, allowed, 8)}, 1},
		{"a hit answered after the send need not count", []call{c(0, 0.5, allowed, 9), c(0.2, 0.3, allowed, 9)}, 0},
		{"a failed call counts for nothing", []call{c(0, 0.1, failed, 0), c(1, 1.1, allowed, 9)}, 0},
		{"at the limit", []call{c(0, 0.1, allowed, 0), c(1, 1.1, denied, 0)}, 0},
	} {
		if got, where := decidedShort(tc.calls, k); got != tc.want {
			t.Errorf("%s: decidedShort = %d (%s); want %d", tc.name, got, where, tc.want)
		}
	}
}
