package limits

import (
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-io/sluice/api/limits/xdstest"
)

// edgeConfig is a RateLimitConfig of domain edge: remote_address at n per
// second (named other), and a nested, named rule with metadata and quota
// mode that replaces other.
func edgeConfig(n uint32) *rlsconfv3.RateLimitConfig {
	meta, _ := structpb.NewStruct(map[string]any{"team": "growth", "answer": "yes"})
	return &rlsconfv3.RateLimitConfig{Name: "edge-limits", Domain: "edge", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: n, Name: "other"}},
		{Key: "service", Value: "auth", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: "user", QuotaMode: true, ShadowMode: true, DetailedMetric: true, Metadata: meta,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 0, Name: "per_user",
				Replaces: []*rlsconfv3.RateLimitReplace{{Name: "other"}}},
		}}},
		{Key: "internal", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
	}}
}

// TestXDSWatcher: a Watcher of xDS asks for every RateLimitConfig, puts
// each response in force and ACKs it, NACKs one that does not load while
// the limits in force stay, and opens a lost stream again, sending the
// version it has.
func TestXDSWatcher(t *testing.T) {
	if a, _ := anypb.New(&rlsconfv3.RateLimitConfig{}); a.TypeUrl != RateLimitConfigTypeURL || xdstest.TypeURL != RateLimitConfigTypeURL {
		t.Fatalf("RateLimitConfig's type URL is %s; RateLimitConfigTypeURL %s, xdstest.TypeURL %s", a.TypeUrl, RateLimitConfigTypeURL, xdstest.TypeURL)
	}
	f := xdstest.New(t)
	reloads := make(chan *Config, 4)
	w, err := NewWatcher(WatcherOptions{
		XDS:      &XDSOptions{Server: f.Addr, NodeID: "sluice-1", NodeMetadata: map[string]string{"zone": "a"}, MinBackoff: 10 * time.Millisecond},
		OnReload: func(c *Config) { reloads <- c },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Loaded() || len(w.Current().Domains()) != 0 {
		t.Fatalf("before Start: Loaded %v, domains %v; want false and none", w.Loaded(), w.Current().Domains())
	}
	if err := w.Reload(); err != ErrXDS {
		t.Errorf("Reload = %v; want ErrXDS", err)
	}
	w.Start()

	first := f.Request()
	if first.TypeUrl != RateLimitConfigTypeURL || first.GetNode().GetId() != "sluice-1" ||
		first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "a" || first.VersionInfo != "" || len(first.ResourceNames) != 0 {
		t.Fatalf("first request = %v; want every %s for node sluice-1 (zone a), no version", first, RateLimitConfigTypeURL)
	}

	f.Send("1", "n1", edgeConfig(10))
	if ack := f.Request(); ack.VersionInfo != "1" || ack.ResponseNonce != "n1" || ack.ErrorDetail != nil {
		t.Fatalf("after version 1: request %v; want an ACK of version 1, nonce n1", ack)
	}
	<-reloads
	if !w.Loaded() {
		t.Error("after version 1: Loaded false")
	}
	c := w.Current()
	runLookups(t, c, []lookupCase{
		{"edge", d("remote_address=1.2.3.4"), "10/second"},
		{"edge", d("internal=x"), "unlimited"},
	})
	r, ok := c.Lookup("edge", d("service=auth", "user=bob"))
	if !ok || r.Name != "per_user" || r.Limit != 0 || !r.QuotaMode || !r.ShadowMode || !r.DetailedMetric ||
		r.Metadata.GetFields()["answer"].GetStringValue() != "yes" || len(r.Replaces) != 1 || r.File != "xds:edge-limits" {
		t.Errorf("nested rule = %+v; want per_user, 0/minute, quota, shadow, detailed, metadata answer \"yes\", from xds:edge-limits", r)
	}

	bad := edgeConfig(20)
	bad.Descriptors = append(bad.Descriptors, &rlsconfv3.RateLimitDescriptor{Value: "no key"})
	f.Send("2", "n2", bad)
	nack := f.Request()
	if nack.VersionInfo != "1" || nack.ResponseNonce != "n2" || nack.ErrorDetail == nil ||
		!strings.Contains(nack.ErrorDetail.Message, "xds:edge-limits") || !strings.Contains(nack.ErrorDetail.Message, "no key") {
		t.Fatalf("after a bad version 2: request %v; want a NACK keeping version 1, naming xds:edge-limits and the missing key", nack)
	}
	runLookups(t, w.Current(), []lookupCase{{"edge", d("remote_address=1.2.3.4"), "10/second"}})
	if w.LastError() == nil {
		t.Error("LastError after a NACK = nil")
	}

	f.Drop() // the stream fails: the watcher opens another, from version 1
	again := f.Request()
	if again.VersionInfo != "1" || again.GetNode().GetId() != "sluice-1" || f.Streams() < 2 {
		t.Fatalf("after the stream failed: request %v on stream %d; want a new stream asking from version 1", again, f.Streams())
	}
	f.Send("3", "n3", edgeConfig(30))
	f.Request()
	<-reloads
	runLookups(t, w.Current(), []lookupCase{{"edge", d("remote_address=1.2.3.4"), "30/second"}})
}
