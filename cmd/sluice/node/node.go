package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/api"
	"github.com/sluice-io/sluice/api/limits"
	"github.com/sluice-io/sluice/api/overrides"
	"github.com/sluice-io/sluice/api/ui"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// maxHeaderListBytes bounds the headers of one call (gRPC's default is 16
// MiB): a proxy's or client's headers take a few hundred bytes, and
// Envoy's own limit is 60 KiB.
const maxHeaderListBytes = 64 << 10

// handshakeTimeout bounds a new connection's TLS and HTTP/2 handshake
// (gRPC's default is 120 s), so that a connection that never starts one
// gives its slot back soon.
const handshakeTimeout = 10 * time.Second

// Node is one Sluice node: its store, engine and limits file, its cluster
// membership and router, the gRPC services in front of them, and the gRPC
// and HTTP listeners. The gRPC services share one listener unless the peer
// or admin service has a listener of its own (Config.PeerAddr,
// Config.AdminAddr); every gRPC listener has a server of its own, built
// with the same options (credentials, interceptors, limits).
type Node struct {
	cfg      Config
	log      *slog.Logger
	store    *persist.Store
	engine   *actor.Engine
	limits   *limits.Watcher
	api      *api.Server
	metrics  *metrics
	registry *prometheus.Registry

	grpc   *listener // decisions and health; admin and peer unless below
	peer   *listener // the peer service's: grpc, or one of its own
	admin  *listener // the admin service's: grpc, or one of its own
	gRPCs  []*listener
	health *health.Server
	http   *http.Server
	certs  *certs   // TLS material, nil without TLS
	traces *tracing // nil when the node does not trace

	// router decides every check (see api.Decider): built by New, it
	// decides every key here for a single node; in a cluster Start joins
	// it to the membership and the control plane, which it stores below.
	router     *cluster.Router
	membership atomic.Pointer[cluster.Membership]
	control    atomic.Pointer[control.Control]
	stopRouter context.CancelFunc // ends the router's Run
	routerDone chan struct{}      // closed when Run returned
	mux        *control.Mux       // splits the peer listener between gRPC and Raft, in a cluster
	fatal      chan error         // capacity 1; see Fatal

	httpLis      net.Listener
	healthSrv    *http.Server // Config.HealthAddr's, nil without one
	healthLis    net.Listener
	ready        atomic.Bool
	wg           sync.WaitGroup
	shutdownOnce sync.Once
	shutdownErr  error
}

// listener is one of the node's gRPC listeners and the server behind it.
type listener struct {
	name string // "grpc", "peer" or "admin": its flag is --<name>-addr
	addr string // as configured
	srv  *grpc.Server
	lis  net.Listener // set by Start
}

// boundAddr is the address l is bound to, "" before Start.
func (l *listener) boundAddr() string {
	if l.lis == nil {
		return ""
	}
	return l.lis.Addr().String()
}

// New opens the data file, starts the engine and builds the services and
// the listeners' handlers, in that order (openStore, loadTransport,
// newEngine, newServices, newGRPC, newHTTP). Nothing listens until Start. It refuses a
// configuration that Validate refuses, and runs cfg.WithDefaults().
func New(cfg Config) (n *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	n = &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeName), fatal: make(chan error, 1)}
	built := n // "return nil, err" sets n to nil before the deferred call runs
	defer func() {
		if err != nil {
			built.closeStorage()
		}
	}()
	SetRuntimeLimits(cfg, n.log)
	n.warnOpen()
	n.registry = prometheus.NewRegistry()
	n.metrics = newMetrics(n.registry)
	registerBuildInfo(n.registry, cfg.Build)
	for _, step := range []func() error{n.openStore, n.loadTransport, n.newEngine, n.newServices, n.newGRPC, n.newHTTP} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// warnOpen logs the listeners that serve without a credential (with
