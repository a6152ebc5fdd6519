package ui

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/api"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// The JSON the pages read. Durations are milliseconds (float), times
// RFC 3339 strings in UTC, keys printable (see printable).

// Bounds of the overview.
const (
	defaultSeconds = 300
	defaultTop     = 20
	maxTop         = 100
	// rateSeconds is the span of the per-node rates: the last whole
	// seconds.
	rateSeconds = 10
	// maxOverridePages bounds the pages of overrides read.
	maxOverridePages = 100
)

// overview is the cluster page's data.
type overview struct {
	Node       string      `json:"node"`
	Epoch      uint64      `json:"epoch"`      // the answering node's gossip view
	MapVersion uint64      `json:"mapVersion"` // the cluster map it applied
	Leader     string      `json:"leader"`     // the Raft leader it knows
	ReadAt     string      `json:"readAt"`
	Members    []member    `json:"members"`
	Changes    []change    `json:"changes"`
	Series     series      `json:"series"` // the whole seconds before now
	Decisions  topList     `json:"topDecisions"`
	Denials    topList     `json:"topDenials"`
	Totals     rateFigures `json:"totals"`
}

// member is one member, with its figures when it answered.
type member struct {
	Name       string  `json:"name"`
	State      string  `json:"state"`
	GRPCAddr   string  `json:"grpcAddr"`
	GossipAddr string  `json:"gossipAddr"`
	Share      float64 `json:"share"`
	// Error says why the figures are missing.
	Error     string   `json:"error,omitempty"`
	StartedAt string   `json:"startedAt,omitempty"`
	UptimeMs  float64  `json:"uptimeMs"`
	Decisions []uint64 `json:"decisions,omitempty"` // per second, aligned with series
	rateFigures
	Requests uint64  `json:"requests"` // in the window of the latencies
	P50Ms    float64 `json:"p50Ms"`
	P99Ms    float64 `json:"p99Ms"`
	MaxMs    float64 `json:"maxMs"`
}

// rateFigures are per-second rates over the last rateSeconds whole seconds.
type rateFigures struct {
	DecisionsPerSec float64 `json:"decisionsPerSec"`
	DenialsPerSec   float64 `json:"denialsPerSec"`
	ErrorsPerSec    float64 `json:"errorsPerSec"`
	RequestsPerSec  float64 `json:"requestsPerSec"`
}

// change is one membership change.
type change struct {
	At string `json:"at"`
	// AgoMs is how long ago the node saw it, by the node's wall clock
	// (which At is in too).
	AgoMs   float64 `json:"agoMs"`
	Epoch   uint64  `json:"epoch"`
	Kind    string  `json:"kind"`
	Member  string  `json:"member"`
	State   string  `json:"state"`
	Members int     `json:"members"`
}

// series is the cluster's counts per second, oldest first.
type series struct {
	Start     int64    `json:"start"` // the first second, Unix
	Decisions []uint64 `json:"decisions"`
	Denials   []uint64 `json:"denials"`
	Errors    []uint64 `json:"errors"`
}

// topList is a merged top list.
type topList struct {
	WindowMs float64    `json:"windowMs"`
	Floor    uint64     `json:"floor"`
	Total    uint64     `json:"total"`
	Keys     []keyCount `json:"keys"`
}

type keyCount struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
	Owner string `json:"owner"`
}

// intParam reads an integer query parameter in [0, max], def when absent.
func intParam(r *http.Request, name string, def, max int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, httpError{http.StatusBadRequest, name + ": want a whole number from 0"}
	}
	return min(n, max), nil
}

