package node

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"slices"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/api"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/persist"
)

// Config configures a node. Build it with DefaultConfig and change what you
// need; it is not modified after New.
type Config struct {
	// NodeName names the node in decisions, logs and the cluster. Default:
	// the host name.
	NodeName string
	// GRPCAddr is where the gRPC API listens: decisions (native, Envoy RLS
	// v3) and health, and, unless they have listeners of their own, the
	// admin service with reflection, and the peer service. Default
	// 127.0.0.1:8081.
	GRPCAddr string
	// PeerAddr, when set, is the only listener of the peer service
	// (sluice.v1.PeerService: forwarded checks, handoffs, lease renewals,
	// standby copies) and of Raft, and the address the other members dial
	// for them. Only in a cluster. Default empty: both are on GRPCAddr.
	PeerAddr string
	// AdminAddr, when set, is the only listener of the admin service
	// (sluice.v1.AdminService) and of server reflection; the other members
	// dial it for the admin calls they fan out. Default empty: both are on
	// GRPCAddr.
	AdminAddr string
	// HTTPAddr is where /metrics, /healthz, /readyz, the web UI (/ui/) and
	// envoyproxy/ratelimit's /json and /rlconfig listen. Default
	// 127.0.0.1:8080. Empty disables the HTTP listener.
	HTTPAddr string
	// HealthAddr, when set, serves /healthz and /readyz (as on HTTPAddr)
	// and nothing else, in plain HTTP even with TLS on and without asking
	// for a client certificate: for probes that can do neither, such as
	// the kubelet's. Default empty: no such listener.
	HealthAddr string
	// DataDir holds the data file, sluice.db. Default "sluice-data".
	DataDir string
	// Durability is "commit" (default: a decision is acknowledged once its
	// hits are written to the data file; survives kill -9), "fsync" (also
	// synced to the disk; survives power loss), "async" (acknowledged at
	// once, written continuously; kill -9 loses the last few milliseconds)
	// or "memory" (no data file; a restart forgets everything).
	Durability string
	// LimitsFile is an envoyproxy/ratelimit YAML file, or a directory of
	// them, giving limits to descriptors and keys that carry none. Reloaded
	// when it changes. Empty: no limits file.
	LimitsFile string
	// LimitsXDS, when its Server is set, takes the limits from an xDS
	// management server instead of LimitsFile.
	LimitsXDS LimitsXDSConfig
	// MergeDomainConfig lets a domain span several files of LimitsFile
	// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it, two files
	// with the same domain are an error. Default off.
	MergeDomainConfig bool
	// LimitsPollInterval is how often the limits file is checked for
	// changes. Default 2s.
	LimitsPollInterval time.Duration
	// AcceptWALLoss opens a data file whose WAL ends with a damaged frame,
	// dropping it (see persist.Options.AcceptWALLoss).
	AcceptWALLoss bool
	// AdminToken, when set, is the bearer token the admin API requires.
	AdminToken string
	// RefundToken, when set, is a bearer token that allows refunds and
	// nothing else (see api.Config.RefundToken).
	RefundToken string
	// TLSCert and TLSKey, when set, serve gRPC and HTTP over TLS.
	TLSCert, TLSKey string
	// TLSClientCA, when set, requires client certificates signed by it.
	TLSClientCA string
	// TLSPollInterval is how often the TLS certificate, key and client CA
	// are read again; changed files are served from the next handshake
	// on (files that cannot be used are refused, keeping the previous
	// ones). Default 30s.
	TLSPollInterval time.Duration
	// RateLimitHeaders makes Envoy responses carry rate limit header
	// fields for the client, in RateLimitHeadersFormat.
	RateLimitHeaders bool
	// RateLimitHeadersFormat is "ietf" (default, also ""): the current
	// IETF draft's RateLimit-Policy, RateLimit and Retry-After; or
	// "draft03": envoyproxy/ratelimit's three fields, named by
	// RateLimitHeaderNames.
	RateLimitHeadersFormat string
	// RateLimitHeaderNames names the "draft03" fields; empty names take
	// envoyproxy/ratelimit's defaults (RateLimit-Limit,
	// RateLimit-Remaining, RateLimit-Reset).
	RateLimitHeaderNames api.HeaderNames
	// ShadowMode puts every limit of Envoy requests in shadow mode:
	// counted and reported, never OVER_LIMIT (envoyproxy/ratelimit's
	// SHADOW_MODE). Default off.
	ShadowMode bool
	// UsageDomains lists the Envoy domains whose every descriptor reports
	// usage already spent (token budgets): recorded even when it does not
	// fit, as a limits file rule with usage: true is; "*" marks every
	// domain. Default none. See docs/envoy.md, "Token budgets".
	UsageDomains []string
	// ResponseDynamicMetadata makes Envoy responses carry dynamic metadata:
	// the request, and the metadata of the limits file's rules that allowed
	// it (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA). Default off.
	ResponseDynamicMetadata bool
	// RuleMetricsMaxKeys bounds the per-rule statistics keys that hold
	// request values (detailed_metric, value_to_metric, inline limits);
	// past it they are counted under key "other". Default 1000.
	RuleMetricsMaxKeys int
	// NearLimitRatio is the share of a limit above which allowed hits
	// count as near the limit in the per-rule statistics, in (0, 1].
	// Default 0.8 (envoyproxy/ratelimit's NEAR_LIMIT_RATIO).
	NearLimitRatio float64
	// Pprof serves Go's profiles on the HTTP listener under /debug/pprof/.
	// Off by default: profiles reveal internals and cost CPU while taken.
	Pprof bool
	// MaxMessageBytes bounds a gRPC request. Default 4 MiB.
	MaxMessageBytes int
	// MaxConnections bounds the connections each listener (every gRPC
	// one, and HTTP) holds open at once; past it, a new connection waits
	// in the kernel's accept queue, unanswered, until one closes. Default
	// 1024 (DefaultMaxConnections).
	MaxConnections int
	// MaxInflightBytes bounds the bytes of the decision requests (native and Envoy)
	// the node works on at once (as received, before decoding); past it a
	// call waits up to BudgetWait (or its deadline), then is refused with
	// RESOURCE_EXHAUSTED. It bounds the memory of the calls being worked
	// on, whatever their number. Default 2 MiB (api.DefaultMaxInflightBytes).
	MaxInflightBytes int64
	// MaxConnInflightBytes is MaxInflightBytes for the calls of one
	// connection, so that one client cannot take all of it. Default 512
	// KiB (api.DefaultMaxConnInflightBytes).
	MaxConnInflightBytes int64
	// BudgetWait is the longest a call waits for MaxInflightBytes or
	// MaxConnInflightBytes. Default 1s (api.DefaultBudgetWait).
	BudgetWait time.Duration
	// MaxConcurrentStreams bounds the calls in flight on one gRPC
	// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): past it, gRPC
	// clients queue their calls and Envoy opens another connection; a
	// client that ignores the setting has the extra streams refused. A
	// call counts until its answer has been sent, so a client that does
	// not read its answers holds at most this many per connection.
	// Default 128 (DefaultMaxConcurrentStreams).
	MaxConcurrentStreams int
	// KeepaliveTime is how long a gRPC connection may be silent (no frame
	// from the client) before the node pings the client; at least 1s.
	// Default 30s.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long the node waits for a frame after its
	// ping before it closes the connection: a dead client, or one that
	// stopped reading, is dropped within KeepaliveTime + KeepaliveTimeout.
	// Default 10s.
	KeepaliveTimeout time.Duration
	// MaxConnectionIdle closes (GOAWAY) a gRPC connection that had no call
	// in flight for this long; clients reconnect when they next call.
	// Default 5m.
	MaxConnectionIdle time.Duration
	// MaxConnectionAge sends away (GOAWAY) a gRPC connection this long
	// after it opened, give or take 10% (gRPC's jitter), so that
	// long-lived clients such as Envoy spread their connections over the
	// nodes again after a scale-up; they reconnect at once, and calls in
	// flight finish within MaxConnectionAgeGrace. Zero takes the default,
	// 5m (DefaultMaxConnectionAge); a very long age (8760h) keeps
	// connections as long as they live.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long calls in flight on a connection
	// sent away for its age may take before it is closed. Default 30s.
	MaxConnectionAgeGrace time.Duration
	// KeepaliveMinTime is the shortest interval at which clients may ping
	// the node, with or without calls in flight; a client that pings more
	// often is disconnected (GOAWAY ENHANCE_YOUR_CALM, "too_many_pings").
	// Default 5s.
	KeepaliveMinTime time.Duration
	// ShutdownTimeout bounds a graceful shutdown before in-flight calls are
	// cut. Default 10s.
	ShutdownTimeout time.Duration
	// Engine configures the actors; its Store, Clock and Logger are set by
	// New.
	Engine actor.Config
	// Cluster, when not nil, makes the node a member of a cluster: its
	// NodeName and its gRPC, peer and admin addresses are set by Start.
	// Nil runs a single node.
	Cluster *cluster.Config
	// Router tunes forwarding and handoff in a cluster; its Membership,
	// Control, Engine, Self and DialOptions are set by Start.
	Router cluster.RouterConfig
	// Control tunes the control plane in a cluster: its Settings.Lease
	// (L, default 2s), Zone, ClockDrift and RaftTimeout. Its node name,
	// data directory, expect, replicas, policy, addresses, gossip and
	// transport are set by Start.
	Control control.Config
	// Tracing exports OpenTelemetry traces of the decisions; the zero
	// value traces nothing, at no cost (see TracingConfig).
	Tracing TracingConfig
	// Clock tells the time; nil is the wall clock.
	Clock clock.Clock
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
	// Build describes the binary in sluice_build_info. Empty fields are
	// read from the Go build info (runtime/debug).
	Build BuildInfo
}

