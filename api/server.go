package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/api/limits"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Config configures a node. Build it with DefaultConfig and change what you
// need; it is not modified after New.
type Config struct {
	// NodeName names the node in decisions, logs and the cluster. Default:
	// the host name.
	NodeName string
	// GRPCAddr is where the gRPC API listens (native, Envoy RLS v3, admin,
	// health, reflection). Default 127.0.0.1:8081.
	GRPCAddr string
	// HTTPAddr is where /metrics, /healthz and /readyz listen. Default
	// 127.0.0.1:8080. Empty disables the HTTP listener.
	HTTPAddr string
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
	// LimitsPollInterval is how often the limits file is checked for
	// changes. Default 2s.
	LimitsPollInterval time.Duration
	// AdminToken, when set, is the bearer token the admin API requires.
	AdminToken string
	// TLSCert and TLSKey, when set, serve gRPC and HTTP over TLS.
	TLSCert, TLSKey string
	// TLSClientCA, when set, requires client certificates signed by it.
	TLSClientCA string
	// RateLimitHeaders makes Envoy responses carry the IETF RateLimit-Policy
	// and RateLimit header fields and Retry-After for the client.
	RateLimitHeaders bool
	// Pprof serves Go's profiles on the HTTP listener under /debug/pprof/.
	// Off by default: profiles reveal internals and cost CPU while taken.
	Pprof bool
	// MaxMessageBytes bounds a gRPC request. Default 4 MiB.
	MaxMessageBytes int
	// ShutdownTimeout bounds a graceful shutdown before in-flight calls are
	// cut. Default 10s.
	ShutdownTimeout time.Duration
	// Engine configures the actors; its Store, Clock and Logger are set by
	// New.
	Engine actor.Config
	// Cluster, when not nil, makes the node a member of a cluster: its
	// NodeName and GRPCAddr are set by Start. Nil runs a single node.
	Cluster *cluster.Config
	// Router tunes forwarding, handoff and leases in a cluster; its
	// Membership, Engine, Self, Store and DialOptions are set by Start.
	Router cluster.RouterConfig
	// Clock tells the time; nil is the wall clock.
	Clock clock.Clock
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
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
		MaxMessageBytes:    4 << 20,
		ShutdownTimeout:    10 * time.Second,
	}
}

// Validate reports a configuration that cannot work, saying what to change.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("api: config: node name is empty; set --node-name")
	case c.GRPCAddr == "":
		return errors.New("api: config: gRPC address is empty; set --grpc-addr")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("api: config: --tls-cert and --tls-key go together")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return errors.New("api: config: --tls-client-ca needs --tls-cert and --tls-key")
	case c.MaxMessageBytes < 0 || c.ShutdownTimeout < 0 || c.LimitsPollInterval < 0:
		return errors.New("api: config: sizes and durations must not be negative")
	}
	if c.Durability != "memory" {
		if _, err := persist.ParseMode(c.Durability); err != nil {
			return fmt.Errorf("api: config: durability %q: want commit, fsync, async or memory", c.Durability)
		}
		if c.DataDir == "" {
			return errors.New("api: config: data dir is empty; set --data-dir or --durability memory")
		}
	}
	return c.Engine.Validate()
}

// Server is one Sluice node: the engine, its store, and the gRPC and HTTP
// listeners in front of them.
type Server struct {
	cfg       Config
	log       *slog.Logger
	clock     clock.Clock
	store     *persist.Store
	engine    *actor.Engine
	limits    *limits.Watcher
	overrides *overrideTable
	metrics   *metrics
	registry  *prometheus.Registry

	grpc   *grpc.Server
	health *health.Server
	http   *http.Server
	tls    *tls.Config

	membership *cluster.Membership
	router     atomic.Pointer[cluster.Router]
	stopRouter context.CancelFunc // ends the router's Run
	routerDone chan struct{}      // closed when Run returned

	grpcLis, httpLis net.Listener
	ready            atomic.Bool
	wg               sync.WaitGroup
	shutdownOnce     sync.Once
	shutdownErr      error
}

