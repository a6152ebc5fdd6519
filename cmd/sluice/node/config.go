package node

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/debug"
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
	// LeaseHotKeys, if positive, makes the node decide from quota leases
	// the Envoy keys it does not own that it receives at least this many
	// checks a second of (see api.Config.LeaseHotKeys). 0: off.
	LeaseHotKeys float64
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
	// Insecure lets the node serve the admin API, refunds and, in a
	// cluster, the peer service on an address that is not loopback without
	// a credential (AdminToken, RefundToken or TLSClientCA): anyone who
	// reaches the port can then use them. Validate refuses such a listener
	// without it; with it, New logs a warning. Default off.
	Insecure bool
	// MemoryLimit is the container's memory limit in bytes: unless the
	// GOMEMLIMIT variable is set, New sets the Go runtime's soft memory
	// limit to 90% of it (see SetRuntimeLimits). Default 0: none given.
	MemoryLimit int64
	// Engine configures the actors; its Store, Clock and Logger are set by
	// New.
	Engine actor.Config
	// Cluster, when not nil, makes the node a member of a cluster: its
	// NodeName and its gRPC, peer and admin addresses are set by Start.
	// Nil runs a single node.
	Cluster *cluster.Config
	// Router tunes forwarding and handoff in a cluster; its Membership,
	// Control, Engine, Self and DialOptions are set by Start. Its Replicas
	// is 1 or 2; 0 takes the default, 2 with a data file and 1 with
	// durability "memory" (see DefaultReplicas).
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
// data file in ./sluice-data: the defaults sluice serve's flags show.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "sluice"
	}
	cfg := Config{
		NodeName:               host,
		GRPCAddr:               "127.0.0.1:8081",
		HTTPAddr:               "127.0.0.1:8080",
		DataDir:                "sluice-data",
		Durability:             "commit",
		LimitsXDS:              LimitsXDSConfig{NodeID: "default"},
		LimitsPollInterval:     2 * time.Second,
		TLSPollInterval:        30 * time.Second,
		RateLimitHeadersFormat: string(api.HeadersIETF),
		RuleMetricsMaxKeys:     api.DefaultRuleMetricsMaxKeys,
		NearLimitRatio:         api.DefaultNearLimitRatio,
		MaxMessageBytes:        4 << 20,
		MaxInflightBytes:       api.DefaultMaxInflightBytes,
		MaxConnInflightBytes:   api.DefaultMaxConnInflightBytes,
		BudgetWait:             api.DefaultBudgetWait,
		ShutdownTimeout:        10 * time.Second,
		Tracing:                TracingConfig{SampleRatio: 0.01, ServiceName: "sluice"},
	}.withTransportDefaults()
	cfg.Engine.Limits.MaxKeyLen = actor.DefaultMaxKeyLen
	cfg.Engine.Limits.MaxBatch = actor.DefaultMaxBatch
	cfg.Control.Settings.Lease = 2 * time.Second
	return cfg
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

// WithDefaults returns c with the defaults that its zero fields stand for
// filled in, as New runs it: the clock, the logger, the sizes and
// durations of the transport, and in a cluster the replicas.
func (c Config) WithDefaults() Config {
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 4 << 20
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.TLSPollInterval == 0 {
		c.TLSPollInterval = 30 * time.Second
	}
	if c.Router.Replicas == 0 {
		c.Router.Replicas = DefaultReplicas(c.Durability)
	}
	return c.withTransportDefaults()
}

// DefaultReplicas is what Config.Router.Replicas 0 stands for with
// durability: a standby per key with a data file, none in memory mode
// (which keeps no copies).
func DefaultReplicas(durability string) int {
	if durability == "memory" {
		return 1
	}
	return 2
}