// Config.Insecure) and an admin token that travels in clear text.
func (n *Node) warnOpen() {
	cfg := n.cfg
	if cfg.Insecure {
		n.log.Warn("--insecure: listeners on non-loopback addresses may serve resets, overrides, refunds and peer calls without a credential; anyone who reaches them can use them (see docs/security.md)")
	}
	if cfg.AdminToken != "" && cfg.TLSCert == "" && (!isLoopback(cfg.GRPCAddr) || !isLoopback(cmp.Or(cfg.AdminAddr, cfg.GRPCAddr)) ||
		cfg.Cluster != nil && !isLoopback(cmp.Or(cfg.PeerAddr, cfg.GRPCAddr))) {
		n.log.Warn("the admin token travels in clear text: serve with --tls-cert and --tls-key")
	}
}

// openStore opens the data file, unless the node runs in memory.
func (n *Node) openStore() error {
	cfg := n.cfg
	if cfg.Durability == "memory" {
		return nil
	}
	mode, _ := persist.ParseMode(cfg.Durability)
	path := filepath.Join(cfg.DataDir, "sluice.db")
	var err error
	n.store, err = persist.Open(persist.Options{
		Path:           path,
		Mode:           mode,
		Logger:         n.log,
		OnCommit:       n.metrics.commit,
		OnCheckpoint:   n.metrics.checkpoint,
		AcceptWALLoss:  cfg.AcceptWALLoss,
		CheckpointKeys: checkpointKeys(cfg.Engine.MaxKeys),
		OnCompact:      n.metrics.compacted,
	})
	if err != nil {
		return err
	}
	n.logLastStop()
	lastStop := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_store_last_stop",
		Help: "Always 1; its label how says how the last process on this data file stopped: fresh (no record), clean, crash (killed while the machine ran on) or reboot (did not stop, and the machine restarted since: a power loss is possible).",
	}, []string{"how"})
	lastStop.WithLabelValues(n.store.LastStop().String()).Set(1)
	n.registry.MustRegister(lastStop)
	n.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_data_file_bytes",
		Help: "Size of the data file (its WAL files apart).",
	}, func() float64 {
		info, err := os.Stat(path)
		if err != nil {
			return 0
		}
		return float64(info.Size())
	}))
	store := n.store
	n.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_wal_bytes",
		Help: "Size of the data file's write-ahead log files: what was committed since the last checkpoint, which grows while checkpoints fail.",
	}, func() float64 {
		b, err := store.WALBytes()
		if err != nil {
			return 0
		}
		return float64(b)
	}))
	return nil
}

// logLastStop logs how the last process on the data file stopped: a
// warning when hits it acknowledged may be missing, since their keys may
// then allow more than their limit.
func (n *Node) logLastStop() {
	store := n.store
	how := store.LastStop()
	attrs := []any{"last_stop", how.String()}
	if mode, ok := store.LastMode(); ok {
		attrs = append(attrs, "last_durability", mode.String())
	}
	const more = "; their keys may allow more than their limit until their windows pass"
	lost := store.MayHaveLost()
	switch {
	case how == persist.StopFresh:
		n.log.Info("the data file holds no record of an earlier run: it is new, or an older release wrote it", attrs...)
	case how == persist.StopClean:
		n.log.Info("the last run stopped cleanly", attrs...)
	case how == persist.StopCrash && !lost:
		n.log.Info("the last run was killed or crashed while the machine ran on: nothing it acknowledged was lost", attrs...)
	case how == persist.StopCrash:
		n.log.Warn("the last run was killed or crashed in durability mode async: hits it acknowledged before writing them may be missing"+more, attrs...)
	case !lost:
		n.log.Info("the last run did not stop, and the machine restarted since (or its boot id is unknown): in durability mode fsync nothing it acknowledged was lost", attrs...)
	default:
		n.log.Warn("the last run did not stop, and the machine restarted since (or its boot id is unknown): a power loss or kernel crash may have lost hits it acknowledged but had not synced to the disk"+more, attrs...)
	}
}

