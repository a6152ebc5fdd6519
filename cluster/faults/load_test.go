//go:build linux

package faults

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicecluster "github.com/sluice-io/sluice/cluster"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
	"github.com/sluice-io/sluice/shard"
)

// keyKind says what a key of a scenario is for.
type keyKind uint8

const (
	// limitedKey reaches its limit within the first second of load and must
	// then be denied for the rest of the hour: a node that decides it from
	// lost or reset state allows it again.
	limitedKey keyKind = iota
	// freshKey enters the load only when the fault is injected, paced to
	// reach its limit only after the fault has healed: while the fault
	// lasts it is allowed, so two nodes deciding it at once both allow it,
	// and its copies diverge.
	freshKey
	// ledgerKey is never denied: its count is the hits the cluster
	// recorded, to hold against what its clients were told.
	ledgerKey
	// edgeKey has a window of 2 s and a limit below what the load asks of
	// it in a window (staggered from 6 to 13 against about 14 asked): from
	// its first seconds on it is always within a few hits of its limit,
	// through every fault and handover. A second decider, or a decision
	// from a state short by a hit, shows as more than its limit allowed in
	// one window.
	edgeKey
)

func (k keyKind) String() string {
	switch k {
	case limitedKey:
		return "limited"
	case freshKey:
		return "fresh"
	case edgeKey:
		return "edge"
	}
	return "ledger"
}

// The keys of a scenario.
const (
	keysPerKind   = 16
	limitedLimit  = 40
	limitedWindow = time.Hour
	freshWindow   = time.Hour
	ledgerLimit   = 1_000_000_000
	// ledgerWindow is long enough that no hit expires before the ledger is
	// read (a scenario lasts a few minutes at most, settling included) and
	// short enough that the log's resolution is fine: with a limit above
	// maxLogRuns the node rounds hit times up to window/maxLogRuns, 600 ms.
	ledgerWindow = 10 * time.Minute
	// maxLogRuns is the nodes' actor.Config.MaxLogRuns (its default, which
	// sluice serve does not change).
	maxLogRuns = 1000
	// edgeWindow is the window of the edge keys; their limits run from
	// edgeLimitMin up, two keys a limit.
	edgeWindow   = 2 * time.Second
	edgeLimitMin = 6
)

// testKey is a key the load checks, with its limit per window.
type testKey struct {
	name   string
	kind   keyKind
	limit  int64
	window time.Duration
}

// limited reports whether the key is meant to reach its limit: limited,
// fresh and edge keys.
func (k testKey) limited() bool { return k.kind != ledgerKey }

// resolution is the granularity of the times the node records k's hits
// at: 0 for an exact log.
func (k testKey) resolution() time.Duration {
	if k.limit <= maxLogRuns {
		return 0
	}
	res := k.window / maxLogRuns
	if k.window%maxLogRuns != 0 {
		res++
	}
	return res
}

// scenarioKeys returns the limited keys, then the fresh ones (with limit
// freshLimit), then the ledger keys. With keep, each name is chosen among
// "kind:NN.J" (the first J that fits) so that keep holds for the key's
// rendezvous order over names (its owner first, its standby next).
func scenarioKeys(names []string, freshLimit int64, keep func(order []string) bool) []testKey {
	var keys []testKey
	for _, kind := range []keyKind{limitedKey, freshKey, ledgerKey, edgeKey} {
		for i := range keysPerKind {
			k := testKey{name: fmt.Sprintf("%v:%02d", kind, i), kind: kind}
			switch kind {
			case limitedKey:
				k.limit, k.window = limitedLimit, limitedWindow
			case freshKey:
				k.limit, k.window = freshLimit, freshWindow
			case edgeKey:
				k.limit, k.window = edgeLimitMin+int64(i/2), edgeWindow
			default:
				k.limit, k.window = ledgerLimit, ledgerWindow
			}
			for j := 0; keep != nil && !keep(rendezvous(k.name, names)); j++ {
				if j == 100_000 {
					panic(fmt.Sprintf("faults: no key %v:%02d.J fits the scenario's owners", kind, i))
				}
				k.name = fmt.Sprintf("%v:%02d.%d", kind, i, j)
			}
			keys = append(keys, k)
		}
	}
	return keys
}

// rendezvous returns names in key's rendezvous order, as package shard
// ranks owners: the highest score first. With every node up and owning
// keys, the first is the key's owner and the second its standby.
func rendezvous(key string, names []string) []string {
	kh := shard.Hash(key)
	order := slices.Clone(names)
	slices.SortFunc(order, func(a, b string) int {
		return cmp.Compare(shard.Score(kh, shard.NodeHash(b)), shard.Score(kh, shard.NodeHash(a)))
	})
	return order
}

