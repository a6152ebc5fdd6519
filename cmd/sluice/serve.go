package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/cmd/sluice/node"
)

// serveOptions holds the flags of serve: the node's configuration and how
// the command logs and reports.
type serveOptions struct {
	cfg       node.Config
	logFormat string
	logLevel  string
	readyFile string

	// Cluster flags: with --gossip-addr or --join the node joins a cluster.
	gossipAddr    string
	advertiseAddr string
	join          string
	gossipKey     string
	expect        int
	ownerPolicy   string
	// leaseClockRate, when not 0, runs the lease clock at that rate (the
	// fault suite's clock-drift rows; a hidden flag).
	leaseClockRate float64

	// ratelimitEnv is what envoyproxy/ratelimit's variables set, and
	// the ones found and ignored.
	ratelimitEnv ratelimitEnv

	// defaults are the options as the flags define them, before the
	// command line and the environment: the start-up line shows what
	// differs from them.
	defaults *serveOptions
}

func (c *cli) serveCommand() *cobra.Command {
	return c.serveCommandFor(&serveOptions{cfg: node.DefaultConfig()})
}

// serveCommandFor is serve with its flags bound to o, whose cfg gives
// their defaults.
func (c *cli) serveCommandFor(o *serveOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a Sluice node",
		Long: `Run a Sluice node: the native gRPC API, Envoy's Rate Limit Service v3
and grpc health on --grpc-addr, with the admin API (and reflection) and,
in a cluster, the peer service, unless --admin-addr or --peer-addr give
them listeners of their own; /metrics, /healthz and /readyz on
--http-addr.

The node logs its effective configuration (the tokens redacted), serves
until SIGINT or SIGTERM, then stops gracefully: it stops accepting calls,
lets the calls in flight finish within --shutdown-timeout, flushes the data
file and exits 0. A second signal exits at once with 128+signal.

Every flag also reads SLUICE_<FLAG>; the command line wins. Below both,
envoyproxy/ratelimit's variables with a meaning here are read too
(GRPC_PORT, RUNTIME_ROOT, LIMIT_RESPONSE_HEADERS_ENABLED, ...: see
docs/envoy.md), and those without one are listed in one log line.`,
		Example: `  sluice serve --data-dir /var/lib/sluice
  SLUICE_DURABILITY=fsync SLUICE_ADMIN_TOKEN=s3cret sluice serve`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rl, err := applyRatelimitEnv(cmd.Flags(), c.getenv)
			if err != nil {
				return err
			}
			o.ratelimitEnv = rl
			return c.serve(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	cfg := &o.cfg
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "name of this node in decisions, logs and the cluster")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "address of the gRPC API: decisions (native, Envoy RLS v3) and health; also admin and peer unless --admin-addr, --peer-addr; port 0 picks a free port")
	fs.StringVar(&cfg.PeerAddr, "peer-addr", "", "cluster: serve the peer service (forwarded checks, handoffs, lease renewals, standby copies) and Raft only on this address, which the other nodes dial; empty: on --grpc-addr")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", "", "serve the admin API and server reflection only on this address (the other nodes of a cluster dial it for admin calls); empty: on --grpc-addr")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "address of /metrics, /healthz, /readyz, the web UI (/ui/) and envoyproxy/ratelimit's /json and /rlconfig; empty disables them")
	fs.StringVar(&cfg.HealthAddr, "health-addr", "", "address of /healthz and /readyz alone, in plain HTTP even with --tls-cert and without client certificates: for probes that cannot speak TLS (the kubelet's); empty: none")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory of the data file, sluice.db")
	fs.Var(newEnumValue(&cfg.Durability, cfg.Durability, "commit", "fsync", "async", "memory"), "durability",
		"when a decision is acknowledged: commit (its hits are written to the data file; survives kill -9), fsync (and synced; survives power loss), async (at once; kill -9 loses the last milliseconds), memory (no data file)")
	fs.BoolVar(&cfg.AcceptWALLoss, "accept-wal-loss", false, "start even if the data file's write-ahead log ends with a damaged frame (acknowledged hits): drop that frame, keeping the file aside as .damaged")
	fs.StringVar(&cfg.LimitsFile, "limits-file", "", "envoyproxy/ratelimit YAML limits file, or a directory of them, reloaded when it changes")
	fs.StringVar(&cfg.LimitsXDS.Server, "limits-xds-server", "", "take the limits from this xDS management server (host:port) instead of --limits-file, as RateLimitConfig resources over ADS (envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW, CONFIG_GRPC_XDS_SERVER_URL); not ready until the first set arrives")
	fs.StringVar(&cfg.LimitsXDS.NodeID, "limits-xds-node-id", cfg.LimitsXDS.NodeID, "node id presented to --limits-xds-server, which picks the limits by it (CONFIG_GRPC_XDS_NODE_ID)")
	fs.StringVar(&cfg.LimitsXDS.CAFile, "limits-xds-ca", "", "CA file (PEM): connect to --limits-xds-server over TLS, verifying its certificate (CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	fs.StringVar(&cfg.LimitsXDS.CertFile, "limits-xds-cert", "", "client certificate file (PEM) presented to --limits-xds-server; needs --limits-xds-key and --limits-xds-ca (CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")
	fs.StringVar(&cfg.LimitsXDS.KeyFile, "limits-xds-key", "", "private key file (PEM) of --limits-xds-cert (CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")
	fs.StringToStringVar(&cfg.LimitsXDS.NodeMetadata, "limits-xds-node-metadata", nil, "key=value,... sent with the node id to --limits-xds-server (CONFIG_GRPC_XDS_NODE_METADATA)")
	fs.StringToStringVar(&cfg.LimitsXDS.Headers, "limits-xds-header", nil, "key=value,... added to the request metadata of the xDS stream, for example a token the server wants (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS)")
	fs.BoolVar(&cfg.MergeDomainConfig, "merge-domain-config", false, "let a domain span several files of --limits-file, their top-level descriptors put together (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it a domain in two files is an error")
	fs.Var(newDurationValue(&cfg.LimitsPollInterval, cfg.LimitsPollInterval), "limits-poll-interval", "how often the limits file is checked for changes")
	fs.StringVar(&cfg.AdminToken, "admin-token", "", "bearer token the admin API requires (empty: no token); it also allows refunds")
	fs.StringVar(&cfg.RefundToken, "refund-token", "", "bearer token that allows refunds (refund, is_negative_hits) and nothing else; with an admin or refund token set, a refund without one is refused")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "certificate file (PEM): serve gRPC and HTTP over TLS; needs --tls-key")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "private key file (PEM) of --tls-cert")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "CA file (PEM): require client certificates signed by it")
	fs.Var(newDurationValue(&cfg.TLSPollInterval, cfg.TLSPollInterval), "tls-poll-interval", "how often the --tls-cert, --tls-key and --tls-client-ca files are read again: changed ones are served from the next handshake on, without a restart (so is SIGHUP)")
	fs.BoolVar(&cfg.RateLimitHeaders, "rate-limit-headers", false, "add rate limit header fields to Envoy responses, in --rate-limit-headers-format")
	fs.Var(newEnumValue(&cfg.RateLimitHeadersFormat, cfg.RateLimitHeadersFormat, "ietf", "draft03"), "rate-limit-headers-format",
		"fields of --rate-limit-headers: ietf (the current draft: RateLimit-Policy, RateLimit, Retry-After) or draft03 (envoyproxy/ratelimit's: limit, remaining, reset, named by --limit-*-header)")
	fs.StringVar(&cfg.RateLimitHeaderNames.Limit, "limit-limit-header", "", "draft03: name of the limit field (empty: RateLimit-Limit; envoyproxy/ratelimit's LIMIT_LIMIT_HEADER)")
	fs.StringVar(&cfg.RateLimitHeaderNames.Remaining, "limit-remaining-header", "", "draft03: name of the remaining field (empty: RateLimit-Remaining; LIMIT_REMAINING_HEADER)")
	fs.StringVar(&cfg.RateLimitHeaderNames.Reset, "limit-reset-header", "", "draft03: name of the reset field (empty: RateLimit-Reset; LIMIT_RESET_HEADER)")
	fs.BoolVar(&cfg.ResponseDynamicMetadata, "response-dynamic-metadata", false, "Envoy responses carry dynamic metadata: the request, and the metadata of the limits file's rules that allowed it (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA)")
	fs.IntVar(&cfg.RuleMetricsMaxKeys, "rule-metrics-max-keys", cfg.RuleMetricsMaxKeys, "most per-rule statistics keys that hold request values (detailed_metric, value_to_metric, inline limits); the rest are counted under key \"other\"")
	fs.Float64Var(&cfg.LeaseHotKeys, "lease-hot-keys", 0, "cluster: decide from quota leases, as a limits-file rule with lease: true, the Envoy keys this node does not own that it receives at least this many checks a second of (over the last minute); 0 leaves leasing to lease rules")
	fs.Float64Var(&cfg.NearLimitRatio, "near-limit-ratio", cfg.NearLimitRatio, "share of a limit above which allowed hits count as near the limit in the per-rule statistics (envoyproxy/ratelimit's NEAR_LIMIT_RATIO)")
	fs.StringSliceVar(&cfg.UsageDomains, "usage-domain", nil, "Envoy domain whose every descriptor reports usage already spent (token budgets: hits_addend of apply_on_stream_done), recorded even over the limit; repeatable, or comma-separated; \"*\" for every domain")
	fs.BoolVar(&cfg.ShadowMode, "shadow", false, "every limit of Envoy requests in shadow mode: counted and reported, never OVER_LIMIT (envoyproxy/ratelimit's SHADOW_MODE)")
	fs.StringVar(&cfg.Tracing.Endpoint, "otlp-endpoint", "", "export OpenTelemetry traces of the decisions to this OTLP/HTTP collector: http://host:4318 (to /v1/traces unless the URL has a path), https:// for TLS; empty: no tracing, at no cost")
	fs.Float64Var(&cfg.Tracing.SampleRatio, "trace-sample-ratio", cfg.Tracing.SampleRatio, "share of the calls without a sampling decision from their caller that are traced (a caller's traceparent decides for its calls)")
	fs.StringVar(&cfg.Tracing.ServiceName, "trace-service-name", cfg.Tracing.ServiceName, "service.name of the spans")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's profiles on --http-addr under /debug/pprof/ (for profiling; off by default)")
	fs.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", cfg.MaxMessageBytes, "largest gRPC request, in bytes")
	fs.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "most connections each listener (gRPC, peer, admin, HTTP) holds open; past it new ones wait, unanswered, until one closes")
	fs.Int64Var(&cfg.MaxInflightBytes, "max-inflight-bytes", cfg.MaxInflightBytes, "most bytes of decision requests (native and Envoy) the node works on at once (as received); past it calls wait up to --budget-wait, then get RESOURCE_EXHAUSTED")
	fs.Int64Var(&cfg.MaxConnInflightBytes, "max-conn-inflight-bytes", cfg.MaxConnInflightBytes, "--max-inflight-bytes for the calls of one connection")
	fs.DurationVar(&cfg.BudgetWait, "budget-wait", cfg.BudgetWait, "longest a call waits for --max-inflight-bytes or --max-conn-inflight-bytes before RESOURCE_EXHAUSTED (its deadline, if sooner, ends the wait)")
	fs.IntVar(&cfg.MaxConcurrentStreams, "max-concurrent-streams", cfg.MaxConcurrentStreams, "most calls in flight on one gRPC connection, answered or not; past it clients queue their calls or open another connection")
	fs.Var(newDurationValue(&cfg.KeepaliveTime, cfg.KeepaliveTime), "keepalive-time", "ping a client whose connection was silent this long")
	fs.Var(newDurationValue(&cfg.KeepaliveTimeout, cfg.KeepaliveTimeout), "keepalive-timeout", "close a connection silent this long after the ping: a dead or stalled client is dropped")
	fs.Var(newDurationValue(&cfg.MaxConnectionIdle, cfg.MaxConnectionIdle), "max-connection-idle", "close (GOAWAY) a connection without a call in flight for this long; clients reconnect when they next call")
	fs.Var(newDurationValue(&cfg.MaxConnectionAge, cfg.MaxConnectionAge), "max-connection-age", "send away (GOAWAY) a gRPC connection this long after it opened (±10%), so that clients such as Envoy spread over the nodes again after a scale-up; they reconnect at once (envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE)")
	fs.Var(newDurationValue(&cfg.MaxConnectionAgeGrace, cfg.MaxConnectionAgeGrace), "max-connection-age-grace", "how long calls in flight on a connection sent away for its age may take before it is closed (GRPC_MAX_CONNECTION_AGE_GRACE)")
	fs.Var(newDurationValue(&cfg.KeepaliveMinTime, cfg.KeepaliveMinTime), "keepalive-min-time", "shortest interval at which clients may ping (with or without calls); a client that pings more often is disconnected")
	fs.Var(newDurationValue(&cfg.ShutdownTimeout, cfg.ShutdownTimeout), "shutdown-timeout", "how long a graceful stop lets calls in flight finish before cutting them")
	fs.IntVar(&cfg.Engine.Actors, "actors", 0, "actor goroutines keys are spread over (0: 4 × GOMAXPROCS)")
	fs.IntVar(&cfg.Engine.MaxKeys, "max-keys", 0, "most keys in memory; past it idle keys leave memory, their state stays on disk (0: 131072; with --durability memory, where keys cannot leave memory and new ones past it are refused: 1000000)")
	fs.IntVar(&cfg.Engine.MailboxSize, "mailbox-size", 0, "calls that may wait for one actor before the node answers RESOURCE_EXHAUSTED (0: 1024)")
	fs.IntVar(&cfg.Engine.Limits.MaxKeyLen, "max-key-len", cfg.Engine.Limits.MaxKeyLen, "longest key, in bytes")
	fs.IntVar(&cfg.Engine.Limits.MaxBatch, "max-batch", cfg.Engine.Limits.MaxBatch, "most checks in one call")
	fs.StringVar(&o.gossipAddr, "gossip-addr", "", "cluster: host:port to gossip on (memberlist, TCP and UDP); setting it or --join makes the node a cluster member")
	fs.StringVar(&o.advertiseAddr, "advertise-addr", "", "cluster: host:port peers reach this node's gossip at, when it differs from --gossip-addr")
	fs.StringVar(&o.join, "join", "", "cluster: comma-separated host:port list of members to join (DNS names are resolved and retried, so a headless Service works)")
	fs.StringVar(&o.gossipKey, "gossip-key", "", "cluster: base64 AES key (16, 24 or 32 bytes) encrypting gossip; every member needs the same")
	fs.IntVar(&o.expect, "expect", 0, "cluster: how many nodes bootstrap a new cluster together (a StatefulSet's replicas when it is first created); a node with no Raft state bootstraps once that many nodes, each seeing the same set of them, agree, all with one configuration. Ignored once the cluster exists: its Raft configuration is the quorum. Required in a cluster")
	fs.Float64Var(&o.leaseClockRate, "test-lease-clock-rate", 0, "test only: run this node's lease clock at this rate against real time (0: not changed), to show what clock drift beyond --lease's assumption costs")
	if err := fs.MarkHidden("test-lease-clock-rate"); err != nil {
		panic(err)
	}
	fs.StringVar(&cfg.Control.Zone, "zone", "", "cluster: this node's failure domain (a Kubernetes zone): the Raft leader spreads voters across zones")
	fs.Var(newDurationValue(&cfg.Control.Settings.Lease, cfg.Control.Settings.Lease), "lease", "cluster: how long a node may decide after its last lease renewal was sent (L); the keys of a node that died go on elsewhere about L·1.1 after its last renewal. Every node of a cluster needs the same")
	fs.Var(newEnumValue(&o.ownerPolicy, "exact", "exact", "available"), "owner-policy",
		"cluster: who decides the keys of a node that is down and that no standby holds: exact (nobody until it is back: UNAVAILABLE, never a wrong answer) or available (the next node, from what it holds, once the Raft leader ended the down node's epoch: up to one extra limit per key). Every node of a cluster needs the same")
	fs.BoolVar(&cfg.Insecure, "insecure", cfg.Insecure, "serve the admin API, refunds or (cluster) the peer service on a non-loopback address without --admin-token or --tls-client-ca (anyone who reaches the port can then reset keys, raise limits, give hits back, forge handoffs and forwarded checks, and vote in Raft); logged as a warning at start-up")
	fs.IntVar(&cfg.Control.Settings.Partitions, "partitions", cfg.Control.Settings.Partitions, "cluster: split the keys into this many partitions (a power of two, e.g. 64), each kept by --replicas nodes and decided by one of them, its leader: a restart or a crash moves leadership, not key state (docs/cluster.md, Partitions). 0 keeps ownership by rendezvous hashing. Fixed when the cluster is bootstrapped: every node needs the same")
	fs.IntVar(&cfg.Control.Settings.MinInsync, "min-insync", cfg.Control.Settings.MinInsync, "cluster, with --partitions: how many in-sync replicas (the leader included) a partition needs to acknowledge a write (0: 1)")
	fs.IntVar(&cfg.Router.Replicas, "replicas", cfg.Router.Replicas, "cluster: nodes that keep each key's state: 2 gives every key a standby that has every acknowledged hit and takes over when its owner is down; 1 keeps it on the owner only (0: 2 with a data file, 1 with --durability memory)")
	fs.Var(newEnumValue(&o.logFormat, "text", "text", "json"), "log-format", "log format")
	fs.Var(newEnumValue(&o.logLevel, "info", "debug", "info", "warn", "error"), "log-level", "least severe level logged")
	fs.Int64Var(&cfg.MemoryLimit, "memory-limit", cfg.MemoryLimit, "the container's memory limit in bytes (Kubernetes: the downward API's limits.memory): unless GOMEMLIMIT is set, the Go runtime's soft memory limit is set to 90% of it, leaving room for what the runtime does not count (0: none)")
	fs.StringVar(&o.readyFile, "ready-file", "", `once serving, write the bound addresses to this file as JSON {"grpc_addr":...,"http_addr":...,"pid":...}; removed at stop (for scripts and tests on port 0)`)
	def := *o
	o.defaults = &def
	bindAllEnv(fs)
	return cmd
}