// loadTransport reads the TLS files and starts the tracer, which the
// gRPC servers and the router's connections to the peers use.
func (n *Node) loadTransport() error {
	cfg := n.cfg
	var err error
	if cfg.TLSCert != "" {
		n.certs, err = newCerts(cfg, n.log.With("component", "tls"), func(ok bool) {
			result := "ok"
			if !ok {
				result = "error"
			}
			n.metrics.tlsReloads.WithLabelValues(result).Inc()
		})
		if err != nil {
			return err
		}
		n.metrics.registerTLS(n.registry, n.certs)
	}
	n.traces, err = newTracing(cfg.Tracing, cfg.NodeName, cfg.Build.Version)
	return err
}

// newEngine builds the router and starts the engine on the store. They
// need each other: the router decides on the engine, and in a cluster
// the engine asks the router whether a key moved (actor.Config.Owner) and
// hands it every write for the standbys (actor.Config.Replicator).
func (n *Node) newEngine() error {
	cfg := n.cfg
	rcfg := cfg.Router
	rcfg.Clustered, rcfg.Self = cfg.Cluster != nil, cfg.NodeName
	rcfg.Logger, rcfg.Observer = n.log, n.metrics
	rcfg.DialOptions = n.peerDialOptions()
	var err error
	if n.router, err = cluster.NewRouter(rcfg); err != nil {
		return err
	}
	ecfg := cfg.Engine
	ecfg.Store, ecfg.Clock = n.store, cfg.Clock
	ecfg.Logger = n.log.With("component", "actor")
	ecfg.Observer = n.metrics
	ecfg.Trace = cfg.Tracing.Enabled()
	if cfg.Cluster != nil {
		// Calls routed before the ownership changed are checked again in
		// the actors, and writes go to the keys' standbys (see
		// RouterConfig.Replicas); until the node joined, the router owns
		// every key and copies nothing (it decides nothing either).
		ecfg.Owner, ecfg.Replicator = n.router, n.router
	}
	if n.engine, err = actor.New(ecfg); err != nil {
		return err
	}
	n.router.SetEngine(n.engine)
	return nil
}

// peerKeepalive pings a peer connection silent for 10 s (gRPC's shortest
// client interval) and drops it when the ping is not answered within 5
// s: a peer that froze or vanished without closing its connections (a
// SIGSTOP, a pulled cable, a blackholed route) is noticed within 15 s on
// every connection to it, the idle ones and the long-lived copy streams
// included, instead of after the kernel's retransmissions give up. The
// peer listener accepts these pings (see peerKeepaliveMinTime).
var peerKeepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}

// peerKeepaliveMinTime is the shortest ping interval the listener of the
// peer service accepts: --keepalive-min-time, but never above the peers'
// own interval, which an operator's setting must not turn into
// disconnections.
func peerKeepaliveMinTime(cfg Config) time.Duration {
	return min(cfg.KeepaliveMinTime, peerKeepalive.Time)
}

// peerDialOptions are the options of the node's connections to its peers:
// TLS with the node's certificate, the admin token, the trace context,
// keepalive pings.
func (n *Node) peerDialOptions() []grpc.DialOption {
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if n.certs != nil {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(n.certs.peerConfig()))}
	}
	dial = append(dial, grpc.WithKeepaliveParams(peerKeepalive))
	if creds := api.PeerCredentials(n.cfg.AdminToken, n.certs != nil); creds != nil {
		dial = append(dial, grpc.WithPerRPCCredentials(creds))
	}
	if n.traces != nil {
		dial = append(dial, n.traces.dialOption()) // forwards carry the trace context
	}
	return dial
}

