package api

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/api/limits"
	"github.com/sluice-io/sluice/api/overrides"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Page sizes of ListKeys and ListOverrides.
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// maxNoteLen is the longest Override.note, in bytes.
const maxNoteLen = 1024

// adminService serves sluice.v1.AdminService. The admin token, when one is
// configured, is checked before any of its methods runs (see authorize).
//
// Until the cluster exists, the node that receives a call is the owner of
// every key, so each call is answered locally.
type adminService struct {
	sluicepb.UnimplementedAdminServiceServer
	s *Server
}

// GetKey returns the live state of one key: on its owner, or with local,
// this node's own state of the key and its standby copy.
func (a *adminService) GetKey(ctx context.Context, req *sluicepb.GetKeyRequest) (*sluicepb.GetKeyResponse, error) {
	s := a.s
	if err := s.checkKey("key", req.Key); err != nil {
		return nil, toStatus(err)
	}
	if req.Local {
		return s.localKey(ctx, string(req.Key))
	}
	owner, err := s.peers.KeyOwner(ctx, req.Key)
	if err != nil {
		return nil, toStatus(err)
	}
	if owner != nil {
		return owner.GetKey(s.peers.Context(ctx), req)
	}
	v, err := s.engine.Inspect(ctx, string(req.Key))
	if err != nil {
		return nil, toStatus(err)
	}
	return &sluicepb.GetKeyResponse{State: s.keyState(&v)}, nil
}

// localKey reads this node's own state of key and its replica copy,
// without asking the key's owner.
func (s *Server) localKey(ctx context.Context, key string) (*sluicepb.GetKeyResponse, error) {
	v, err := s.engine.Inspect(ctx, key)
	if err != nil {
		return nil, toStatus(err)
	}
	r, err := s.engine.InspectReplica(ctx, key)
	if err != nil {
		return nil, toStatus(err)
	}
	return &sluicepb.GetKeyResponse{State: s.keyState(&v), Replica: s.keyState(&r)}, nil
}

// keyText is key for the key_text fields: itself when it is valid UTF-8,
// else empty.
func keyText(key string) string {
	if utf8.ValidString(key) {
		return key
	}
	return ""
}

// keyState is v as the API shows it.
func (s *Server) keyState(v *actor.KeyState) *sluicepb.KeyState {
	ks := &sluicepb.KeyState{
		Key:     []byte(v.Key),
		KeyText: keyText(v.Key),
		Found:   v.Found,
		Node:    s.cfg.NodeName,
		ReadAt:  timestamppb.New(v.ReadAt),
	}
	if !v.Found {
		return ks
	}
	ks.Algorithm = cluster.AlgorithmToProto(v.Algorithm)
	ks.Limit = v.Limit
	ks.Window = durationpb.New(v.Window)
	ks.Used, ks.Remaining = v.Used, v.Remaining
	ks.RetryAfter, ks.ResetAfter = durationpb.New(v.RetryAfter), durationpb.New(v.ResetAfter)
	ks.InMemory = v.InMemory
	ks.Reservations, ks.Reserved = int64(v.Reservations), v.Reserved
	ks.LeaseDenials = v.LeaseDenials
	for _, h := range v.Holders {
		ph := &sluicepb.ReservationHolder{Holder: h.Holder, Reservations: int64(h.Reservations),
			Leases: int64(h.Leases), Hits: h.Hits, Demand: h.Demand, Share: h.Share, Leased: h.Leased}
		if !h.Expires.IsZero() {
			ph.ExpiresAt = timestamppb.New(h.Expires) // none: only its demand is remembered
		}
		ks.Holders = append(ks.Holders, ph)
	}
	if !v.ExpiresAt.IsZero() {
		ks.ExpiresAt = timestamppb.New(v.ExpiresAt)
	}
	switch v.Algorithm {
	case actor.SlidingWindow:
		ks.Counters = &sluicepb.KeyState_SlidingWindow{SlidingWindow: &sluicepb.SlidingWindowState{
			BucketStart: timestamppb.New(v.BucketStart),
			Previous:    v.Previous,
			Current:     v.Current,
		}}
	case actor.TokenBucket:
		ks.Counters = &sluicepb.KeyState_TokenBucket{TokenBucket: &sluicepb.TokenBucketState{
			Tokens:  v.Tokens,
			Updated: timestamppb.New(v.Updated),
		}}
	default:
		log := &sluicepb.SlidingLogState{Runs: make([]*sluicepb.LogRun, len(v.Runs))}
		for i, r := range v.Runs {
			log.Runs[i] = &sluicepb.LogRun{Time: timestamppb.New(r.At), Count: r.Count}
		}
		ks.Counters = &sluicepb.KeyState_SlidingLog{SlidingLog: log}
	}
	return ks
}