// New opens the data file, starts the engine and builds the listeners'
// handlers. Nothing listens until Start.
func New(cfg Config) (s *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = 4 << 20
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	s = &Server{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeName), clock: cfg.Clock}
	built := s // "return nil, err" sets s to nil before the deferred call runs
	defer func() {
		if err != nil {
			built.closeStorage()
		}
	}()
	s.registry = prometheus.NewRegistry()
	s.metrics = newMetrics(s.registry)

	var overrides []*Override
	if cfg.Durability != "memory" {
		mode, _ := persist.ParseMode(cfg.Durability)
		s.store, err = persist.Open(persist.Options{
			Path:     filepath.Join(cfg.DataDir, "sluice.db"),
			Mode:     mode,
			Logger:   s.log,
			OnCommit: s.metrics.commit,
		})
		if err != nil {
			return nil, err
		}
		if overrides, err = loadOverrides(s.store); err != nil {
			return nil, err
		}
	}
	s.overrides = newOverrideTable(overrides)

	if cfg.LimitsFile != "" {
		s.limits, err = limits.NewWatcher(limits.WatcherOptions{
			Path:     cfg.LimitsFile,
			Interval: cfg.LimitsPollInterval,
			Logger:   s.log.With("component", "limits"),
			OnReload: func(*limits.Config) { s.metrics.limitsReloads.WithLabelValues("ok").Inc() },
			OnError:  func(error) { s.metrics.limitsReloads.WithLabelValues("error").Inc() },
		})
		if err != nil {
			return nil, err
		}
	}

	ecfg := cfg.Engine
	ecfg.Store, ecfg.Clock = s.store, cfg.Clock
	ecfg.Logger = s.log.With("component", "actor")
	ecfg.Observer = s.metrics
	if cfg.Cluster != nil {
		// Calls routed before the ownership changed are checked again in
		// the actors (see actor.Config.Owns).
		ecfg.Owns = func(key string) bool {
			r := s.router.Load()
			return r == nil || r.Decidable(key)
		}
	}
	if s.engine, err = actor.New(ecfg); err != nil {
		return nil, err
	}

	if cfg.TLSCert != "" {
		if s.tls, err = loadTLS(cfg); err != nil {
			return nil, err
		}
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		// A pool of goroutines for the calls, whose stacks have grown
		// already: without it, gRPC starts a goroutine per call and grows
		// its stack each time (7% of the CPU at saturation). Calls wait on
		// the actors, so the pool is sized for calls in flight, not cores;
		// past it, gRPC starts goroutines as before.
		grpc.NumStreamWorkers(uint32(64 * runtime.GOMAXPROCS(0))),
		grpc.ChainUnaryInterceptor(s.recoverPanics, s.authorize),
		grpc.ChainStreamInterceptor(s.authorizeStream),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	s.grpc = grpc.NewServer(opts...)
	sluicepb.RegisterRateLimitServiceServer(s.grpc, &nativeService{s: s})
	sluicepb.RegisterAdminServiceServer(s.grpc, &adminService{s: s})
	rlsv3.RegisterRateLimitServiceServer(s.grpc, &envoyService{s: s})
	sluicepb.RegisterPeerServiceServer(s.grpc, cluster.NewPeerService(s.router.Load))
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := s.notReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: s.tls}
	return s, nil
}

