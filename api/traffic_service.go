package api

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/api/topk"
	"github.com/sluice-io/sluice/cluster"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// What a node counts for the operator's view (api/traffic): every check
// decided by the native and Envoy APIs of the node that was asked (not by
// the owner a check was forwarded to, so that the cluster counts each
// check once), and every decision request with its latency: one call to
// the recorder per request.

// trafficCall is what a decision request leaves for the count: the time
// it was decided at and its checks, set by check or shouldRateLimit as far
// as they got.
type trafficCall struct {
	now time.Time
	// A native request's checks and decisions.
	checks []actor.Check
	out    []actor.Decision
	// An Envoy request's descriptors and response.
	descs []envoyDescriptor
	resp  *rlsv3.RateLimitResponse
}

// record counts a decision request of n checks (or descriptors) that
// started at start and failed if err is not nil, with one call to the
// recorder. A call its client cancelled (ctx is the call's) decided
// nothing and is not the node's error: it counts as a request alone.
func (s *Server) record(ctx context.Context, t *trafficCall, start time.Time, n int, err error) {
	if s.traffic == nil {
		return
	}
	latency := time.Since(start)
	if t.now.IsZero() {
		t.now = s.clock.Now() // refused before the clock was read
	}
	if err != nil {
		errs := max(n, 1)
		if canceled(ctx, err) {
			errs = 0
		}
		s.traffic.Request(t.now, latency, errs, 0, nil)
		return
	}
	if t.resp != nil {
		// Envoy: the descriptors that have a limit count, denied when
		// OVER_LIMIT (so shadow-mode denials do not).
		s.traffic.Request(t.now, latency, 0, len(t.descs), func(i int) (string, bool, bool) {
			d := &t.descs[i]
			return d.key, t.resp.Statuses[i].Code == rlsv3.RateLimitResponse_OVER_LIMIT, d.kind == envoyCheck || d.kind == envoyBlocked
		})
		return
	}
	s.traffic.Request(t.now, latency, 0, len(t.checks), func(i int) (string, bool, bool) {
		return t.checks[i].Key, !t.out[i].Allowed, true
	})
}

// Bounds of GetTraffic.
const (
	defaultTrafficTop     = 20
	maxTrafficTop         = 1000
	defaultTrafficSeconds = 60
	// peerTrafficTimeout bounds the wait for a member's figures, so that
	// one slow member does not hold the others' back.
	peerTrafficTimeout = 2 * time.Second
)

// trafficService serves sluice.v1.TrafficService. The admin token, when one
// is configured, is checked before it runs (see authorize).
type trafficService struct {
	sluicepb.UnimplementedTrafficServiceServer
	s *Server
}

// GetTraffic returns this node's figures and, unless another node asked,
// every live member's, with the top lists merged.
func (t *trafficService) GetTraffic(ctx context.Context, req *sluicepb.GetTrafficRequest) (*sluicepb.GetTrafficResponse, error) {
	resp, err := t.s.Traffic(ctx, req)
	return resp, toStatus(err)
}

// Traffic answers GetTraffic (for the web UI, in-process).
func (s *Server) Traffic(ctx context.Context, req *sluicepb.GetTrafficRequest) (*sluicepb.GetTrafficResponse, error) {
	top, seconds := int(req.Top), int(req.Seconds)
	switch {
	case top < 0:
		return nil, badInput("top: %d; it must be 0 (the default, %d) or more (at most %d are returned)", top, defaultTrafficTop, maxTrafficTop)
	case seconds < 0:
		return nil, badInput("seconds: %d; it must be 0 (the default, %d) or more", seconds, defaultTrafficSeconds)
	case top == 0:
		top = defaultTrafficTop
	}
	top = min(top, maxTrafficTop)
	if seconds == 0 {
		seconds = defaultTrafficSeconds
	}
	local := s.nodeTraffic(top, seconds)
	resp := &sluicepb.GetTrafficResponse{Node: s.cfg.NodeName, Nodes: []*sluicepb.NodeTraffic{local}}
	resp.Epoch = s.cluster.ViewEpoch()
	if cluster.Replicated(ctx) {
		return resp, nil // the node that asked merges
	}
	others := s.peers.Others(ctx)
	// Ask the others for as many keys as the answer holds: a key in the
	// merged top list is in the top list of some node (Merge keeps the
	// bounds of keys a node left out).
	peerReq := &sluicepb.GetTrafficRequest{Top: int32(top), Seconds: int32(seconds)}
	answers := make([]*sluicepb.NodeTraffic, len(others))
	var wg sync.WaitGroup
	for i, name := range others {
		wg.Go(func() {
			answers[i] = s.peerTraffic(ctx, name, peerReq)
		})
	}
	wg.Wait()
	resp.Nodes = append(resp.Nodes, answers...)
	slices.SortFunc(resp.Nodes, func(a, b *sluicepb.NodeTraffic) int { return strings.Compare(a.Name, b.Name) })
	var decisions, denials []*sluicepb.TopKeys
	for _, n := range resp.Nodes {
		if n.Error == "" {
			decisions, denials = append(decisions, n.TopDecisions), append(denials, n.TopDenials)
		}
		n.TopDecisions, n.TopDenials = nil, nil
	}
	resp.TopDecisions = s.mergeTop(decisions, top)
	resp.TopDenials = s.mergeTop(denials, top)
	return resp, nil
}

