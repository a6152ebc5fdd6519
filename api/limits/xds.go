package limits

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// Limits over xDS.
//
// envoyproxy/ratelimit can take its limits from an xDS management server
// instead of files (CONFIG_TYPE=GRPC_XDS_SOTW): it opens an Aggregated
// Discovery Service stream (state of the world), asks for every resource
// of type RateLimitConfigTypeURL (go-control-plane's
// ratelimit.config.ratelimit.v3.RateLimitConfig: a name, a domain and the
// descriptors of a limits file), and puts each response in force as a
// whole, as if its resources were the files of a directory. A Watcher with
// WatcherOptions.XDS does the same: each response is checked as files are
// (every problem reported, naming the resource, as "xds:NAME", and the line
// of the descriptor in the resource written as YAML), then ACKed and
// swapped in, or NACKed with the problems while the limits in force stay.
// A stream that fails is opened again after a pause that doubles from
// MinBackoff up to MaxBackoff, with jitter.
//
// Until the first response is in force the Watcher's Config is empty and
// Loaded reports false: a node reports itself not ready meanwhile.

// RateLimitConfigTypeURL is the type of the xDS resources that carry
// limits.
const RateLimitConfigTypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// ErrXDS is returned by Watcher.Reload when the limits come from xDS: the
// management server pushes them; there is nothing to read.
var ErrXDS = errors.New("limits: the limits come from an xDS management server, which pushes every change: nothing to reload")

// XDSOptions configures a Watcher that takes its limits from an xDS
// management server (WatcherOptions.XDS).
type XDSOptions struct {
	// Server is the management server's address, host:port (or any gRPC
	// target). Required.
	Server string
	// NodeID is the node id the Watcher presents: the management server
	// picks the limits by it. Default "default", as envoyproxy/ratelimit.
	NodeID string
	// NodeMetadata is sent with the node id.
	NodeMetadata map[string]string
	// Headers are added to the stream's request metadata (for example an
	// authorization header the management server wants).
	Headers map[string]string
	// TLS, when set, connects with TLS; nil connects in clear text.
	TLS *tls.Config
	// MinBackoff and MaxBackoff bound the pause before a failed stream is
	// opened again. Defaults 1s and 30s.
	MinBackoff, MaxBackoff time.Duration
}

// runXDS keeps a stream to the management server open until ctx ends.
func (w *Watcher) runXDS(ctx context.Context) {
	defer w.wg.Done()
	o := w.xds
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	conn, err := grpc.NewClient(o.Server, grpc.WithTransportCredentials(creds))
	if err != nil { // a target that cannot parse: checked by NewWatcher
		w.log.Error("xDS: cannot dial the management server", "server", o.Server, "err", err)
		return
	}
	defer conn.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	if len(o.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(o.Headers))
	}
	node := &corev3.Node{Id: o.NodeID}
	if len(o.NodeMetadata) > 0 {
		fields := make(map[string]*structpb.Value, len(o.NodeMetadata))
		for k, v := range o.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: fields}
	}
	pause := o.MinBackoff
	for {
		start := time.Now()
		err := w.stream(ctx, ads, node)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > o.MaxBackoff {
			pause = o.MinBackoff // the stream lived: start over
		}
		d := pause/2 + rand.N(pause/2+1)
		w.log.Warn("xDS: stream to the management server ended; opening it again", "server", o.Server, "in", d, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		pause = min(2*pause, o.MaxBackoff)
	}
}

// stream runs one ADS stream: it asks for every RateLimitConfig and puts
// each response in force, ACKing or NACKing it, until the stream fails.
func (w *Watcher) stream(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient, node *corev3.Node) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	// The version in force, sent with every request: "" until one is.
	version := w.xdsVersion
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: RateLimitConfigTypeURL, VersionInfo: version}); err != nil {
		return err
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		if resp.TypeUrl != RateLimitConfigTypeURL {
			w.log.Warn("xDS: ignored a response of another type", "type_url", resp.TypeUrl)
			continue
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: RateLimitConfigTypeURL, ResponseNonce: resp.Nonce}
		cfg, err := w.xdsConfig(resp)
		w.mu.Lock()
		if err == nil {
			w.put(cfg, "xds_version", resp.VersionInfo)
			w.xdsVersion = resp.VersionInfo
		} else {
			w.refuse(err, "xds_version", resp.VersionInfo)
			ack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		}
		ack.VersionInfo = w.xdsVersion
		w.mu.Unlock()
		if err := s.Send(ack); err != nil {
			return err
		}
	}
}

// xdsConfig builds the Config of a response's resources.
func (w *Watcher) xdsConfig(resp *discoveryv3.DiscoveryResponse) (*Config, error) {
	srcs := make([]source, 0, len(resp.Resources))
	for i, res := range resp.Resources {
		var rc rlsconfv3.RateLimitConfig
		if err := res.UnmarshalTo(&rc); err != nil {
			return nil, &Error{File: fmt.Sprintf("xds:resource %d", i), Reason: "not a RateLimitConfig: " + err.Error(), Err: err}
		}
		data, err := rateLimitConfigYAML(&rc)
		if err != nil {
			return nil, &Error{File: "xds:" + rc.Name, Reason: "cannot read: " + err.Error(), Err: err}
		}
		name := rc.Name
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		srcs = append(srcs, source{name: "xds:" + name, data: data})
	}
	return build(srcs, w.load)
}

// rateLimitConfigYAML writes a RateLimitConfig as the limits file it
// stands for.
func rateLimitConfigYAML(rc *rlsconfv3.RateLimitConfig) ([]byte, error) {
	root := map[string]any{"domain": rc.Domain}
	if len(rc.Descriptors) > 0 {
		root["descriptors"] = descriptorsYAML(rc.Descriptors)
	}
	return yaml.Marshal(root)
}

func descriptorsYAML(ds []*rlsconfv3.RateLimitDescriptor) []any {
	out := make([]any, len(ds))
	for i, d := range ds {
		m := map[string]any{"key": d.Key}
		if d.Value != "" {
			m["value"] = d.Value
		}
		if p := d.RateLimit; p != nil {
			rl := map[string]any{}
			if p.Unlimited {
				rl["unlimited"] = true
			} else {
				rl["requests_per_unit"] = p.RequestsPerUnit
			}
			if p.Unit != rlsconfv3.RateLimitUnit_UNKNOWN {
				rl["unit"] = strings.ToLower(p.Unit.String())
			}
			if p.RequestsPerUnit != 0 && p.Unlimited {
				rl["requests_per_unit"] = p.RequestsPerUnit // refused, as in a file
			}
			if p.Name != "" {
				rl["name"] = p.Name
			}
			if len(p.Replaces) > 0 {
				rs := make([]any, len(p.Replaces))
				for j, r := range p.Replaces {
					rs[j] = map[string]any{"name": r.Name}
				}
				rl["replaces"] = rs
			}
			m["rate_limit"] = rl
		}
		for name, on := range map[string]bool{"shadow_mode": d.ShadowMode, "detailed_metric": d.DetailedMetric, "quota_mode": d.QuotaMode} {
			if on {
				m[name] = true
			}
		}
		if d.Metadata != nil {
			m["metadata"] = d.Metadata.AsMap()
		}
		if len(d.Descriptors) > 0 {
			m["descriptors"] = descriptorsYAML(d.Descriptors)
		}
		out[i] = m
	}
	return out
}