// ListKeys lists the keys that hold state, a page at a time. The page token
// is the page's last key, base64url-encoded.
func (a *adminService) ListKeys(ctx context.Context, req *sluicepb.ListKeysRequest) (*sluicepb.ListKeysResponse, error) {
	s := a.s
	size, err := pageSize(req.PageSize)
	if err != nil {
		return nil, toStatus(err)
	}
	prefix := string(req.Prefix)
	after, err := decodeToken("page_token", req.PageToken)
	if err != nil {
		return nil, toStatus(err)
	}
	if req.PageToken != "" && !strings.HasPrefix(after, prefix) {
		return nil, toStatus(badInput("page_token: it belongs to a listing with another prefix; send the same prefix as for the first page"))
	}
	// One more than the page, to know whether another page follows.
	keys, err := s.engine.List(ctx, prefix, after, size+1)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &sluicepb.ListKeysResponse{}
	if len(keys) > size {
		keys = keys[:size]
		resp.NextPageToken = encodeToken(keys[size-1].Key)
	}
	resp.Keys = make([]*sluicepb.KeySummary, len(keys))
	for i, k := range keys {
		ks := &sluicepb.KeySummary{Key: []byte(k.Key), KeyText: keyText(k.Key), InMemory: k.InMemory, Node: s.cfg.NodeName}
		if !k.ExpiresAt.IsZero() {
			ks.ExpiresAt = timestamppb.New(k.ExpiresAt)
		}
		resp.Keys[i] = ks
	}
	if s.cluster.Joined() && !cluster.Replicated(ctx) {
		return s.listKeysCluster(ctx, req, resp, size)
	}
	return resp, nil
}

// ResetKey forgets the hits of one key.
func (a *adminService) ResetKey(ctx context.Context, req *sluicepb.ResetKeyRequest) (*sluicepb.ResetKeyResponse, error) {
	s := a.s
	if err := s.checkKey("key", req.Key); err != nil {
		return nil, toStatus(err)
	}
	owner, err := s.peers.KeyOwner(ctx, req.Key)
	if err != nil {
		return nil, toStatus(err)
	}
	if owner != nil {
		return owner.ResetKey(s.peers.Context(ctx), req)
	}
	existed, err := s.engine.Reset(ctx, string(req.Key))
	if err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("admin: key reset", "key", PrintableKey(req.Key), "existed", existed)
	return &sluicepb.ResetKeyResponse{Existed: existed}, nil
}

// SetOverride validates, stores and applies an override. It answers once
// the override is on disk (when the node has a data file) and applied: the
// next check of a key it matches sees it.
func (a *adminService) SetOverride(ctx context.Context, req *sluicepb.SetOverrideRequest) (*sluicepb.SetOverrideResponse, error) {
	s := a.s
	now := s.clock.Now()
	o, err := s.overrideFromProto(req.Override, now)
	if err != nil {
		return nil, toStatus(err)
	}
	o.SetAt = now
	if err := s.overrides.Set(o, now); err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("admin: override set", "key", PrintableKey([]byte(o.Key)), "prefix", o.Prefix,
		"limit", o.Limit, "window", o.Window, "algorithm", algorithmAttr(o), "expires_at", o.ExpiresAt, "note", o.Note)
	if err := s.overrides.Replicate(ctx, func(ctx context.Context, c sluicepb.AdminServiceClient) error {
		_, err := c.SetOverride(ctx, req)
		return err
	}); err != nil {
		return nil, toStatus(fmt.Errorf("%w: override set here but not on every node: %v", cluster.ErrUnreachable, err))
	}
	return &sluicepb.SetOverrideResponse{Override: overrides.ToProto(o)}, nil
}

func algorithmAttr(o *overrides.Override) string {
	if !o.HasAlgorithm {
		return ""
	}
	return o.Algorithm.String()
}