func (h *Handler) overview(r *http.Request) (any, error) {
	seconds, err := intParam(r, "seconds", defaultSeconds, defaultSeconds)
	if err != nil {
		return nil, err
	}
	top, err := intParam(r, "top", defaultTop, maxTop)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	members, err := h.b.Admin().ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return nil, err
	}
	// One second more than shown: the last is partial, and the rates use
	// whole ones.
	tr, err := h.b.Traffic(ctx, &sluicepb.GetTrafficRequest{Top: int32(max(top, 1)), Seconds: int32(seconds + 1)})
	if err != nil {
		return nil, err
	}
	now := h.cfg.Clock.Now()
	out := &overview{
		Node:      h.b.NodeName(),
		ReadAt:    fmtTime(now),
		Decisions: h.topList(tr.TopDecisions, top),
		Denials:   h.topList(tr.TopDenials, top),
		Changes:   []change{},
	}
	for _, c := range h.b.MembershipChanges() {
		out.Changes = append(out.Changes, change{At: fmtTime(c.At), AgoMs: ms(time.Since(c.At)), Epoch: c.Epoch, Kind: c.Kind.String(), Member: c.Member, State: c.State.String(), Members: c.Members})
	}
	slices.Reverse(out.Changes) // newest first
	if len(out.Changes) > 0 {
		out.Epoch = out.Changes[0].Epoch // the answering node's gossip view
	}
	out.MapVersion, out.Leader = members.MapVersion, members.Leader

	// The series ends at the last whole second of the latest node (clocks
	// differ a little: the nodes' last seconds are partial), and holds
	// seconds seconds.
	var end int64
	for _, n := range tr.Nodes {
		if k := len(n.Seconds); k > 0 {
			end = max(end, n.Seconds[k-1].Unix)
		}
	}
	if end == 0 {
		end = now.Unix()
	}
	end--
	out.Series = series{Start: end - int64(seconds) + 1, Decisions: make([]uint64, seconds), Denials: make([]uint64, seconds), Errors: make([]uint64, seconds)}
	traffic := make(map[string]*sluicepb.NodeTraffic)
	for _, n := range tr.Nodes {
		traffic[n.Name] = n
		for _, s := range n.Seconds {
			if i := s.Unix - out.Series.Start; i >= 0 && i < int64(seconds) {
				out.Series.Decisions[i] += s.Decisions
				out.Series.Denials[i] += s.Denials
				out.Series.Errors[i] += s.Errors
			}
		}
	}
	for _, m := range members.Members {
		v := member{Name: m.Name, State: m.State, GRPCAddr: m.GrpcAddr, GossipAddr: m.GossipAddr, Share: m.Share}
		switch n := traffic[m.Name]; {
		case n == nil && (m.State == "alive" || m.State == "leaving"):
			v.Error = "no figures: not in the answering node's view yet"
		case n == nil:
		case n.Error != "":
			v.Error = n.Error
		default:
			h.nodeFigures(&v, n, out.Series.Start, seconds)
			out.Totals.add(v.rateFigures)
		}
		out.Members = append(out.Members, v)
	}
	return out, nil
}

func (r *rateFigures) add(o rateFigures) {
	r.DecisionsPerSec += o.DecisionsPerSec
	r.DenialsPerSec += o.DenialsPerSec
	r.ErrorsPerSec += o.ErrorsPerSec
	r.RequestsPerSec += o.RequestsPerSec
}

// nodeFigures fills in v's figures from n.
func (h *Handler) nodeFigures(v *member, n *sluicepb.NodeTraffic, start int64, seconds int) {
	if n.Started != nil {
		v.StartedAt = fmtTime(n.Started.AsTime())
		v.UptimeMs = ms(n.ReadAt.AsTime().Sub(n.Started.AsTime()))
	}
	v.Decisions = make([]uint64, seconds)
	for _, s := range n.Seconds {
		if i := s.Unix - start; i >= 0 && i < int64(seconds) {
			v.Decisions[i] = s.Decisions
		}
	}
	// The rates: the last whole seconds (the last one is partial).
	whole := n.Seconds
	if len(whole) > 1 {
		whole = whole[:len(whole)-1]
	}
	whole = whole[max(len(whole)-rateSeconds, 0):]
	if k := float64(len(whole)); k > 0 {
		for _, s := range whole {
			v.DecisionsPerSec += float64(s.Decisions) / k
			v.DenialsPerSec += float64(s.Denials) / k
			v.ErrorsPerSec += float64(s.Errors) / k
			v.RequestsPerSec += float64(s.Requests) / k
		}
	}
	if l := n.Latency; l != nil {
		v.Requests = l.Requests
		v.P50Ms, v.P99Ms, v.MaxMs = msp(l.P50), msp(l.P99), msp(l.Max)
	}
}

func (h *Handler) topList(t *sluicepb.TopKeys, n int) topList {
	out := topList{WindowMs: msp(t.GetWindow()), Floor: t.GetFloor(), Total: t.GetTotal(), Keys: []keyCount{}}
	for _, k := range t.GetKeys() {
		if len(out.Keys) == n {
			out.Floor = max(out.Floor, k.Count) // as topk.Summary.Truncate does
			break
		}
		out.Keys = append(out.Keys, keyCount{Key: api.PrintableKey(k.Key), Count: k.Count, Error: k.Error, Owner: k.Owner})
	}
	return out
}