// BuildInfo is the version of the binary a node runs.
type BuildInfo struct {
	// Version is the release ("v1.2.3"), or "(devel)".
	Version string
	// Revision is the VCS commit the binary was built from, or "unknown".
	Revision string
}

// DefaultConfig returns the configuration of a single node on an embedded
// data file in ./sluice-data.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "sluice"
	}
	return Config{
		NodeName:           host,
		GRPCAddr:           "127.0.0.1:8081",
		HTTPAddr:           "127.0.0.1:8080",
		DataDir:            "sluice-data",
		Durability:         "commit",
		LimitsPollInterval: 2 * time.Second,
		TLSPollInterval:    30 * time.Second,
		MaxMessageBytes:    4 << 20,
		ShutdownTimeout:    10 * time.Second,
	}.withTransportDefaults()
}

// Defaults of the transport's bounds (see Config).
const (
	DefaultMaxConnections       = 1024
	DefaultMaxConcurrentStreams = 128
	// DefaultMaxConnectionAge and DefaultMaxConnectionAgeGrace: after a
	// scale-up, every connection has moved within about 5.5 minutes.
	DefaultMaxConnectionAge      = 5 * time.Minute
	DefaultMaxConnectionAgeGrace = 30 * time.Second
)

// withTransportDefaults fills in the connection and stream bounds that are
// zero.
func (c Config) withTransportDefaults() Config {
	set := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	set(&c.KeepaliveTime, 30*time.Second)
	set(&c.KeepaliveTimeout, 10*time.Second)
	set(&c.MaxConnectionIdle, 5*time.Minute)
	set(&c.KeepaliveMinTime, 5*time.Second)
	set(&c.MaxConnectionAge, DefaultMaxConnectionAge)
	set(&c.MaxConnectionAgeGrace, DefaultMaxConnectionAgeGrace)
	return c
}

