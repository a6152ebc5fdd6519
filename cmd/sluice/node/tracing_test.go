package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// collector is an OTLP/HTTP trace collector on 127.0.0.1:0 that keeps
// what the nodes export to /v1/traces.
type collector struct {
	addr string

	mu    sync.Mutex
	spans []*exported
}

// exported is one span and the service instance (node) that sent it.
type exported struct {
	node string
	span *tracepb.Span
}

func newCollector(t testing.TB) *collector {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: lis.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", c.export)
	srv := &http.Server{Handler: mux}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return c
}

func (c *collector) export(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req collectorpb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, fmt.Sprintf("not an OTLP protobuf request (%s): %v", r.Header.Get("Content-Type"), err), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		node := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.instance.id" {
				node = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans = append(c.spans, &exported{node: node, span: s})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

// trace returns the spans of the trace id.
func (c *collector) trace(id trace.TraceID) []*exported {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*exported
	for _, e := range c.spans {
		if trace.TraceID(e.span.TraceId) == id {
			out = append(out, e)
		}
	}
	return out
}

// TestTracing: with an OTLP endpoint, a check sent with a traceparent
// (as Envoy sends it) to a node that does not own its key is traced end
// to end, in the caller's trace: the receiving node's server span (from
// received to answered), its forward to the owner, and the owner's span,
// whose events say when the check was decided, committed and copied to
// the standby. Nothing else is traced: health checks are not.
func TestTracing(t *testing.T) {
	t.Parallel()
	col := newCollector(t)
	tc := newTestClusterWith(t, 2, func(c *Config) {
		c.Router.Replicas = 2
		c.Tracing = TracingConfig{Endpoint: "http://" + col.addr, SampleRatio: 1}
	})
	key := tc.keyOwnedBy("traced:", "node-1")

	// The caller's span context, sampled, sent as W3C traceparent.
	tid := trace.TraceID{0x5a, 0x1c, 0xe0, 1}
	caller := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{1, 2, 3}, TraceFlags: trace.FlagsSampled})
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), caller), carrier)
	ctx := metadata.AppendToOutgoingContext(tc.nodes[0].ctx(), "traceparent", carrier.Get("traceparent"))
	if _, err := tc.client(0).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 10, time.Minute, 1)}}); err != nil {
		t.Fatalf("Check(%s) through node-0: %v", key, err)
	}
	// Spans are exported in batches: stopping the nodes flushes them.
	for _, ts := range tc.nodes {
		ts.stop()
	}

	spans := col.trace(tid)
	find := func(node, name string, kind tracepb.Span_SpanKind) *tracepb.Span {
		for _, e := range spans {
			if e.node == node && e.span.Name == name && e.span.Kind == kind {
				return e.span
			}
		}
		var got []string
		for _, e := range spans {
			got = append(got, e.node+" "+e.span.Name+" "+e.span.Kind.String())
		}
		t.Fatalf("no %s span %s on %s in the caller's trace; got %q", kind, name, node, got)
		return nil
	}
	received := find("node-0", "sluice.v1.RateLimitService/Check", tracepb.Span_SPAN_KIND_SERVER)
	forwarded := find("node-0", "sluice.v1.PeerService/Forward", tracepb.Span_SPAN_KIND_CLIENT)
	owner := find("node-1", "sluice.v1.PeerService/Forward", tracepb.Span_SPAN_KIND_SERVER)
	if trace.SpanID(received.ParentSpanId) != caller.SpanID() {
		t.Errorf("node-0's span has parent %x; want the caller's span %s", received.ParentSpanId, caller.SpanID())
	}
	if string(forwarded.ParentSpanId) != string(received.SpanId) || string(owner.ParentSpanId) != string(forwarded.SpanId) {
		t.Errorf("the forward's parent %x (want node-0's span %x), the owner's parent %x (want the forward %x)",
			forwarded.ParentSpanId, received.SpanId, owner.ParentSpanId, forwarded.SpanId)
	}
	var events []string
	for _, ev := range owner.Events {
		if ev.Name != "message" {
			events = append(events, ev.Name)
		}
	}
	if want := []string{"decided", "committed", "copied to standby"}; !slices.Equal(events, want) {
		t.Errorf("the owner's span has events %q; want %q", events, want)
	}
	// node-0's span starts before the owner's and ends after the owner
	// decided (the owner's span itself ends once its answer is written,
	// which on a loaded machine may be after node-0 has read it).
	if received.StartTimeUnixNano > owner.StartTimeUnixNano {
		t.Errorf("node-0's span starts at %d, after the owner's at %d", received.StartTimeUnixNano, owner.StartTimeUnixNano)
	}
	for _, ev := range owner.Events {
		if ev.Name != "message" && ev.TimeUnixNano > received.EndTimeUnixNano {
			t.Errorf("the owner's event %q at %d comes after node-0's span ended at %d", ev.Name, ev.TimeUnixNano, received.EndTimeUnixNano)
		}
	}
	col.mu.Lock()
	for _, e := range col.spans {
		if e.span.Name == "grpc.health.v1.Health/Check" {
			t.Errorf("a health check was traced: %s on %s", e.span.Name, e.node)
		}
	}
	col.mu.Unlock()
}

// BenchmarkCheckTracing measures a native check of one key through a
// node's gRPC API, in memory mode, from 16 concurrent callers: with
// tracing off (the default), on with no call sampled (the cost of the
// instrumentation alone), and on with every call sampled and exported to a
// collector.
func BenchmarkCheckTracing(b *testing.B) {
	for _, mode := range []string{"off", "unsampled", "sampled"} {
		b.Run(mode, func(b *testing.B) {
			var col *collector
			ts := newTestServer(b, func(c *Config) {
				c.Engine.Store = nil
				c.Durability = "memory"
				switch mode {
				case "unsampled":
					c.Tracing = TracingConfig{Endpoint: "http://127.0.0.1:1", SampleRatio: 1e-12}
				case "sampled":
					col = newCollector(b)
					c.Tracing = TracingConfig{Endpoint: "http://" + col.addr, SampleRatio: 1}
				}
			})
			client := sluicepb.NewRateLimitServiceClient(ts.conn)
			req := &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("bench", 1<<40, time.Hour, 1)}}
			ctx := ts.ctx()
			b.SetParallelism(8) // 16 callers on 2 CPUs
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := client.Check(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