// check is a sliding-log check of cost hits on k; cost 0 peeks.
func (k testKey) check(cost int64) *sluicepb.Check {
	return &sluicepb.Check{
		Key:       []byte(k.name),
		Limit:     k.limit,
		Window:    durationpb.New(k.window),
		Algorithm: sluicepb.Algorithm_ALGORITHM_SLIDING_LOG,
		Cost:      proto.Int64(cost),
	}
}

// loadConfig shapes the load of a scenario.
type loadConfig struct {
	// rate is the calls per second on limited and ledger keys, of all
	// callers together, from the start.
	rate float64
	// edgeRate is the calls per second on edge keys, of edgeCallers per
	// client, from the start.
	edgeRate    float64
	edgeCallers int
	// freshRate is the calls per second on fresh keys, of all fresh
	// callers together, from the moment they enter.
	freshRate float64
	// callers and freshCallers are the caller goroutines per client.
	callers, freshCallers int
	// deadline bounds each call.
	deadline time.Duration
	// maxCalls bounds the calls of each caller.
	maxCalls int
}

// defaultLoad is about 800 checks/s on limited and ledger keys (25 a
// second on each), 240 on fresh keys (15 a second on each) once they
// enter, and 112 on edge keys (7 a second on each, 14 a window against
// limits of 6 to 13): enough that a second decider of a key would alternate with the
// first every few tens of milliseconds, little enough that two
// scenarios' nodes and the test share two cores.
func defaultLoad() loadConfig {
	return loadConfig{rate: 800, freshRate: 240, callers: 16, freshCallers: 6, edgeRate: 7 * keysPerKind, edgeCallers: 2,
		deadline: time.Second, maxCalls: 50_000}
}

// freshLimit is the limit of the fresh keys: the hits each gets in the
// fault's length and a second more, at the configured pace times kept
// (the fraction of its pace the load keeps on a busy machine), so that it
// is under its limit while the fault lasts. Once the fault has healed the
// fresh keys go three times as fast (boostFresh), and reach it soon
// after. It stays at most maxLogRuns, so that the log is exact.
func (cfg loadConfig) freshLimit(fault time.Duration, kept float64) int64 {
	perKey := cfg.freshRate / keysPerKind
	return max(1, min(maxLogRuns, int64(math.Ceil(kept*perKey*(fault+time.Second).Seconds()))))
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
	remaining     int64      // allowed or denied: the decision's remaining
	code          codes.Code // failed: the call's status
	msg           string     // failed: the status message
	reason        string     // failed: the ErrorInfo's reason, if any
	// maybe is set for a failed call that may have recorded its hit: any
	// failure but an UNAVAILABLE whose ErrorInfo says recorded "no" (a
	// deadline, a broken connection, a standby that did not confirm...).
	maybe bool
}

// ambiguous reports whether the call failed and may have recorded its hit.
func (c *call) ambiguous() bool { return c.outcome == failed && c.maybe }

// load is callers checking keys through every node's client until stopped.
type load struct {
	cfg       loadConfig
	keys      []testKey
	stop      chan struct{}
	fresh     chan struct{} // closed when the fresh keys enter
	boost     chan struct{} // closed when the fault has healed
	freshOnce sync.Once
	boostOnce sync.Once
	freshAt   time.Time
	sent      atomic.Int64 // calls sent on limited and ledger keys
	// limited[i] is set once key i was denied (for fresh keys: reached
	// their limit).
	limited    []atomic.Bool
	wg         sync.WaitGroup
	start, end time.Time
	calls      [][]call // one history per caller, written by that caller only
}

// startLoad starts cfg.callers callers on each node's client, each pacing
// its calls so that all of them together send about cfg.rate calls per
// second on limited and ledger keys picked at random, and cfg.freshCallers
// that do the same at cfg.freshRate on fresh keys once startFresh is
// called. A caller that falls behind skips ticks rather than bursting; a
// caller whose node was not started yet sends nothing.
func startLoad(nodes []*node, keys []testKey, cfg loadConfig) *load {
	l := &load{cfg: cfg, keys: keys, stop: make(chan struct{}), fresh: make(chan struct{}), boost: make(chan struct{}), start: time.Now(),
		limited: make([]atomic.Bool, len(keys))}
	var base, fresh, edge []int
	for i, k := range keys {
		switch k.kind {
		case freshKey:
			fresh = append(fresh, i)
		case edgeKey:
			edge = append(edge, i)
		default:
			base = append(base, i)
		}
	}
	type group struct {
		pick    []int
		callers int
		rate    float64
		gate    <-chan struct{} // closed when the group starts
		boost   <-chan struct{} // closed when it triples its pace
		sent    *atomic.Int64
	}
	opened := make(chan struct{})
	close(opened)
	groups := []group{{base, cfg.callers, cfg.rate, opened, nil, &l.sent}}
	if len(fresh) > 0 && cfg.freshCallers > 0 {
		groups = append(groups, group{fresh, cfg.freshCallers, cfg.freshRate, l.fresh, l.boost, nil})
	}
	if len(edge) > 0 && cfg.edgeCallers > 0 {
		groups = append(groups, group{edge, cfg.edgeCallers, cfg.edgeRate, opened, nil, nil})
	}
	total := 0
	for _, g := range groups {
		total += g.callers * len(nodes)
	}
	l.calls = make([][]call, total)
	slot := 0
	for _, g := range groups {
		total := g.callers * len(nodes)
		interval := time.Duration(float64(total) / g.rate * float64(time.Second))
		for i := range total {
			mine := slot
			slot++
			l.wg.Go(func() {
				client := i % len(nodes)
				select {
				case <-g.gate:
				case <-l.stop:
					return
				}
				l.calls[mine] = runCaller(nodes[client], client, keys, g.pick, interval, g.boost, g.sent, l.limited, cfg, l.stop)
			})
		}
	}
	return l
}