// Validate reports a configuration that cannot work, saying what to change.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("node: config: node name is empty; set --node-name")
	case c.GRPCAddr == "":
		return errors.New("node: config: gRPC address is empty; set --grpc-addr")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("node: config: --tls-cert and --tls-key go together")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return errors.New("node: config: --tls-client-ca needs --tls-cert and --tls-key")
	case c.MaxMessageBytes < 0 || c.MaxInflightBytes < 0 || c.MaxConnInflightBytes < 0 || c.BudgetWait < 0 || c.ShutdownTimeout < 0 || c.LimitsPollInterval < 0 || c.TLSPollInterval < 0 ||
		c.MaxConnections < 0 || c.MaxConcurrentStreams < 0 || c.KeepaliveTime < 0 || c.KeepaliveTimeout < 0 ||
		c.MaxConnectionIdle < 0 || c.KeepaliveMinTime < 0 || c.MaxConnectionAge < 0 || c.MaxConnectionAgeGrace < 0:
		return errors.New("node: config: sizes and durations must not be negative")
	case c.Tracing.validate() != nil:
		return c.Tracing.validate()
	case c.KeepaliveTime != 0 && c.KeepaliveTime < time.Second:
		return fmt.Errorf("node: config: --keepalive-time %v: at least 1s (gRPC pings no more often)", c.KeepaliveTime)
	case c.MaxConcurrentStreams > math.MaxUint32:
		return fmt.Errorf("node: config: --max-concurrent-streams %d: at most %d", c.MaxConcurrentStreams, uint32(math.MaxUint32))
	case c.LimitsFile != "" && c.LimitsXDS.Server != "":
		return errors.New("node: config: --limits-file and --limits-xds-server both give the limits; set one")
	case c.PeerAddr != "" && c.Cluster == nil:
		return errors.New("node: config: --peer-addr serves the peer service, which only a cluster node has; set --gossip-addr or --join, or leave it empty")
	}
	if c.RuleMetricsMaxKeys < 0 {
		return fmt.Errorf("node: config: --rule-metrics-max-keys %d: must not be negative", c.RuleMetricsMaxKeys)
	}
	if r := c.NearLimitRatio; r < 0 || r > 1 || math.IsNaN(r) {
		return fmt.Errorf("node: config: --near-limit-ratio %v: want a share of the limit, above 0 and at most 1", r)
	}
	if format, err := api.ParseHeaderFormat(c.RateLimitHeadersFormat); err != nil {
		return fmt.Errorf("node: config: --rate-limit-headers-format %q: want ietf or draft03", c.RateLimitHeadersFormat)
	} else if c.RateLimitHeaderNames != (api.HeaderNames{}) && format != api.HeadersDraft03 {
		return errors.New("node: config: --limit-limit-header, --limit-remaining-header and --limit-reset-header name the fields of --rate-limit-headers-format draft03; set it, or leave them empty")
	}
	if err := distinctAddrs(map[string]string{"grpc-addr": c.GRPCAddr, "peer-addr": c.PeerAddr, "admin-addr": c.AdminAddr, "http-addr": c.HTTPAddr, "health-addr": c.HealthAddr}); err != nil {
		return err
	}
	if c.Cluster != nil && c.DataDir == "" {
		return errors.New("node: config: data dir is empty; a cluster node keeps its Raft log and vote there, even with --durability memory: set --data-dir")
	}
	if c.Durability != "memory" {
		if _, err := persist.ParseMode(c.Durability); err != nil {
			return fmt.Errorf("node: config: durability %q: want commit, fsync, async or memory", c.Durability)
		}
		if c.DataDir == "" {
			return errors.New("node: config: data dir is empty; set --data-dir or --durability memory")
		}
	}
	return c.Engine.Validate()
}

// distinctAddrs reports two listeners configured on the same address (port
// 0 picks a free port for each, so it never clashes).
func distinctAddrs(addrs map[string]string) error {
	flags := slices.Sorted(maps.Keys(addrs))
	for i, a := range flags {
		for _, b := range flags[i+1:] {
			addr := addrs[a]
			if _, port, _ := net.SplitHostPort(addr); addr != "" && addr == addrs[b] && port != "0" {
				return fmt.Errorf("node: config: --%s and --%s are both %s; leave --peer-addr or --admin-addr empty to serve on --grpc-addr", a, b, addr)
			}
		}
	}
	return nil
}