// newServices reads the limits file and the overrides, and builds the
// services (package api) on the engine and the router.
func (n *Node) newServices() error {
	cfg := n.cfg
	var err error
	if n.limits, err = n.newLimitsWatcher(); err != nil {
		return err
	}
	peers := cluster.NewAdminPeers(n.router, cfg.AdminToken)
	table, err := overrides.Open(overrides.Config{Store: n.store, Peers: peers, Logger: n.log})
	if err != nil {
		return err
	}
	n.api, err = api.New(api.Config{
		NodeName:                cfg.NodeName,
		AdminToken:              cfg.AdminToken,
		RefundToken:             cfg.RefundToken,
		RateLimitHeaders:        cfg.RateLimitHeaders,
		HeaderFormat:            api.HeaderFormat(cfg.RateLimitHeadersFormat),
		HeaderNames:             cfg.RateLimitHeaderNames,
		ShadowMode:              cfg.ShadowMode,
		UsageDomains:            cfg.UsageDomains,
		ResponseDynamicMetadata: cfg.ResponseDynamicMetadata,
		RuleMetricsMaxKeys:      cfg.RuleMetricsMaxKeys,
		NearLimitRatio:          cfg.NearLimitRatio,
		LeaseHotKeys:            cfg.LeaseHotKeys,
		MaxMessageBytes:         cfg.MaxMessageBytes,
		MaxInflightBytes:        cfg.MaxInflightBytes,
		MaxConnInflightBytes:    cfg.MaxConnInflightBytes,
		BudgetWait:              cfg.BudgetWait,
		Limits:                  cfg.Engine.Limits,
	}, api.Deps{
		Engine:    n.engine,
		Decider:   n.router,
		Cluster:   n.router,
		Peers:     peers,
		Overrides: table,
		Limits:    n.limits,
		GRPCAddr:  n.GRPCAddr,
		Registry:  n.registry,
		Clock:     cfg.Clock,
		Logger:    n.log,
	})
	return err
}

// newGRPC builds the gRPC servers, one per listener, with the same
// options (limits, credentials, interceptors, tracing), and registers the
// services on them.
func (n *Node) newGRPC() error {
	cfg := n.cfg
	opts := append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		// A pool of goroutines for the calls, whose stacks have grown
		// already: without it, gRPC starts a goroutine per call and grows
		// its stack each time (7% of the CPU at saturation). Calls wait on
		// the actors, so the pool is sized for calls in flight, not cores;
		// past it, gRPC starts goroutines as before.
		grpc.NumStreamWorkers(uint32(64 * runtime.GOMAXPROCS(0))),
		// What one connection may make the node hold (docs/operations.md,
		// "Connections and streams"): its calls in flight, answered or
		// not; its headers; its silence, idle or stalled.
		grpc.MaxConcurrentStreams(uint32(cfg.MaxConcurrentStreams)),
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     cfg.MaxConnectionIdle,
			MaxConnectionAge:      cfg.MaxConnectionAge,
			MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
			Time:                  cfg.KeepaliveTime,
			Timeout:               cfg.KeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             cfg.KeepaliveMinTime,
			PermitWithoutStream: true,
		}),
	}, n.api.Interceptors()...)
	// The peer service accepts the peers' keepalive pings, on its own
	// listener or on the shared one.
	peerPolicy := grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime:             peerKeepaliveMinTime(cfg),
		PermitWithoutStream: true,
	})
	if cfg.Cluster != nil && cfg.PeerAddr == "" {
		opts = append(opts, peerPolicy)
	}
	if n.certs != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(n.certs.serverConfig(false))))
	}
	if n.traces != nil {
		opts = append(opts, grpc.StatsHandler(n.traces.serverHandler(cfg.NodeName)))
	}
	newListener := func(name, addr string, extra ...grpc.ServerOption) *listener {
		l := &listener{name: name, addr: addr, srv: grpc.NewServer(append(slices.Clip(opts), extra...)...)}
		n.gRPCs = append(n.gRPCs, l)
		return l
	}
	n.grpc = newListener("grpc", cfg.GRPCAddr)
	n.peer, n.admin = n.grpc, n.grpc
	if cfg.PeerAddr != "" {
		// Nodes' connections to each other need no rebalancing: a listener
		// of its own keeps them for as long as they live (no maximum age).
		n.peer = newListener("peer", cfg.PeerAddr, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: cfg.MaxConnectionIdle,
			Time:              cfg.KeepaliveTime,
			Timeout:           cfg.KeepaliveTimeout,
		}), peerPolicy)
	}
	if cfg.AdminAddr != "" {
		n.admin = newListener("admin", cfg.AdminAddr)
	}
	n.api.RegisterDecisions(n.grpc.srv)
	n.health = health.NewServer()
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	for _, l := range n.gRPCs { // probes of the peer and admin ports too
		healthpb.RegisterHealthServer(l.srv, n.health)
	}
	sluicepb.RegisterPeerServiceServer(n.peer.srv, cluster.NewPeerService(n.router))
	// Reflection is an operator's tool: it goes with the admin service,
	// and lists the services of its own listener only.
	n.api.RegisterAdmin(n.admin.srv)
	reflection.Register(n.admin.srv)
	return nil
}