// serve runs a node until ctx ends, then shuts it down gracefully.
func (c *cli) serve(ctx context.Context, o *serveOptions) error {
	log := newLogger(c.stderr, o.logFormat, o.logLevel)
	cfg := o.cfg
	cfg.Logger = log
	cfg.Build = node.BuildInfo{Version: buildVersion().Version, Revision: buildVersion().Commit}
	// Before the start-up log, which shows the actors GOMAXPROCS sizes.
	node.SetRuntimeLimits(cfg, log)
	if o.gossipAddr != "" || o.join != "" {
		cc := cluster.DefaultConfig()
		if o.gossipAddr != "" {
			cc.GossipAddr = o.gossipAddr
		}
		cc.AdvertiseAddr = o.advertiseAddr
		for _, j := range strings.Split(o.join, ",") {
			if j = strings.TrimSpace(j); j != "" {
				cc.Join = append(cc.Join, j)
			}
		}
		if o.gossipKey != "" {
			key, err := base64.StdEncoding.DecodeString(o.gossipKey)
			if err != nil {
				return fmt.Errorf("--gossip-key: not base64: %v", err)
			}
			cc.GossipKey = key
		}
		cc.Expect = o.expect // 0 when not given: Validate refuses it
		policy, err := cluster.ParsePolicy(o.ownerPolicy)
		if err != nil {
			return fmt.Errorf("--owner-policy: %v", err)
		}
		cfg.Router.Policy = policy
		if o.leaseClockRate != 0 {
			if o.leaseClockRate < 0 {
				return fmt.Errorf("--test-lease-clock-rate %v: want a positive rate", o.leaseClockRate)
			}
			cfg.Control.Clock = control.NewRateClock(nil, o.leaseClockRate)
			log.Warn("the lease clock runs at a test rate: leases are not safe beyond a rate of 1/(1+ρ)", "rate", o.leaseClockRate)
		}
		cfg.Cluster = &cc
	} else if o.expect > 1 {
		return fmt.Errorf("--expect %d: a cluster needs --gossip-addr or --join", o.expect)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log.Info("starting sluice", o.startAttrs()...)
	log.Debug("configuration", o.attrs(o.clustered())...)
	if rl := o.ratelimitEnv; len(rl.used) > 0 || len(rl.ignored) > 0 {
		log.Info("envoyproxy/ratelimit environment variables", "read", rl.used, "ignored", rl.ignored)
	}
	if o.readyFile != "" {
		if err := os.Remove(o.readyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale ready file: %w", err)
		}
	}

	srv, err := node.New(cfg)
	if err != nil {
		return err
	}
	// Shutdown gets a context of its own: ctx is already done when it runs,
	// and Shutdown bounds itself with --shutdown-timeout.
	stopCtx := context.WithoutCancel(ctx)
	if err := srv.Start(); err != nil {
		srv.Shutdown(stopCtx)
		return err
	}
	if o.readyFile != "" {
		if err := writeReadyFile(o.readyFile, srv); err != nil {
			srv.Shutdown(stopCtx)
			return err
		}
	}

	// SIGHUP reloads the limits file and the TLS files now (they are also
	// polled).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var fatal error
	for ctx.Err() == nil && fatal == nil {
		select {
		case fatal = <-srv.Fatal():
		case <-hup:
			if err := srv.ReloadLimits(); err != nil {
				log.Error("reload limits file", "err", err)
			} else {
				log.Info("reloaded limits file")
			}
			if err := srv.ReloadTLS(); err != nil {
				log.Error("reload TLS files", "err", err)
			}
		case <-ctx.Done():
		}
	}
	if o.readyFile != "" {
		os.Remove(o.readyFile)
	}
	if fatal != nil {
		// The node could not be a member: it decided nothing; stop it
		// without waiting for calls.
		srv.Crash()
		return fatal
	}
	log.Info("shutting down", "reason", context.Cause(ctx).Error(), "timeout", cfg.ShutdownTimeout)
	if err := srv.Shutdown(stopCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// clustered reports whether the flags make the node a cluster member.
func (o *serveOptions) clustered() bool { return o.gossipAddr != "" || o.join != "" }

// startAttrs is what the start-up line shows: the version, then the
// settings that differ from their defaults (the whole configuration is
// logged at debug level).
func (o *serveOptions) startAttrs() []any {
	all := o.attrs(o.clustered())
	if o.defaults == nil {
		return all
	}
	def := *o.defaults
	def.cfg.Router.Replicas = node.DefaultReplicas(o.cfg.Durability) // as the node resolves 0
	changed := changedAttrs(attrList(all[2:]), attrList(def.attrs(o.clustered())))
	out := []any{all[0], all[1]} // version
	for _, a := range changed {
		out = append(out, a)
	}
	return out
}

// attrList turns slog's alternating keys and values (and Attrs) into
// Attrs.
func attrList(args []any) []slog.Attr {
	var out []slog.Attr
	for len(args) > 0 {
		if a, ok := args[0].(slog.Attr); ok {
			out, args = append(out, a), args[1:]
			continue
		}
		out, args = append(out, slog.Any(args[0].(string), args[1])), args[2:]
	}
	return out
}

// changedAttrs returns the attributes of cur whose values differ from
// those of the same key in def, groups compared member by member.
func changedAttrs(cur, def []slog.Attr) []slog.Attr {
	defs := make(map[string]slog.Value, len(def))
	for _, a := range def {
		defs[a.Key] = a.Value.Resolve()
	}
	var out []slog.Attr
	for _, a := range cur {
		v := a.Value.Resolve()
		d, ok := defs[a.Key]
		if v.Kind() == slog.KindGroup {
			var dg []slog.Attr
			if ok && d.Kind() == slog.KindGroup {
				dg = d.Group()
			}
			if sub := changedAttrs(v.Group(), dg); len(sub) > 0 {
				out = append(out, slog.Attr{Key: a.Key, Value: slog.GroupValue(sub...)})
			}
			continue
		}
		// Printed, values of any kind compare (slices and maps too).
		if !ok || fmt.Sprint(v.Any()) != fmt.Sprint(d.Any()) {
			out = append(out, a)
		}
	}
	return out
}

// attrs describes the effective configuration for the logs, with the
// tokens redacted and the defaults that zero values stand for resolved;
// the cluster's settings only when cluster is true.
func (o *serveOptions) attrs(cluster bool) []any {
	cfg := &o.cfg
	attrs := []any{
		"version", buildVersion().Version,
		"node_name", cfg.NodeName,
		"grpc_addr", cfg.GRPCAddr,
		"peer_addr", cfg.PeerAddr,
		"admin_addr", cfg.AdminAddr,
		"http_addr", cfg.HTTPAddr,
		"health_addr", cfg.HealthAddr,
		"data_dir", cfg.DataDir,
		"durability", cfg.Durability,
		"limits_file", cfg.LimitsFile,
		"limits_poll_interval", cfg.LimitsPollInterval,
		"merge_domain_config", cfg.MergeDomainConfig,
		slog.Group("limits_xds", "server", cfg.LimitsXDS.Server, "node_id", cfg.LimitsXDS.NodeID, "ca", cfg.LimitsXDS.CAFile,
			"cert", cfg.LimitsXDS.CertFile, "key", cfg.LimitsXDS.KeyFile, "node_metadata", cfg.LimitsXDS.NodeMetadata,
			"headers", len(cfg.LimitsXDS.Headers)), // header values may be secrets
		"admin_token", redact(cfg.AdminToken),
		"refund_token", redact(cfg.RefundToken),
		"tls_cert", cfg.TLSCert,
		"tls_key", cfg.TLSKey,
		"tls_client_ca", cfg.TLSClientCA,
		"tls_poll_interval", cfg.TLSPollInterval,
		"rate_limit_headers", cfg.RateLimitHeaders,
		"rate_limit_headers_format", cfg.RateLimitHeadersFormat,
		"limit_limit_header", cfg.RateLimitHeaderNames.Limit,
		"limit_remaining_header", cfg.RateLimitHeaderNames.Remaining,
		"limit_reset_header", cfg.RateLimitHeaderNames.Reset,
		"shadow", cfg.ShadowMode,
		"usage_domains", cfg.UsageDomains,
		"response_dynamic_metadata", cfg.ResponseDynamicMetadata,
		"rule_metrics_max_keys", cfg.RuleMetricsMaxKeys,
		"near_limit_ratio", cfg.NearLimitRatio,
		"lease_hot_keys", cfg.LeaseHotKeys,
		"max_message_bytes", cfg.MaxMessageBytes,
		"max_inflight_bytes", cfg.MaxInflightBytes,
		"max_conn_inflight_bytes", cfg.MaxConnInflightBytes,
		"budget_wait", cfg.BudgetWait,
		slog.Group("transport",
			"max_connections", cfg.MaxConnections,
			"max_concurrent_streams", cfg.MaxConcurrentStreams,
			"keepalive_time", cfg.KeepaliveTime,
			"keepalive_timeout", cfg.KeepaliveTimeout,
			"max_connection_idle", cfg.MaxConnectionIdle,
			"max_connection_age", cfg.MaxConnectionAge,
			"max_connection_age_grace", cfg.MaxConnectionAgeGrace,
			"keepalive_min_time", cfg.KeepaliveMinTime,
		),
		slog.Group("tracing", "otlp_endpoint", cfg.Tracing.Endpoint,
			"sample_ratio", cfg.Tracing.SampleRatio, "service_name", cfg.Tracing.ServiceName),
		"pprof", cfg.Pprof,
		"insecure", cfg.Insecure,
		"shutdown_timeout", cfg.ShutdownTimeout,
		slog.Group("engine", engineAttrs(cfg.Engine, cfg.Durability)...),
		"log_format", o.logFormat,
		"log_level", o.logLevel,
		"ready_file", o.readyFile,
		"memory_limit", cfg.MemoryLimit,
		"gomaxprocs", runtime.GOMAXPROCS(0),
	}
	if !cluster {
		return attrs // a single node: no cluster setting is in force
	}
	return append(attrs, slog.Group("cluster",
		"gossip_addr", o.gossipAddr,
		"advertise_addr", o.advertiseAddr,
		"join", o.join,
		"gossip_key", redact(o.gossipKey),
		"expect", o.expect,
		"owner_policy", o.ownerPolicy,
		"replicas", cfg.WithDefaults().Router.Replicas,
	))
}

// redact hides a secret in logs, saying only whether it is set.
func redact(secret string) string {
	if secret == "" {
		return ""
	}
	return "[redacted]"
}

// newLogger logs to w in format "text" or "json" at level and above.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: readableAttr}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// readyInfo is the content of the --ready-file.
type readyInfo struct {
	GRPCAddr string `json:"grpc_addr"`
	// PeerAddr and AdminAddr are set when the service has a listener of
	// its own.
	PeerAddr  string `json:"peer_addr,omitempty"`
	AdminAddr string `json:"admin_addr,omitempty"`
	HTTPAddr  string `json:"http_addr"`
	// HealthAddr is set with --health-addr.
	HealthAddr string `json:"health_addr,omitempty"`
	PID        int    `json:"pid"`
}

// writeReadyFile writes srv's addresses to path atomically: a reader sees
// no file or the whole of it.
func writeReadyFile(path string, srv *node.Node) error {
	info := readyInfo{GRPCAddr: srv.GRPCAddr(), HTTPAddr: srv.HTTPAddr(), HealthAddr: srv.HealthAddr(), PID: os.Getpid()}
	if a := srv.PeerAddr(); a != info.GRPCAddr {
		info.PeerAddr = a
	}
	if a := srv.AdminAddr(); a != info.GRPCAddr {
		info.AdminAddr = a
	}
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}

// writeFileAtomic writes b and a newline to path atomically (a temporary
// file renamed over it), so that a script polling for it never reads half.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sluice-ready-*")
	if err != nil {
		return fmt.Errorf("write ready file: %w", err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write ready file: %w", err)
	}
	return nil
}