// Validate reports every setting of c that cannot work, all at once
// (joined with errors.Join), each saying what to change.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("node: config: "+format, args...))
	}
	if c.NodeName == "" {
		bad("node name is empty; set --node-name")
	}
	if c.GRPCAddr == "" {
		bad("gRPC address is empty; set --grpc-addr")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("--tls-cert and --tls-key go together")
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		bad("--tls-client-ca needs --tls-cert and --tls-key")
	}
	for _, f := range []struct {
		flag string
		v    int64
	}{
		{"actors", int64(c.Engine.Actors)},
		{"max-keys", int64(c.Engine.MaxKeys)},
		{"mailbox-size", int64(c.Engine.MailboxSize)},
		{"max-key-len", int64(c.Engine.Limits.MaxKeyLen)},
		{"max-batch", int64(c.Engine.Limits.MaxBatch)},
		{"max-message-bytes", int64(c.MaxMessageBytes)},
		{"max-connections", int64(c.MaxConnections)},
		{"max-concurrent-streams", int64(c.MaxConcurrentStreams)},
		{"max-inflight-bytes", c.MaxInflightBytes},
		{"max-conn-inflight-bytes", c.MaxConnInflightBytes},
		{"rule-metrics-max-keys", int64(c.RuleMetricsMaxKeys)},
	} {
		if f.v < 0 {
			bad("--%s %d: must not be negative", f.flag, f.v)
		}
	}
	for _, f := range []struct {
		flag string
		v    time.Duration
	}{
		{"limits-poll-interval", c.LimitsPollInterval},
		{"tls-poll-interval", c.TLSPollInterval},
		{"budget-wait", c.BudgetWait},
		{"shutdown-timeout", c.ShutdownTimeout},
		{"keepalive-time", c.KeepaliveTime},
		{"keepalive-timeout", c.KeepaliveTimeout},
		{"max-connection-idle", c.MaxConnectionIdle},
		{"keepalive-min-time", c.KeepaliveMinTime},
		{"max-connection-age", c.MaxConnectionAge},
		{"max-connection-age-grace", c.MaxConnectionAgeGrace},
	} {
		if f.v < 0 {
			bad("--%s %v: must not be negative", f.flag, f.v)
		}
	}
	if err := c.Tracing.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.KeepaliveTime > 0 && c.KeepaliveTime < time.Second {
		bad("--keepalive-time %v: at least 1s (gRPC pings no more often)", c.KeepaliveTime)
	}
	if c.MaxConcurrentStreams > math.MaxUint32 {
		bad("--max-concurrent-streams %d: at most %d", c.MaxConcurrentStreams, uint32(math.MaxUint32))
	}
	if c.LimitsFile != "" && c.LimitsXDS.Server != "" {
		bad("--limits-file and --limits-xds-server both give the limits; set one")
	}
	if c.PeerAddr != "" && c.Cluster == nil {
		bad("--peer-addr serves the peer service, which only a cluster node has; set --gossip-addr or --join, or leave it empty")
	}
	if r := c.LeaseHotKeys; r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		bad("--lease-hot-keys %v: want checks a second (0 for off)", r)
	}
	if r := c.NearLimitRatio; r < 0 || r > 1 || math.IsNaN(r) {
		bad("--near-limit-ratio %v: want a share of the limit, above 0 and at most 1", r)
	}
	for _, d := range c.UsageDomains {
		if d == "" {
			bad("--usage-domain: an empty domain; name a domain, or \"*\" for every domain")
			break
		}
	}
	if format, err := api.ParseHeaderFormat(c.RateLimitHeadersFormat); err != nil {
		bad("--rate-limit-headers-format %q: want ietf or draft03", c.RateLimitHeadersFormat)
	} else if c.RateLimitHeaderNames != (api.HeaderNames{}) && format != api.HeadersDraft03 {
		bad("--limit-limit-header, --limit-remaining-header and --limit-reset-header name the fields of --rate-limit-headers-format draft03; set it, or leave them empty")
	}
	if err := distinctAddrs(map[string]string{"grpc-addr": c.GRPCAddr, "peer-addr": c.PeerAddr, "admin-addr": c.AdminAddr, "http-addr": c.HTTPAddr, "health-addr": c.HealthAddr}); err != nil {
		errs = append(errs, err)
	}
	if c.Cluster != nil && c.DataDir == "" {
		bad("data dir is empty; a cluster node keeps its Raft log and vote there, even with --durability memory: set --data-dir")
	}
	if c.Durability != "memory" {
		if _, err := persist.ParseMode(c.Durability); err != nil {
			bad("durability %q: want commit, fsync, async or memory", c.Durability)
		} else if c.DataDir == "" && c.Cluster == nil {
			bad("data dir is empty; set --data-dir or --durability memory")
		}
	}
	if c.Cluster != nil {
		errs = append(errs, c.validateCluster()...)
	}
	if !c.Insecure {
		errs = append(errs, c.openListener())
	}
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateCluster reports the cluster settings that cannot work: an
// unset expect, and the replicas with the durability.
func (c Config) validateCluster() []error {
	var errs []error
	if c.Cluster.Expect < 1 {
		errs = append(errs, errors.New("node: config: --expect: set how many nodes bootstrap the cluster together (the StatefulSet's replicas, or the N of scripts/cluster-up.sh): a node with no Raft state waits for that many, so that nodes started apart never form two clusters"))
	}
	return append(errs, c.validateReplicas()...)
}

// validateReplicas reports the replicas that cannot work with the
// durability.
func (c Config) validateReplicas() []error {
	switch replicas := c.Router.Replicas; {
	case c.Control.Settings.Partitions > 0 && (replicas < 0 || replicas > 3):
		return []error{fmt.Errorf("node: config: --replicas %d with --partitions: want 1, 2 or 3", replicas)}
	case c.Control.Settings.Partitions == 0 && (replicas < 0 || replicas > 2):
		return []error{fmt.Errorf("node: config: --replicas %d: want 1 or 2 (3 with --partitions)", replicas)}
	case replicas >= 2 && c.Durability == "memory":
		return []error{fmt.Errorf("node: config: --replicas %d with --durability memory: a node in memory mode keeps no copies; use 1, or a data file", replicas)}
	case c.Durability == "async" && (replicas >= 2 || replicas == 0 && DefaultReplicas(c.Durability) == 2):
		return []error{errors.New("node: config: --durability async with --replicas 2 or more: async acknowledges a decision before anything is written or copied, so a standby could miss acknowledged hits and take over without them; use --durability commit (the default) or fsync, or --replicas 1")}
	}
	return nil
}