// newHTTP builds the handlers of the HTTP listener (metrics, health, the
// web UI, envoyproxy/ratelimit's endpoints, profiles) and of the health
// listener.
func (n *Node) newHTTP() error {
	cfg := n.cfg
	healthz := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	readyz := func(w http.ResponseWriter, _ *http.Request) {
		if why := n.NotReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	}
	// envoyproxy/ratelimit's health check: 200 "OK" while it serves, 500
	// otherwise; ready is what serving means here.
	healthcheck := func(w http.ResponseWriter, _ *http.Request) {
		if why := n.NotReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, "OK")
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", n.metricsHandler())
	mux.HandleFunc("/healthz", healthz)
	mux.HandleFunc("/readyz", readyz)
	mux.HandleFunc("/healthcheck", healthcheck)
	mux.Handle("/json", n.api.JSONHandler())             // envoyproxy/ratelimit's decision over HTTP
	mux.Handle("/rlconfig", n.api.LimitsConfigHandler()) // and its dump of the limits in force
	mux.Handle(ui.Prefix, ui.New(ui.Config{AdminToken: cfg.AdminToken, Clock: cfg.Clock, Logger: n.log}, n.api))
	if cfg.HealthAddr != "" {
		hmux := http.NewServeMux()
		hmux.HandleFunc("/healthz", healthz)
		hmux.HandleFunc("/readyz", readyz)
		hmux.HandleFunc("/healthcheck", healthcheck)
		n.healthSrv = &http.Server{Handler: hmux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.MaxConnectionIdle}
	}
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	n.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.MaxConnectionIdle}
	if n.certs != nil {
		n.http.TLSConfig = n.certs.serverConfig(true)
	}
	return nil
}

// checkpointKeys sizes the data file's overlays (keys written since the
// last checkpoint, two overlays at most) to the keys held in memory, so that
// --max-keys bounds both: a flood of new keys costs the overlays no more
// than it costs the actors. Between 4096 and persist's default.
func checkpointKeys(maxKeys int) int {
	if maxKeys <= 0 {
		maxKeys = actor.DefaultMaxKeys // the engine's default with a data file
	}
	return min(max(maxKeys, 4096), persist.DefaultCheckpointKeys)
}