// overrideFromProto validates po as a SetOverride request carries it, at
// now, and returns it as the table holds it (without SetAt).
func (s *Server) overrideFromProto(po *sluicepb.Override, now time.Time) (*overrides.Override, error) {
	if po == nil {
		return nil, badInput("override: required")
	}
	lim := s.engineLimits()
	o := &overrides.Override{Key: string(po.Key), Prefix: po.Prefix, Limit: po.Limit, Note: po.Note}
	switch {
	case len(po.Key) == 0 && !po.Prefix:
		return nil, badInput("override.key: empty; an exact-key override needs a key (set prefix for an override of every key)")
	case len(po.Key) > lim.MaxKeyLen:
		return nil, badInput("override.key: %d bytes long; the maximum is %d", len(po.Key), lim.MaxKeyLen)
	case po.Limit < 0:
		return nil, badInput("override.limit: %d; it must be a positive count, or 0 to keep the limit of the check", po.Limit)
	case len(po.Note) > maxNoteLen:
		return nil, badInput("override.note: %d bytes long; the maximum is %d", len(po.Note), maxNoteLen)
	}
	if po.Window != nil {
		if err := po.Window.CheckValid(); err != nil {
			return nil, badInput("override.window: %v", err)
		}
		o.Window = po.Window.AsDuration()
		// A zero window is an unset one (proto3 reads an unset Duration as 0).
		if o.Window != 0 && (o.Window < lim.MinWindow || o.Window > lim.MaxWindow) {
			return nil, badInput("override.window: %v; it must be from %v to %v, or unset to keep the window of the check", o.Window, lim.MinWindow, lim.MaxWindow)
		}
	}
	if po.Algorithm != sluicepb.Algorithm_ALGORITHM_UNSPECIFIED {
		algo, err := fromProtoAlgorithm(po.Algorithm)
		if err != nil {
			return nil, badInput("override.%v", err)
		}
		o.Algorithm, o.HasAlgorithm = algo, true
	}
	if o.Limit == 0 && o.Window == 0 && !o.HasAlgorithm {
		return nil, badInput("override: it changes nothing; set at least one of limit, window and algorithm")
	}
	if po.ExpiresAt != nil {
		if err := po.ExpiresAt.CheckValid(); err != nil {
			return nil, badInput("override.expires_at: %v", err)
		}
		o.ExpiresAt = po.ExpiresAt.AsTime()
		if !now.Before(o.ExpiresAt) {
			return nil, badInput("override.expires_at: %v is not in the future (now is %v on node %s); leave it unset for an override that never expires",
				o.ExpiresAt.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano), s.cfg.NodeName)
		}
	}
	return o, nil
}

// ListOverrides lists the live overrides, a page at a time. The page token
// is the record key of the page's last override, base64url-encoded (see
// overrides.RecordKey).
func (a *adminService) ListOverrides(ctx context.Context, req *sluicepb.ListOverridesRequest) (*sluicepb.ListOverridesResponse, error) {
	s := a.s
	size, err := pageSize(req.PageSize)
	if err != nil {
		return nil, toStatus(err)
	}
	prefix := string(req.Prefix)
	var afterKey string
	var afterPrefix bool
	if req.PageToken != "" {
		rk, err := decodeToken("page_token", req.PageToken)
		if err != nil {
			return nil, toStatus(err)
		}
		var ok bool
		if afterKey, afterPrefix, ok = overrides.ParseRecordKey(rk); !ok {
			return nil, toStatus(badInput("page_token: %q is not a page token this server issued (pass next_page_token as it came, or empty for the first page)", truncate(req.PageToken, 64)))
		}
		if !strings.HasPrefix(afterKey, prefix) {
			return nil, toStatus(badInput("page_token: it belongs to a listing with another prefix; send the same prefix as for the first page"))
		}
	}
	now := s.clock.Now()
	resp := &sluicepb.ListOverridesResponse{}
	for _, o := range s.overrides.List() {
		if !o.Live(now) || !strings.HasPrefix(o.Key, prefix) ||
			(req.PageToken != "" && !overrides.Less(afterKey, afterPrefix, o.Key, o.Prefix)) {
			continue
		}
		if len(resp.Overrides) == size {
			last := resp.Overrides[size-1]
			resp.NextPageToken = encodeToken(overrides.RecordKey(string(last.Key), last.Prefix))
			break
		}
		resp.Overrides = append(resp.Overrides, overrides.ToProto(o))
	}
	return resp, nil
}