func loadTLS(cfg Config) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("api: load TLS key pair %s, %s: %w", cfg.TLSCert, cfg.TLSKey, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg.TLSClientCA != "" {
		pem, err := os.ReadFile(cfg.TLSClientCA)
		if err != nil {
			return nil, fmt.Errorf("api: read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("api: client CA %s holds no PEM certificate", cfg.TLSClientCA)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// Start listens on the configured addresses (a bind error returns here) and
// then serves in the background.
func (s *Server) Start() error {
	var err error
	if s.grpcLis, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("api: listen gRPC on %s: %w", s.cfg.GRPCAddr, err)
	}
	if s.cfg.HTTPAddr != "" {
		if s.httpLis, err = net.Listen("tcp", s.cfg.HTTPAddr); err != nil {
			s.grpcLis.Close()
			return fmt.Errorf("api: listen HTTP on %s: %w", s.cfg.HTTPAddr, err)
		}
	}
	if s.limits != nil {
		s.limits.Start()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(s.grpcLis); err != nil {
			s.log.Error("gRPC server stopped", "err", err)
		}
	}()
	if s.httpLis != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			var err error
			if s.tls != nil {
				err = s.http.ServeTLS(s.httpLis, "", "")
			} else {
				err = s.http.Serve(s.httpLis)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("HTTP server stopped", "err", err)
			}
		}()
	}
	if s.cfg.Cluster != nil {
		if err := s.startCluster(); err != nil {
			s.grpc.Stop()
			if s.httpLis != nil {
				s.http.Close()
			}
			s.wg.Wait()
			return err
		}
	}
	s.ready.Store(true)
	s.updateHealth()
	s.log.Info("serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "durability", s.cfg.Durability)
	return nil
}

// notReady says why the node should get no traffic, "" when it is ready:
// it is starting or stopping, or in a cluster it holds no lease or waits
// for the state of keys it gained from a live member.
func (s *Server) notReady() string {
	if !s.ready.Load() {
		return "starting or stopping"
	}
	if r := s.router.Load(); r != nil {
		return r.Status()
	}
	return ""
}

// updateHealth sets grpc health from notReady.
func (s *Server) updateHealth() {
	if s.notReady() == "" {
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	} else {
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// GRPCAddr is the address the gRPC listener is bound to (useful with :0).
func (s *Server) GRPCAddr() string {
	if s.grpcLis == nil {
		return ""
	}
	return s.grpcLis.Addr().String()
}

// HTTPAddr is the address the HTTP listener is bound to, "" if none.
func (s *Server) HTTPAddr() string {
	if s.httpLis == nil {
		return ""
	}
	return s.httpLis.Addr().String()
}

// Shutdown stops the node gracefully: it reports not ready, stops accepting
// calls, lets the calls in flight finish (until ctx or ShutdownTimeout ends,
// then cuts them), flushes the data file and closes it. It is idempotent.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		s.ready.Store(false)
		ctx, cancel := context.WithTimeout(ctx, s.cfg.ShutdownTimeout)
		defer cancel()
		if s.membership != nil {
			s.leaveCluster(ctx)
		}
		s.health.Shutdown()
		stopped := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			s.log.Warn("graceful stop timed out; cutting calls in flight")
			s.grpc.Stop()
			<-stopped
		}
		if s.httpLis != nil {
			if err := s.http.Shutdown(ctx); err != nil {
				s.http.Close()
			}
		}
		s.wg.Wait()
		s.shutdownErr = s.closeStorage()
		s.log.Info("stopped")
	})
	return s.shutdownErr
}

// joinTimeout bounds how long Start tries to join the cluster.
const joinTimeout = 2 * time.Minute