// Start listens on the configured addresses (a bind error returns here),
// serves in the background, and in a cluster joins it and starts the
// router.
func (n *Node) Start() error {
	closeAll := func() {
		for _, l := range n.gRPCs {
			if l.lis != nil {
				l.lis.Close()
			}
		}
	}
	for _, l := range n.gRPCs {
		lis, err := net.Listen("tcp", l.addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("node: listen gRPC on %s (--%s-addr): %w", l.addr, l.name, err)
		}
		l.lis = newLimitListener(lis, n.cfg.MaxConnections, l.name, n.metrics, n.log)
	}
	serveOn := func(l *listener) net.Listener { return l.lis }
	if n.cfg.Cluster != nil {
		// Raft travels on the peer port beside the peer service.
		n.mux = control.NewMux(n.peer.lis)
		serveOn = func(l *listener) net.Listener {
			if l == n.peer {
				return n.mux.GRPC()
			}
			return l.lis
		}
	}
	if n.cfg.HTTPAddr != "" {
		lis, err := net.Listen("tcp", n.cfg.HTTPAddr)
		if err != nil {
			closeAll()
			return fmt.Errorf("node: listen HTTP on %s: %w", n.cfg.HTTPAddr, err)
		}
		n.httpLis = newLimitListener(lis, n.cfg.MaxConnections, "http", n.metrics, n.log)
	}
	if n.healthSrv != nil {
		lis, err := net.Listen("tcp", n.cfg.HealthAddr)
		if err != nil {
			closeAll()
			if n.httpLis != nil {
				n.httpLis.Close()
			}
			return fmt.Errorf("node: listen health on %s: %w", n.cfg.HealthAddr, err)
		}
		n.healthLis = newLimitListener(lis, n.cfg.MaxConnections, "health", n.metrics, n.log)
	}
	if n.limits != nil {
		n.limits.Start()
	}
	if n.certs != nil {
		n.certs.start(n.cfg.TLSPollInterval)
	}
	for _, l := range n.gRPCs {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := l.srv.Serve(serveOn(l)); err != nil {
				n.log.Error("gRPC server stopped", "listener", l.name, "err", err)
			}
		}()
	}
	if n.httpLis != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			var err error
			if n.certs != nil {
				err = n.http.ServeTLS(n.httpLis, "", "")
			} else {
				err = n.http.Serve(n.httpLis)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.log.Error("HTTP server stopped", "err", err)
			}
		}()
	}
	if n.healthLis != nil {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			// Plain HTTP whatever the TLS settings: the probes' listener.
			if err := n.healthSrv.Serve(n.healthLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.log.Error("health server stopped", "err", err)
			}
		}()
	}
	if n.cfg.Cluster != nil {
		if err := n.startCluster(); err != nil {
			n.stopGRPC()
			n.closeHTTP()
			n.wg.Wait()
			return err
		}
	}
	n.ready.Store(true)
	n.updateHealth()
	n.log.Info("serving", "grpc", n.GRPCAddr(), "peer", n.PeerAddr(), "admin", n.AdminAddr(), "http", n.HTTPAddr(), "health", n.HealthAddr(), "durability", n.cfg.Durability)
	return nil
}

// NotReady says why the node should get no traffic, "" when it is ready:
// it is starting or stopping, or in a cluster it holds no lease or waits
// for the state of keys it gained from a live member.
func (n *Node) NotReady() string {
	if !n.ready.Load() {
		return "starting or stopping"
	}
	if n.limits != nil && !n.limits.Loaded() {
		return "waiting for the limits from the xDS server"
	}
	return n.router.Status()
}

// updateHealth sets grpc health, for every service, from NotReady.
func (n *Node) updateHealth() {
	if n.NotReady() == "" {
		n.setHealth(healthpb.HealthCheckResponse_SERVING)
	} else {
		n.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// GRPCAddr is the address the gRPC listener of decisions is bound to
// (useful with :0), "" before Start.
func (n *Node) GRPCAddr() string { return n.grpc.boundAddr() }

// PeerAddr is the address the peer service is served on: GRPCAddr unless
// it has a listener of its own.
func (n *Node) PeerAddr() string { return n.peer.boundAddr() }

// AdminAddr is the address the admin service is served on: GRPCAddr
// unless it has a listener of its own.
func (n *Node) AdminAddr() string { return n.admin.boundAddr() }

// HTTPAddr is the address the HTTP listener is bound to, "" if none.
func (n *Node) HTTPAddr() string {
	if n.httpLis == nil {
		return ""
	}
	return n.httpLis.Addr().String()
}

// HealthAddr is the address the health listener (Config.HealthAddr) is
// bound to, "" if none.
func (n *Node) HealthAddr() string {
	if n.healthLis == nil {
		return ""
	}
	return n.healthLis.Addr().String()
}

// closeHTTP closes the HTTP and health listeners at once.
func (n *Node) closeHTTP() {
	if n.httpLis != nil {
		n.http.Close()
	}
	if n.healthLis != nil {
		n.healthSrv.Close()
	}
}

// Shutdown stops the node gracefully: it reports not ready, in a cluster
// hands its keys over and leaves, stops accepting calls, lets the calls in
// flight finish (until ctx or ShutdownTimeout ends, then cuts them),
// flushes the data file and closes it. It is idempotent.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutdownOnce.Do(func() {
		n.ready.Store(false)
		ctx, cancel := context.WithTimeout(ctx, n.cfg.ShutdownTimeout)
		defer cancel()
		if n.api != nil {
			n.api.CloseLeases(ctx, true) // what the slices held did not spend goes back
		}
		if n.membership.Load() != nil {
			n.leaveCluster(ctx)
		}
		n.health.Shutdown()
		var stopping sync.WaitGroup
		for _, l := range n.gRPCs {
			stopping.Go(l.srv.GracefulStop)
		}
		stopped := make(chan struct{})
		go func() {
			stopping.Wait()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			n.log.Warn("graceful stop timed out; cutting calls in flight")
			n.stopGRPC()
			<-stopped
		}
		if n.httpLis != nil {
			if err := n.http.Shutdown(ctx); err != nil {
				n.http.Close()
			}
		}
		if n.healthLis != nil {
			if err := n.healthSrv.Shutdown(ctx); err != nil {
				n.healthSrv.Close()
			}
		}
		n.wg.Wait()
		n.shutdownErr = errors.Join(n.closeStorage(), n.traces.shutdown())
		n.log.Info("stopped")
	})
	return n.shutdownErr
}