// peerTraffic asks the member name for its own figures.
func (s *Server) peerTraffic(ctx context.Context, name string, req *sluicepb.GetTrafficRequest) *sluicepb.NodeTraffic {
	ctx, cancel := context.WithTimeout(ctx, peerTrafficTimeout)
	defer cancel()
	if !s.cluster.Joined() {
		return &sluicepb.NodeTraffic{Name: name, Error: s.cfg.NodeName + " is still joining the cluster"}
	}
	conn, err := s.peers.Conn(name)
	if err != nil {
		return &sluicepb.NodeTraffic{Name: name, Error: err.Error()}
	}
	resp, err := sluicepb.NewTrafficServiceClient(conn).GetTraffic(s.peers.Context(ctx), req)
	if err != nil {
		return &sluicepb.NodeTraffic{Name: name, Error: err.Error()}
	}
	for _, n := range resp.Nodes {
		if n.Name == name {
			return n
		}
	}
	return &sluicepb.NodeTraffic{Name: name, Error: "its answer lacks its own figures"}
}

// nodeTraffic is this node's figures, its top lists with their owners.
func (s *Server) nodeTraffic(top, seconds int) *sluicepb.NodeTraffic {
	now := s.clock.Now()
	snap := s.traffic.Snapshot(now, top, seconds)
	n := &sluicepb.NodeTraffic{
		Name:         s.cfg.NodeName,
		Started:      timestamppb.New(s.started),
		ReadAt:       timestamppb.New(now),
		Seconds:      make([]*sluicepb.TrafficSecond, len(snap.Seconds)),
		TopDecisions: s.topKeys(snap.Decisions, snap.Window),
		TopDenials:   s.topKeys(snap.Denials, snap.Window),
		Latency: &sluicepb.RequestLatency{
			Requests: snap.Latency.Requests,
			P50:      durationpb.New(snap.Latency.P50),
			P99:      durationpb.New(snap.Latency.P99),
			Max:      durationpb.New(snap.Latency.Max),
		},
	}
	for i, sec := range snap.Seconds {
		n.Seconds[i] = &sluicepb.TrafficSecond{Unix: sec.Unix, Decisions: sec.Decisions, Denials: sec.Denials, Errors: sec.Errors, Requests: sec.Requests}
	}
	return n
}

// topKeys is a summary as the API shows it, each key with its owner.
func (s *Server) topKeys(sum topk.Summary, window time.Duration) *sluicepb.TopKeys {
	t := &sluicepb.TopKeys{Floor: sum.Floor, Total: sum.Total, Window: durationpb.New(window), Keys: make([]*sluicepb.KeyCount, len(sum.Entries))}
	for i, e := range sum.Entries {
		t.Keys[i] = &sluicepb.KeyCount{Key: []byte(e.Key), Count: e.Count, Error: e.Err, Owner: s.KeyOwner(e.Key)}
	}
	return t
}

// mergeTop merges the top lists of several nodes into the n largest.
func (s *Server) mergeTop(lists []*sluicepb.TopKeys, n int) *sluicepb.TopKeys {
	parts := make([]topk.Summary, len(lists))
	var window time.Duration
	for i, l := range lists {
		p := topk.Summary{Floor: l.GetFloor(), Total: l.GetTotal(), Entries: make([]topk.Entry, len(l.GetKeys()))}
		for j, k := range l.GetKeys() {
			p.Entries[j] = topk.Entry{Key: string(k.Key), Count: k.Count, Err: k.Error}
		}
		parts[i] = p
		window = max(window, l.GetWindow().AsDuration())
	}
	return s.topKeys(topk.Merge(parts...).Truncate(n), window)
}

// KeyOwner names the node that decides key now, as this node sees it: this
// node outside a cluster.
func (s *Server) KeyOwner(key string) string {
	owner, _ := s.cluster.Owner(key)
	return owner
}
