package loadgen

import (
	"context"
	"fmt"
	"strconv"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice/client"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// caller sends one call deciding one check per key number and says how
// many were allowed. A caller belongs to one worker (it reuses its request
// from call to call): it is not safe for concurrent use.
type caller interface {
	call(ctx context.Context, keys []int) (allowed int, err error)
}

// newCaller returns the caller of cfg.API on conn.
func newCaller(cfg *Config, conn grpc.ClientConnInterface) caller {
	if cfg.API == Envoy {
		return newEnvoyCaller(cfg, conn)
	}
	return newNativeCaller(cfg, conn)
}

// nativeCaller calls sluice.v1.RateLimitService/Check.
type nativeCaller struct {
	client sluicepb.RateLimitServiceClient
	prefix string
	req    *sluicepb.CheckRequest
	keys   [][]byte // the key buffers of req's checks
}

func newNativeCaller(cfg *Config, conn grpc.ClientConnInterface) *nativeCaller {
	c := &nativeCaller{
		client: sluicepb.NewRateLimitServiceClient(conn),
		prefix: cfg.KeyPrefix,
		req:    &sluicepb.CheckRequest{Checks: make([]*sluicepb.Check, cfg.Batch)},
		keys:   make([][]byte, cfg.Batch),
	}
	window := durationpb.New(cfg.Window)
	for i := range c.req.Checks {
		c.req.Checks[i] = &sluicepb.Check{Limit: cfg.Limit, Window: window, Algorithm: cfg.Algorithm}
		c.keys[i] = make([]byte, 0, len(cfg.KeyPrefix)+20)
	}
	return c
}

func (c *nativeCaller) call(ctx context.Context, keys []int) (int, error) {
	for i, k := range keys {
		c.keys[i] = strconv.AppendInt(append(c.keys[i][:0], c.prefix...), int64(k), 10)
		c.req.Checks[i].Key = c.keys[i]
	}
	resp, err := c.client.Check(ctx, c.req)
	if err != nil {
		return 0, err
	}
	if len(resp.Decisions) != len(keys) {
		return 0, status.Errorf(codes.Internal, "the server sent %d decisions for %d checks", len(resp.Decisions), len(keys))
	}
	allowed := 0
	for _, d := range resp.Decisions {
		if d.Allowed {
			allowed++
		}
	}
	return allowed, nil
}

// clientCaller decides its checks through a client.Client, which the
// workers share.
type clientCaller struct {
	c      *client.Client
	prefix string
	checks []client.Check
}

func newClientCaller(cfg *Config, c *client.Client) *clientCaller {
	cc := &clientCaller{c: c, prefix: cfg.KeyPrefix, checks: make([]client.Check, cfg.Batch)}
	for i := range cc.checks {
		cc.checks[i] = client.Check{Limit: cfg.Limit, Window: cfg.Window, Algorithm: client.Algorithm(cfg.Algorithm)}
	}
	return cc
}

func (c *clientCaller) call(ctx context.Context, keys []int) (int, error) {
	for i, k := range keys {
		c.checks[i].Key = c.prefix + strconv.Itoa(k)
	}
	if len(keys) == 1 {
		d, err := c.c.Check(ctx, c.checks[0])
		if err != nil {
			return 0, err
		}
		return b2i(d.Allowed), nil
	}
	ds, err := c.c.CheckEach(ctx, c.checks[:len(keys)])
	if err != nil {
		return 0, err
	}
	allowed := 0
	for _, d := range ds {
		allowed += b2i(d.Allowed)
	}
	return allowed, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// envoyCaller calls envoy.service.ratelimit.v3.RateLimitService/
// ShouldRateLimit: one descriptor per check, each with the entry
// key=<prefix><n> and an inline limit.
type envoyCaller struct {
	client  rlsv3.RateLimitServiceClient
	prefix  string
	req     *rlsv3.RateLimitRequest
	entries []*ratelimitv3.RateLimitDescriptor_Entry
}

func newEnvoyCaller(cfg *Config, conn grpc.ClientConnInterface) *envoyCaller {
	unit, mult := envoyUnit(cfg.Window)
	limit := &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
		RequestsPerUnit: uint32(cfg.Limit),
		Unit:            unit,
	}
	if mult != 1 {
		limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	c := &envoyCaller{
		client:  rlsv3.NewRateLimitServiceClient(conn),
		prefix:  cfg.KeyPrefix,
		req:     &rlsv3.RateLimitRequest{Domain: EnvoyDomain, Descriptors: make([]*ratelimitv3.RateLimitDescriptor, cfg.Batch), HitsAddend: 1},
		entries: make([]*ratelimitv3.RateLimitDescriptor_Entry, cfg.Batch),
	}
	for i := range c.req.Descriptors {
		c.entries[i] = &ratelimitv3.RateLimitDescriptor_Entry{Key: "key"}
		c.req.Descriptors[i] = &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{c.entries[i]},
			Limit:   limit,
		}
	}
	return c
}

func (c *envoyCaller) call(ctx context.Context, keys []int) (int, error) {
	for i, k := range keys {
		c.entries[i].Value = c.prefix + strconv.Itoa(k)
	}
	resp, err := c.client.ShouldRateLimit(ctx, c.req)
	if err != nil {
		return 0, err
	}
	if len(resp.Statuses) != len(keys) {
		return 0, status.Errorf(codes.Internal, "the server sent %d statuses for %d descriptors", len(resp.Statuses), len(keys))
	}
	allowed := 0
	for _, s := range resp.Statuses {
		switch s.Code {
		case rlsv3.RateLimitResponse_OK:
			allowed++
		case rlsv3.RateLimitResponse_OVER_LIMIT:
		default:
			return 0, status.Errorf(codes.Internal, "the server sent a status with code %v", s.Code)
		}
	}
	return allowed, nil
}

// envoyUnit writes a window of whole seconds as the longest of Envoy's
// fixed-length units that divides it, and a multiplier.
func envoyUnit(w time.Duration) (typev3.RateLimitUnit, uint32) {
	for _, u := range []struct {
		unit typev3.RateLimitUnit
		len  time.Duration
	}{
		{typev3.RateLimitUnit_DAY, 24 * time.Hour},
		{typev3.RateLimitUnit_HOUR, time.Hour},
		{typev3.RateLimitUnit_MINUTE, time.Minute},
	} {
		if w%u.len == 0 {
			return u.unit, uint32(w / u.len)
		}
	}
	return typev3.RateLimitUnit_SECOND, uint32(w / time.Second)
}

// ProbeKey is the key Probe peeks at (the Envoy API's descriptor value).
const ProbeKey = "sluice-bench:probe"

// Probe makes one call through api on conn that records nothing (a peek,
// cost 0, at ProbeKey), to connect before the run and to find out early
// that the server is unreachable or does not serve api. The node answers
// it as any decision: it counts as allowed, never as a failed call that an
// error-ratio alert would see. It returns the call's error, nil as well
// for INVALID_ARGUMENT (a node that refuses the peek still serves api).
func Probe(ctx context.Context, api API, conn grpc.ClientConnInterface) error {
	var err error
	switch api {
	case Native:
		_, err = sluicepb.NewRateLimitServiceClient(conn).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{
			Key: []byte(ProbeKey), Limit: 1, Window: durationpb.New(time.Second), Cost: new(int64)}}})
	case Envoy:
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: EnvoyDomain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key", Value: ProbeKey}},
				Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND},
				HitsAddend: wrapperspb.UInt64(0),
			}}})
	default:
		return fmt.Errorf("loadgen: unknown API %q", api)
	}
	if status.Code(err) == codes.InvalidArgument {
		return nil
	}
	return err
}