// startCluster joins the cluster and starts the router: forwarding,
// leases, handoff.
func (s *Server) startCluster() error {
	ccfg := *s.cfg.Cluster
	ccfg.NodeName, ccfg.GRPCAddr = s.cfg.NodeName, s.GRPCAddr()
	if ccfg.Logger == nil {
		ccfg.Logger = s.log.With("component", "cluster")
	}
	ccfg.Observer = s.metrics
	if s.store != nil {
		ccfg.Store = s.store
	}
	m, err := cluster.New(ccfg)
	if err != nil {
		return err
	}
	// Start joins before the node reports ready; a join list that never
	// answers fails start-up after joinTimeout instead of hanging.
	jctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	if err := m.Start(jctx); err != nil {
		return err
	}
	rcfg := s.cfg.Router
	rcfg.Membership, rcfg.Engine, rcfg.Self = m, s.engine, s.cfg.NodeName
	rcfg.Logger, rcfg.Observer = s.log, s.metrics
	if s.store != nil {
		rcfg.Store = s.store
	}
	rcfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if s.tls != nil {
		rcfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(s.peerTLS()))}
	}
	if s.cfg.AdminToken != "" {
		rcfg.DialOptions = append(rcfg.DialOptions, grpc.WithPerRPCCredentials(tokenCredentials{token: s.cfg.AdminToken, secure: s.tls != nil}))
	}
	r, err := cluster.NewRouter(rcfg)
	if err != nil {
		m.Shutdown()
		return err
	}
	s.membership = m
	s.router.Store(r)
	s.syncOverrides(context.Background())
	ctx, stop := context.WithCancel(context.Background())
	s.stopRouter, s.routerDone = stop, make(chan struct{})
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer close(s.routerDone)
		r.Run(ctx)
	}()
	go func() {
		defer s.wg.Done()
		s.watchReadiness(ctx)
	}()
	return nil
}

// watchReadiness keeps grpc health in step with the router's readiness
// until ctx ends.
func (s *Server) watchReadiness(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.updateHealth()
		}
	}
}

// peerTLS is the client side of the node's TLS settings, for peers: the
// node's own certificate, and its client CA (if any) to verify peers.
func (s *Server) peerTLS() *tls.Config {
	tc := &tls.Config{Certificates: s.tls.Certificates, MinVersion: tls.VersionTLS12, RootCAs: s.tls.ClientCAs}
	if tc.RootCAs == nil {
		tc.InsecureSkipVerify = true // no CA to check peers with; traffic is still encrypted
	}
	return tc
}

// leaveCluster hands every key over to the members that act for it and
// leaves: announce leaving (this node then acts for nothing, and its
// clients' checks are forwarded), hand over, and only once everything was
// delivered mark the handoff done and leave. If ctx ends first, the node
// stops without leaving: its peers see it down, and its keys wait for it.
func (s *Server) leaveCluster(ctx context.Context) {
	r := s.router.Load()
	if r.OnlyOwner() {
		s.log.Info("the only member that owns keys: stopping without leaving, keeping them")
	} else {
		if err := s.membership.SetLeaving(2 * time.Second); err != nil {
			s.log.Warn("announce leaving", "err", err)
		}
		// Keep a third of the time left for the calls in flight.
		hctx, cancel := ctx, context.CancelFunc(func() {})
		if d, ok := ctx.Deadline(); ok {
			hctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(d)*2/3))
		}
		err := r.HandOver(hctx)
		cancel()
		switch {
		case err != nil:
			s.log.Warn("could not hand every key over; stopping without leaving, so that its keys wait for this node", "err", err)
		case s.membership.Leave(2*time.Second) != nil:
			s.log.Warn("handed every key over, but the departure may not have reached every peer")
		default:
			s.log.Info("handed every key over and left the cluster")
		}
	}
	s.stopRouter()
	<-s.routerDone
	s.membership.Shutdown()
	r.Close()
}

// Membership is the node's cluster membership, nil for a single node.
func (s *Server) Membership() *cluster.Membership { return s.membership }

// closeStorage stops the engine and closes the limits watcher and the store.
func (s *Server) closeStorage() error {
	var errs []error
	if s.engine != nil {
		errs = append(errs, s.engine.Close())
	}
	if s.limits != nil {
		errs = append(errs, s.limits.Close())
	}
	if s.store != nil {
		errs = append(errs, s.store.Close())
	}
	return errors.Join(errs...)
}

// Registry is the node's own Prometheus registry.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// ReloadLimits reloads the limits file now (it is also polled). With an
// error, the previous limits stay in force. Without a limits file it does
// nothing.
func (s *Server) ReloadLimits() error {
	if s.limits == nil {
		return nil
	}
	return s.limits.Reload()
}