// DeleteOverride removes one override, from the data file first.
func (a *adminService) DeleteOverride(ctx context.Context, req *sluicepb.DeleteOverrideRequest) (*sluicepb.DeleteOverrideResponse, error) {
	s := a.s
	lim := s.engineLimits()
	switch {
	case len(req.Key) == 0 && !req.Prefix:
		return nil, toStatus(badInput("key: empty; an exact-key override has a key (set prefix to delete the override of every key)"))
	case len(req.Key) > lim.MaxKeyLen:
		return nil, toStatus(badInput("key: %d bytes long; the maximum is %d", len(req.Key), lim.MaxKeyLen))
	}
	now := s.clock.Now()
	existed, err := s.overrides.Delete(string(req.Key), req.Prefix, now)
	if err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("admin: override deleted", "key", PrintableKey(req.Key), "prefix", req.Prefix, "existed", existed)
	if err := s.overrides.Replicate(ctx, func(ctx context.Context, c sluicepb.AdminServiceClient) error {
		_, err := c.DeleteOverride(ctx, req)
		return err
	}); err != nil {
		return nil, toStatus(fmt.Errorf("%w: override deleted here but not on every node: %v", cluster.ErrUnreachable, err))
	}
	return &sluicepb.DeleteOverrideResponse{Existed: existed}, nil
}

// shareSamples is how many synthetic keys ListMembers hashes to measure
// each member's share of the keys: the share is exact to about ±0.5% (one
// standard deviation at a third) and the call costs a millisecond or so.
const shareSamples = 10_000

// ListMembers lists the members of the cluster map as this node applied
// it, with what gossip says of each, the share of keys each acts for, and
// the Raft roles. A single node lists itself, owning every key.
func (a *adminService) ListMembers(ctx context.Context, req *sluicepb.ListMembersRequest) (*sluicepb.ListMembersResponse, error) {
	s := a.s
	c := s.cluster
	cm := c.Map()
	if cm == nil {
		return &sluicepb.ListMembersResponse{
			Node: s.cfg.NodeName,
			Members: []*sluicepb.ClusterMember{{
				Name:     s.cfg.NodeName,
				GrpcAddr: s.grpcAddr(),
				State:    cluster.StateAlive.String(),
				Share:    1,
				Live:     true,
			}},
		}, nil
	}
	shares := c.Shares(shareSamples)
	voters := c.Voters()
	leader := c.Leader()
	gossip := make(map[string]cluster.Member)
	for _, n := range c.Gossip() {
		gossip[n.Name] = n
	}
	resp := &sluicepb.ListMembersResponse{
		MapVersion: cm.Version,
		Node:       s.cfg.NodeName,
		Leader:     leader,
		ClusterId:  cm.ClusterID,
	}
	listed := make(map[string]bool)
	for _, x := range cm.Members {
		listed[x.Name] = true
		g, seen := gossip[x.Name]
		state := "dead"
		switch {
		case x.Phase == control.PhaseLeft:
			state = "left"
		case x.Phase == control.PhaseLeaving && x.Live:
			state = "leaving"
		case x.Live && seen && g.State == cluster.StateAlive:
			state = cluster.StateAlive.String()
		}
		gs := ""
		if seen {
			gs = g.State.String()
		}
		resp.Members = append(resp.Members, &sluicepb.ClusterMember{
			Name:       x.Name,
			GossipAddr: cmp.Or(g.GossipAddr, x.Addrs.Gossip),
			GrpcAddr:   cmp.Or(g.GRPCAddr, x.Addrs.GRPC),
			State:      state,
			Share:      shares[x.Name],
			Epoch:      x.Epoch,
			Live:       x.Live,
			Voter:      voters[x.ID],
			Leader:     x.Name == leader,
			Phase:      x.Phase.String(),
			Id:         x.ID,
			Gossip:     gs,
			Releasable: x.Releasable && !x.Live,
		})
	}
	// Nodes gossip sees that the map does not list (yet): joining, or of
	// another cluster.
	for name, g := range gossip {
		if !listed[name] && g.State == cluster.StateAlive {
			resp.Members = append(resp.Members, &sluicepb.ClusterMember{
				Name: name, GossipAddr: g.GossipAddr, GrpcAddr: g.GRPCAddr, State: "joining", Id: g.ID, Gossip: g.State.String(),
			})
		}
	}
	slices.SortFunc(resp.Members, func(a, b *sluicepb.ClusterMember) int { return strings.Compare(a.Name, b.Name) })
	return resp, nil
}