// keyView is the key page's data.
type keyView struct {
	Key          string  `json:"key"`
	Found        bool    `json:"found"`
	Node         string  `json:"node"` // the node that answered: the owner
	Owner        string  `json:"owner"`
	Standby      string  `json:"standby"`
	ReadAt       string  `json:"readAt"`
	Algorithm    string  `json:"algorithm,omitempty"`
	Limit        int64   `json:"limit"`
	WindowMs     float64 `json:"windowMs"`
	Used         int64   `json:"used"`
	Remaining    int64   `json:"remaining"`
	RetryAfterMs float64 `json:"retryAfterMs"`
	ResetAfterMs float64 `json:"resetAfterMs"`
	InMemory     bool    `json:"inMemory"`
	ExpiresAt    string  `json:"expiresAt,omitempty"`
	// Runs are the sliding log's hits, oldest first; AtMs is before
	// ReadAt (negative).
	Runs          []run          `json:"runs,omitempty"`
	SlidingWindow *slidingWindow `json:"slidingWindow,omitempty"`
	TokenBucket   *tokenBucket   `json:"tokenBucket,omitempty"`
	Override      *overrideView  `json:"override"`
	// Holders are the open reservations by holder; LeaseDenials the checks
	// denied while a quota lease was open.
	Holders      []holderView `json:"holders,omitempty"`
	LeaseDenials int64        `json:"leaseDenials"`
}

type holderView struct {
	Holder       string `json:"holder"`
	Reservations int64  `json:"reservations"`
	Leases       int64  `json:"leases"`
	Hits         int64  `json:"hits"`
	ExpiresAt    string `json:"expiresAt"`
	Demand       int64  `json:"demand"`
	Share        int64  `json:"share"`
	Leased       int64  `json:"leased"`
}

type run struct {
	AtMs  float64 `json:"atMs"`
	Count int64   `json:"count"`
}

type slidingWindow struct {
	BucketStartMs float64 `json:"bucketStartMs"` // before ReadAt (negative)
	Previous      int64   `json:"previous"`
	Current       int64   `json:"current"`
}

type tokenBucket struct {
	Tokens    float64 `json:"tokens"`
	UpdatedMs float64 `json:"updatedMs"` // before ReadAt (negative)
}

// keyParam reads the key query parameter, in printable form.
func keyParam(r *http.Request) ([]byte, error) {
	s := r.URL.Query().Get("key")
	if s == "" {
		return nil, httpError{http.StatusBadRequest, "key: empty; give a key (printable form: \\\\ for a backslash, \\xNN for other bytes)"}
	}
	key, err := api.ParseKey(s)
	if err != nil {
		return nil, httpError{http.StatusBadRequest, err.Error()}
	}
	return key, nil
}

func (h *Handler) key(r *http.Request) (any, error) {
	key, err := keyParam(r)
	if err != nil {
		return nil, err
	}
	resp, err := h.b.Admin().GetKey(r.Context(), &sluicepb.GetKeyRequest{Key: key})
	if err != nil {
		return nil, err
	}
	s := resp.GetState()
	readAt := s.GetReadAt().AsTime()
	v := &keyView{
		Key:       api.PrintableKey(key),
		Found:     s.Found,
		Node:      s.Node,
		Owner:     h.b.KeyOwner(string(key)),
		Standby:   h.b.KeyStandby(string(key)),
		ReadAt:    fmtTime(readAt),
		Limit:     s.Limit,
		WindowMs:  msp(s.Window),
		Used:      s.Used,
		Remaining: s.Remaining,
		InMemory:  s.InMemory,
		Override:  overrideOf(h.b.OverrideFor(key), h.cfg.Clock.Now()),
	}
	if !s.Found {
		return v, nil
	}
	v.Algorithm = algorithmName(s.Algorithm)
	v.RetryAfterMs, v.ResetAfterMs = msp(s.RetryAfter), msp(s.ResetAfter)
	v.LeaseDenials = s.LeaseDenials
	for _, h := range s.Holders {
		hv := holderView{Holder: h.Holder, Reservations: h.Reservations, Leases: h.Leases, Hits: h.Hits,
			Demand: h.Demand, Share: h.Share, Leased: h.Leased}
		if h.ExpiresAt != nil {
			hv.ExpiresAt = fmtTime(h.ExpiresAt.AsTime())
		}
		v.Holders = append(v.Holders, hv)
	}
	if s.ExpiresAt != nil {
		v.ExpiresAt = fmtTime(s.ExpiresAt.AsTime())
	}
	switch c := s.Counters.(type) {
	case *sluicepb.KeyState_SlidingLog:
		v.Runs = make([]run, len(c.SlidingLog.Runs))
		for i, r := range c.SlidingLog.Runs {
			v.Runs[i] = run{AtMs: ms(r.Time.AsTime().Sub(readAt)), Count: r.Count}
		}
	case *sluicepb.KeyState_SlidingWindow:
		v.SlidingWindow = &slidingWindow{BucketStartMs: ms(c.SlidingWindow.BucketStart.AsTime().Sub(readAt)), Previous: c.SlidingWindow.Previous, Current: c.SlidingWindow.Current}
	case *sluicepb.KeyState_TokenBucket:
		v.TokenBucket = &tokenBucket{Tokens: c.TokenBucket.Tokens, UpdatedMs: ms(c.TokenBucket.Updated.AsTime().Sub(readAt))}
	}
	return v, nil
}