// startFresh sets the fresh keys' limit for a fault of length fault (see
// freshLimit), from the pace the load has kept so far, and lets them enter
// the load.
func (l *load) startFresh(fault time.Duration) {
	l.freshOnce.Do(func() {
		l.freshAt = time.Now()
		// A busy machine keeps a fraction of the pace asked for; the fresh
		// keys will keep about the same.
		kept := float64(l.sent.Load()) / (l.cfg.rate * l.freshAt.Sub(l.start).Seconds())
		kept = min(1, max(0.2, kept))
		limit := l.cfg.freshLimit(fault, kept)
		for i := range l.keys {
			if l.keys[i].kind == freshKey {
				l.keys[i].limit = limit
			}
		}
		close(l.fresh)
	})
}

// boostFresh triples the pace of the fresh keys, once the fault has
// healed, so that they reach their limit soon after.
func (l *load) boostFresh() { l.boostOnce.Do(func() { close(l.boost) }) }

// waitFresh waits until every fresh key was denied once (it reached its
// limit), or deadline.
func (l *load) waitFresh(deadline time.Time) {
	_ = testkit.Wait(time.Until(deadline), func() error { // the proof judges what the keys reached
		for i, k := range l.keys {
			if k.kind == freshKey && !l.limited[i].Load() {
				return fmt.Errorf("fresh key %d not limited yet", i)
			}
		}
		return nil
	})
}

// runCaller sends one check every interval through n's client, on a key
// of pick, until stop closes or it has sent cfg.maxCalls, and returns what
// it was told. Once boost closes (if not nil), it calls three times as
// often. It counts its calls in sent (if not nil), and sets limited[key]
// when a key is denied.
func runCaller(n *node, client int, keys []testKey, pick []int, interval time.Duration, boost <-chan struct{}, sent *atomic.Int64, limited []atomic.Bool, cfg loadConfig, stop <-chan struct{}) []call {
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
		case <-boost:
			tick.Reset(interval / 3)
			boost = nil
			continue
		case <-tick.C:
		}
		select {
		case <-stop: // stop wins over a tick that was ready too
			return calls
		default:
		}
		if !n.started.Load() {
			continue
		}
		if sent != nil {
			sent.Add(1)
		}
		c := call{key: pick[rand.IntN(len(pick))], client: client, sent: time.Now()}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.deadline)
		resp, err := n.limit.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{keys[c.key].check(1)}})
		cancel()
		c.replied = time.Now()
		switch {
		case err != nil:
			c.fail(err)
		case len(resp.Decisions) != 1:
			c.outcome, c.code, c.msg, c.maybe = failed, codes.Internal, fmt.Sprintf("%d decisions for 1 check", len(resp.Decisions)), true
		case resp.Decisions[0].Allowed:
			c.outcome, c.node, c.remaining = allowed, resp.Decisions[0].Node, resp.Decisions[0].Remaining
		default:
			c.outcome, c.node, c.remaining = denied, resp.Decisions[0].Node, resp.Decisions[0].Remaining
			limited[c.key].Store(true)
		}
		calls = append(calls, c)
	}
	return calls
}

// fail records a failed call's status: its code, message, reason, and
// whether it may have recorded its hit. Nothing was recorded if the node
// said so (an UNAVAILABLE whose ErrorInfo says recorded "no"), or if the
// client could not connect to it at all (the call never left the test);
// anything else may have recorded it: a deadline, a broken connection, a
// standby that did not confirm.
func (c *call) fail(err error) {
	s := status.Convert(err)
	c.outcome, c.code, c.msg, c.maybe = failed, s.Code(), s.Message(), true
	if s.Code() == codes.Unavailable && strings.Contains(s.Message(), "connect: connection refused") {
		c.maybe = false
	}
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == sluicecluster.ErrorDomain {
			c.reason = info.GetReason()
			c.maybe = s.Code() != codes.Unavailable || info.GetMetadata()[sluicecluster.MetaRecorded] != sluicecluster.RecordedNo
		}
	}
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