// openListener reports the first listener of c that would serve, to the
// network and without a credential, the peer service in a cluster
// (forwarded checks, handoffs, standby copies, Raft), the admin API
// (resets, overrides) or refunds (gRPC, and /json on the HTTP listener):
// on an address that is not loopback, with no admin token, no client CA
// and, for refunds, no refund token. Config.Insecure skips it. One error
// at most: the fix is the same for all.
func (c Config) openListener() error {
	if c.AdminToken != "" || c.TLSClientCA != "" {
		return nil
	}
	if c.Cluster != nil {
		peerFlag, peerAddr := "--grpc-addr", c.GRPCAddr
		if c.PeerAddr != "" {
			peerFlag, peerAddr = "--peer-addr", c.PeerAddr
		}
		if !isLoopback(peerAddr) {
			return fmt.Errorf("node: config: %s %s: a cluster node serves its peer service (forwarded checks, handoffs, standby copies) and Raft on that port, and without --admin-token (the same on every node) or --tls-client-ca anyone who reaches it can forge them; set one (see docs/security.md), or pass --insecure to run without", peerFlag, peerAddr)
		}
	}
	adminFlag, adminAddr := "--grpc-addr", c.GRPCAddr
	if c.AdminAddr != "" {
		adminFlag, adminAddr = "--admin-addr", c.AdminAddr
	}
	if !isLoopback(adminAddr) {
		return fmt.Errorf("node: config: %s %s: the admin API (key reset, overrides) would be open to the network: without --admin-token or --tls-client-ca anyone who reaches that port can reset keys and raise limits; set one (see docs/security.md), listen on a loopback address, or pass --insecure to run without", adminFlag, adminAddr)
	}
	if c.RefundToken != "" {
		return nil
	}
	for _, l := range []struct{ flag, addr string }{{"--grpc-addr", c.GRPCAddr}, {"--http-addr", c.HTTPAddr}} {
		if l.addr != "" && !isLoopback(l.addr) {
			return fmt.Errorf("node: config: %s %s: refunds would be open to the network: without --refund-token, --admin-token or --tls-client-ca anyone who reaches that port can give counted hits back; set one (see docs/security.md), listen on a loopback address, or pass --insecure to run without", l.flag, l.addr)
		}
	}
	return nil
}

// isLoopback reports whether addr's host is a loopback address.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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

// goMemoryLimitShare is the share of the container's memory limit that
// the Go runtime's soft limit takes: the rest is for what the kernel
// charges to the container and the runtime does not count (the data
// file's pages, socket buffers; docs/operations.md, "The Go runtime").
const goMemoryLimitShare = 0.9

// GoMemoryLimit is the soft limit to give the Go runtime for a container
// limit of limit bytes, and whether to set one: not without a limit, nor
// when GOMEMLIMIT (gomemlimit, the variable's value) chose already.
func GoMemoryLimit(limit int64, gomemlimit string) (int64, bool) {
	if limit <= 0 || gomemlimit != "" {
		return 0, false
	}
	return int64(float64(limit) * goMemoryLimitShare), true
}

// SetRuntimeLimits sets what cfg asks of the Go runtime, for the whole
// process: with durability "fsync" on one CPU, GOMAXPROCS 2 (unless the
// GOMAXPROCS variable chose); under a container's memory limit
// (MemoryLimit), the runtime's soft limit (unless GOMEMLIMIT chose). New
// calls it before it sizes the engine; a command calls it first so that
// its start-up log shows what the node runs with. Setting the same twice
// changes nothing.
func SetRuntimeLimits(cfg Config, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Durability == "fsync" && runtime.GOMAXPROCS(0) == 1 && os.Getenv("GOMAXPROCS") == "" {
		// The store's writer spends most of its time in fdatasync, and the
		// runtime keeps the writer's P until sysmon takes it back: with a
		// single P nothing else runs meanwhile, so the next decisions do
		// not queue up to share the next sync (1.2 records per commit and
		// 2.6k decisions/s on one core here; 10k/s with a second P).
		runtime.GOMAXPROCS(2)
		log.Info("fsync durability with one CPU: GOMAXPROCS raised to 2 so that decisions go on during an fdatasync (set GOMAXPROCS to choose)")
	}
	if limit, ok := GoMemoryLimit(cfg.MemoryLimit, os.Getenv("GOMEMLIMIT")); ok && debug.SetMemoryLimit(-1) != limit {
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit set under the container's", "memory_limit", cfg.MemoryLimit, "gomemlimit", limit)
	}
}