func algorithmName(a sluicepb.Algorithm) string {
	switch a {
	case sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW:
		return "sliding window"
	case sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET:
		return "token bucket"
	}
	return "sliding log"
}

// overrideView is an override as the pages show it.
type overrideView struct {
	Key         string  `json:"key"`
	Prefix      bool    `json:"prefix"`
	Limit       int64   `json:"limit"`
	WindowMs    float64 `json:"windowMs"`
	Algorithm   string  `json:"algorithm,omitempty"`
	ExpiresAt   string  `json:"expiresAt,omitempty"`
	ExpiresInMs float64 `json:"expiresInMs,omitempty"`
	Note        string  `json:"note"`
	SetAt       string  `json:"setAt,omitempty"`
}

func overrideOf(o *sluicepb.Override, now time.Time) *overrideView {
	if o == nil {
		return nil
	}
	v := &overrideView{Key: api.PrintableKey(o.Key), Prefix: o.Prefix, Limit: o.Limit, WindowMs: msp(o.Window), Note: o.Note}
	if o.Algorithm != sluicepb.Algorithm_ALGORITHM_UNSPECIFIED {
		v.Algorithm = algorithmName(o.Algorithm)
	}
	if o.ExpiresAt != nil {
		v.ExpiresAt = fmtTime(o.ExpiresAt.AsTime())
		v.ExpiresInMs = ms(o.ExpiresAt.AsTime().Sub(now))
	}
	if o.SetAt != nil {
		v.SetAt = fmtTime(o.SetAt.AsTime())
	}
	return v
}

func (h *Handler) overrides(r *http.Request) (any, error) {
	now := h.cfg.Clock.Now()
	out := struct {
		ReadAt    string          `json:"readAt"`
		Overrides []*overrideView `json:"overrides"`
		More      bool            `json:"more"` // more than the pages read
	}{ReadAt: fmtTime(now), Overrides: []*overrideView{}}
	token := ""
	for range maxOverridePages {
		resp, err := h.b.Admin().ListOverrides(r.Context(), &sluicepb.ListOverridesRequest{PageSize: 1000, PageToken: token})
		if err != nil {
			return nil, err
		}
		for _, o := range resp.Overrides {
			out.Overrides = append(out.Overrides, overrideOf(o, now))
		}
		if token = resp.NextPageToken; token == "" {
			return out, nil
		}
	}
	out.More = true
	return out, nil
}

// envoyKey answers the Envoy descriptor → key lookup: domain, and entries
// as repeated entry=KEY=VALUE parameters, in order.
func (h *Handler) envoyKey(r *http.Request) (any, error) {
	q := r.URL.Query()
	req := &sluicepb.EnvoyKeyRequest{Domain: q.Get("domain")}
	for _, e := range q["entry"] {
		k, v, ok := strings.Cut(e, "=")
		if !ok {
			return nil, httpError{http.StatusBadRequest, "entry " + strconv.Quote(e) + ": want KEY=VALUE"}
		}
		req.Entries = append(req.Entries, &sluicepb.DescriptorEntry{Key: k, Value: v})
	}
	resp, err := h.b.Admin().EnvoyKey(r.Context(), req)
	if err != nil {
		return nil, err
	}
	return map[string]string{"key": resp.Printable}, nil
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func msp(d *durationpb.Duration) float64 {
	if d == nil {
		return 0
	}
	return ms(d.AsDuration())
}