// Crash stops the node as kill -9 would for its peers: no leave, no
// handoff, calls in flight cut. Its data file is flushed and closed, as
// the durable modes guarantee for every acknowledged hit. For tests.
func (n *Node) Crash() {
	n.shutdownOnce.Do(func() {
		n.ready.Store(false)
		n.stopGRPC()
		n.closeHTTP()
		if n.api != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n.api.CloseLeases(ctx, false) // the slices held expire at their estimate
			cancel()
		}
		if m := n.membership.Load(); m != nil {
			n.stopCluster(m, n.control.Load(), n.router)
		}
		n.wg.Wait()
		n.shutdownErr = n.closeStorage()
		n.traces.shutdown() //nolint:errcheck // what a crash loses

	})
}

// StopServing stops the gRPC servers at once, without leaving the cluster:
// for its peers the node is alive (it gossips) but unreachable. For tests.
func (n *Node) StopServing() { n.stopGRPC() }

// stopGRPC stops every gRPC server at once, cutting the calls in flight.
func (n *Node) stopGRPC() {
	for _, l := range n.gRPCs {
		l.srv.Stop()
	}
}

// closeStorage stops the engine, closes the limits watcher and the store,
// and stops reading the TLS files.
func (n *Node) closeStorage() error {
	var errs []error
	if n.engine != nil {
		errs = append(errs, n.engine.Close())
	}
	if n.limits != nil {
		errs = append(errs, n.limits.Close())
	}
	if n.certs != nil {
		n.certs.close()
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	return errors.Join(errs...)
}

// Membership is the node's cluster membership, nil for a single node.
func (n *Node) Membership() *cluster.Membership { return n.membership.Load() }

// Control is the node's control plane, nil for a single node.
func (n *Node) Control() *control.Control { return n.control.Load() }

// Router is the node's router, which decides every check: on the engine
// for a single node, on the members in a cluster.
func (n *Node) Router() *cluster.Router { return n.router }

// Registry is the node's own Prometheus registry.
func (n *Node) Registry() *prometheus.Registry { return n.registry }

// Store is the node's data file, nil in memory mode.
func (n *Node) Store() *persist.Store { return n.store }

// Engine is the node's engine.
func (n *Node) Engine() *actor.Engine { return n.engine }

// Limits is the node's limits file, nil without one.
func (n *Node) Limits() *limits.Watcher { return n.limits }

// Config is the node's configuration, with its defaults filled in.
func (n *Node) Config() Config { return n.cfg }

// ReloadLimits reloads the limits file now (it is also polled). With an
// error, the previous limits stay in force. Without a limits file it does
// nothing.
func (n *Node) ReloadLimits() error {
	if n.limits == nil {
		return nil
	}
	return n.limits.Reload()
}

// ReloadTLS reads the TLS certificate, key and client CA now (they are
// also read every Config.TLSPollInterval) and serves them from the next
// handshake on. Files that cannot be used are refused, with the error,
// and the previous ones stay in force. Without TLS it does nothing.
func (n *Node) ReloadTLS() error {
	if n.certs == nil {
		return nil
	}
	return n.certs.reload()
}
