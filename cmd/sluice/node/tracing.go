package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"
)

// TracingConfig configures the node's OpenTelemetry traces. The zero value
// traces nothing, at no cost: no span is started, no context read.
type TracingConfig struct {
	// Endpoint is the URL of the OTLP collector's HTTP receiver
	// (protobuf): http://host:4318, https:// for TLS with the system's
	// roots; the spans go to its path, /v1/traces when it names none.
	// Empty: no tracing. OTLP over gRPC is not offered (see otlpClient).
	Endpoint string
	// SampleRatio is the share of the calls that carry no sampling
	// decision that are traced, from 0 to 1. A call whose caller (Envoy)
	// sent a traceparent follows its caller's decision. Default 0.01.
	SampleRatio float64
	// ServiceName is the service.name of the spans. Default "sluice".
	ServiceName string
}

// Enabled reports whether the node traces.
func (c TracingConfig) Enabled() bool { return c.Endpoint != "" }

// validate reports a bad field, or nil.
func (c TracingConfig) validate() error {
	if !c.Enabled() {
		return nil
	}
	u, err := url.Parse(c.Endpoint)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("node: config: --otlp-endpoint %q: want http://host:port or https://host:port", c.Endpoint)
	case c.SampleRatio < 0 || c.SampleRatio > 1:
		return fmt.Errorf("node: config: --trace-sample-ratio %v: want from 0 to 1", c.SampleRatio)
	}
	return nil
}

// tracing is a node's tracer provider and what it hands the gRPC servers
// and clients; nil when the node does not trace.
type tracing struct {
	provider *sdktrace.TracerProvider
	prop     propagation.TextMapPropagator
}

// newTracing starts the exporter and the provider of cfg, for the node
// named node; nil, nil when cfg traces nothing. The exporter connects
// lazily: a collector that is down loses spans, never calls.
func newTracing(cfg TracingConfig, node, version string) (*tracing, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	u, _ := url.Parse(cfg.Endpoint) // validated
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces" // OTLP/HTTP's path for traces
	}
	exp, err := otlptrace.New(context.Background(), &otlpClient{url: u.String(), http: &http.Client{Timeout: otlpTimeout}})
	if err != nil {
		return nil, fmt.Errorf("node: tracing: %w", err)
	}
	name := cfg.ServiceName
	if name == "" {
		name = "sluice"
	}
	ratio := cfg.SampleRatio
	if ratio == 0 {
		ratio = 0.01
	}
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(name), semconv.ServiceInstanceID(node), semconv.ServiceVersion(version))
	return &tracing{
		provider: sdktrace.NewTracerProvider(
			sdktrace.WithBatcher(exp),
			sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		),
		prop: propagation.TraceContext{},
	}, nil
}

// traced are the calls that get spans: decisions, and the forwards that
// carry them to their owners. Health checks, admin and the other peer
// calls do not.
var traced = filters.Any(
	filters.ServiceName("sluice.v1.RateLimitService"),
	filters.ServiceName("envoy.service.ratelimit.v3.RateLimitService"),
	filters.FullMethodName("/sluice.v1.PeerService/Forward"),
)

func (t *tracing) options(extra ...otelgrpc.Option) []otelgrpc.Option {
	return append([]otelgrpc.Option{
		otelgrpc.WithTracerProvider(t.provider),
		otelgrpc.WithPropagators(t.prop),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()), // the node's metrics are Prometheus'
		otelgrpc.WithFilter(traced),
		otelgrpc.WithMessageEvents(otelgrpc.ReceivedEvents, otelgrpc.SentEvents),
	}, extra...)
}

// serverHandler traces the node's calls, each span the child of the
// caller's when it sent a traceparent.
func (t *tracing) serverHandler(node string) stats.Handler {
	return otelgrpc.NewServerHandler(t.options(otelgrpc.WithSpanAttributes(attribute.String("sluice.node", node)))...)
}

// dialOption traces the node's calls to its peers and sends them the
// trace context.
func (t *tracing) dialOption() grpc.DialOption {
	return grpc.WithStatsHandler(otelgrpc.NewClientHandler(t.options()...))
}

// tracingFlushTimeout bounds the export of the spans still buffered at
// shutdown: a collector that is down delays a stop no longer.
const tracingFlushTimeout = 5 * time.Second

// shutdown exports the spans still buffered, within tracingFlushTimeout
// (whatever is left of the node's shutdown timeout), and stops the
// exporter.
func (t *tracing) shutdown() error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
	defer cancel()
	if err := t.provider.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("node: tracing: %w", err)
	}
	return nil
}

// otlpTimeout bounds one export.
const otlpTimeout = 10 * time.Second

// otlpClient sends the spans otlptrace has turned into OTLP to the
// collector's OTLP/HTTP receiver, as protobuf: the protocol's one POST.
// Not OpenTelemetry's otlptracehttp (nor otlptracegrpc): both link
// gRPC's gzip compressor in, which registers itself for the whole
// process, and every gRPC call of the node then carries one more header
// each way (4 allocations and 1.2 KB a call, tracing or not).
type otlpClient struct {
	url  string
	http *http.Client
}

func (c *otlpClient) Start(context.Context) error { return nil }

func (c *otlpClient) Stop(context.Context) error {
	c.http.CloseIdleConnections()
	return nil
}

// UploadTraces posts one export request.
func (c *otlpClient) UploadTraces(ctx context.Context, spans []*tracepb.ResourceSpans) error {
	body, err := proto.Marshal(&collectorpb.ExportTraceServiceRequest{ResourceSpans: spans})
	if err != nil {
		return fmt.Errorf("otlp: encode: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("otlp: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("otlp: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("otlp: %s answered %s: %s", c.url, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