// ForgetMember removes a member that is down for good from the cluster
// map, through the Raft leader.
func (a *adminService) ForgetMember(ctx context.Context, req *sluicepb.ForgetMemberRequest) (*sluicepb.ForgetMemberResponse, error) {
	s := a.s
	if req.Name == "" {
		return nil, toStatus(badInput("forget member: name is empty"))
	}
	if s.cluster.Map() == nil {
		return nil, toStatus(fmt.Errorf("forget member: %w", errNotClustered))
	}
	fromCopies, err := s.cluster.Forget(ctx, req.Name)
	if err != nil {
		return nil, toStatus(err)
	}
	return &sluicepb.ForgetMemberResponse{FromCopies: fromCopies}, nil
}

// EnvoyKey computes the key under which the Envoy adapter counts a
// descriptor.
func (a *adminService) EnvoyKey(ctx context.Context, req *sluicepb.EnvoyKeyRequest) (*sluicepb.EnvoyKeyResponse, error) {
	switch {
	case req.Domain == "":
		return nil, toStatus(badInput("domain: empty; send the rate-limit domain of the Envoy filter"))
	case len(req.Entries) == 0:
		return nil, toStatus(badInput("entries: none; a descriptor has at least one entry"))
	}
	entries := make([]limits.Entry, len(req.Entries))
	for i, e := range req.Entries {
		if e == nil {
			return nil, toStatus(badInput("entries[%d]: missing", i))
		}
		entries[i] = limits.Entry{Key: e.Key, Value: e.Value}
	}
	key := envoyKey(req.Domain, entries)
	return &sluicepb.EnvoyKeyResponse{Key: []byte(key), Printable: PrintableKey([]byte(key))}, nil
}

// PrintableKey shows a key for people: printable ASCII as it is, a
// backslash as \\, every other byte as \xNN. ParseKey reads it back.
func PrintableKey(key []byte) string {
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(key))
	for _, c := range key {
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case c >= 0x20 && c <= 0x7e:
			b.WriteByte(c)
		default:
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
	}
	return b.String()
}

// Page tokens. Both are base64url without padding (RFC 4648 §5), so they
// travel in URLs and shells as they are:
//
//   - ListKeys: the last key of the page.
//   - ListOverrides: the record key of the last override of the page
//     ("=" or "*", then its key; see overrides.RecordKey).
//
// Clients must treat them as opaque.
var tokenEncoding = base64.RawURLEncoding

func encodeToken(s string) string { return tokenEncoding.EncodeToString([]byte(s)) }

// decodeToken decodes a page token; "" decodes to "".
func decodeToken(field, token string) (string, error) {
	b, err := tokenEncoding.DecodeString(token)
	if err != nil {
		return "", badInput("%s: %q is not a page token this server issued (pass next_page_token as it came, or empty for the first page)", field, truncate(token, 64))
	}
	return string(b), nil
}

// truncate shortens s to at most n bytes for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}

// pageSize applies the page size rules of the list calls.
func pageSize(n int32) (int, error) {
	switch {
	case n < 0:
		return 0, badInput("page_size: %d; it must be 0 (the default, %d) or more (at most %d are returned)", n, defaultPageSize, maxPageSize)
	case n == 0:
		return defaultPageSize, nil
	case n > maxPageSize:
		return maxPageSize, nil
	}
	return int(n), nil
}

// checkKey reports a key that no check could carry.
func (s *Server) checkKey(field string, key []byte) error {
	switch max := s.engineLimits().MaxKeyLen; {
	case len(key) == 0:
		return badInput("%s: empty; send the key exactly as checks send it", field)
	case len(key) > max:
		return badInput("%s: %d bytes long; the maximum is %d", field, len(key), max)
	}
	return nil
}

// engineLimits is the engine's configured limits with their defaults.
func (s *Server) engineLimits() actor.Limits {
	l := s.cfg.Limits
	if l.MaxKeyLen <= 0 {
		l.MaxKeyLen = actor.DefaultMaxKeyLen
	}
	if l.MinWindow <= 0 {
		l.MinWindow = actor.DefaultMinWindow
	}
	if l.MaxWindow <= 0 {
		l.MaxWindow = actor.DefaultMaxWindow
	}
	if l.MaxBatch <= 0 {
		l.MaxBatch = actor.DefaultMaxBatch
	}
	return l
}

// ParseKey reads a key in PrintableKey's form: \\ is a backslash, \xNN a byte
// (either case), anything else as it is.
func ParseKey(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(s) && s[i+1] == 'x' && isHex(s[i+2]) && isHex(s[i+3]):
			out = append(out, unhex(s[i+2])<<4|unhex(s[i+3]))
			i += 3
		default:
			return nil, fmt.Errorf("key: a backslash at byte %d starts neither \\\\ nor \\xNN", i)
		}
	}
	return out, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
