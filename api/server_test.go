package api

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/api/limits"
	"github.com/sluice-io/sluice/api/overrides"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/clustertest"
	"github.com/sluice-io/sluice/persist"
)

func TestMain(m *testing.M) { os.Exit(clustertest.Run(m)) }

// epoch is where the fake clocks of tests start.
var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// testConfig is what a test sets on the parts its services adapt. The
// tests of a whole node (listeners, cluster, HTTP) are cmd/sluice/node's.
type testConfig struct {
	NodeName         string
	AdminToken       string
	RefundToken      string
	RateLimitHeaders bool
	HeaderFormat     HeaderFormat
	HeaderNames      HeaderNames
	ShadowMode       bool
	DynamicMetadata  bool
	// UsageDomains is Config.UsageDomains.
	UsageDomains []string
	// RuleMetricsMaxKeys and NearLimitRatio shape the per-rule statistics.
	RuleMetricsMaxKeys int
	NearLimitRatio     float64
	// Durability is "memory" or a persist mode; DataDir holds the data file.
	Durability string
	DataDir    string
	Engine     actor.Config
	// LimitsFile, when set, is watched every LimitsPollInterval.
	LimitsFile         string
	LimitsPollInterval time.Duration
	// MaxInflightBytes, MaxConnInflightBytes and BudgetWait are Config's.
	MaxInflightBytes, MaxConnInflightBytes int64
	BudgetWait                             time.Duration
	// Clustered makes the services those of a node that has not joined
	// its cluster yet (no router).
	Clustered bool
	// Intercept, when set, runs before the services' interceptors.
	Intercept grpc.UnaryServerInterceptor
}

// testServer is the services over a real engine, a data file in
// t.TempDir(), a fake clock and a real gRPC server on 127.0.0.1:0, and a
// client connection to it.
type testServer struct {
	t    testing.TB
	cfg  testConfig
	clk  *clock.Fake
	srv  *Server
	addr string
	conn *grpc.ClientConn
	// reg holds the services' metrics.
	reg *prometheus.Registry

	store  *persist.Store
	limits *limits.Watcher
	engine *actor.Engine
	grpc   *grpc.Server
}

// newTestServer starts the services; edit may change their config first.
func newTestServer(t testing.TB, edit func(*testConfig)) *testServer {
	t.Helper()
	ts := &testServer{t: t, clk: clock.NewFake(epoch)}
	ts.cfg = testConfig{NodeName: "test-node", Durability: "commit", DataDir: t.TempDir(), LimitsPollInterval: 2 * time.Second}
	ts.cfg.Engine.Actors = 4
	if edit != nil {
		edit(&ts.cfg)
	}
	ts.start()
	t.Cleanup(ts.stop)
	return ts
}

// start opens the parts (again, after stop, on the same data dir) and
// serves the services.
func (ts *testServer) start() {
	t := ts.t
	t.Helper()
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	var err error
	if ts.cfg.Durability != "memory" {
		mode, err := persist.ParseMode(ts.cfg.Durability)
		if err != nil {
			t.Fatal(err)
		}
		if ts.store, err = persist.Open(persist.Options{Path: filepath.Join(ts.cfg.DataDir, "sluice.db"), Mode: mode}); err != nil {
			t.Fatal(err)
		}
	}
	if ts.cfg.LimitsFile != "" {
		if ts.limits, err = limits.NewWatcher(limits.WatcherOptions{Path: ts.cfg.LimitsFile, Interval: ts.cfg.LimitsPollInterval}); err != nil {
			t.Fatal(err)
		}
		ts.limits.Start()
	}
	ecfg := ts.cfg.Engine
	ecfg.Store, ecfg.Clock = ts.store, ts.clk
	if ts.engine, err = actor.New(ecfg); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = lis.Addr().String()
	ts.reg = prometheus.NewRegistry()
	// The node's router: a single node's, or a cluster node's that has not
	// joined.
	router, err := cluster.NewRouter(cluster.RouterConfig{Clustered: ts.cfg.Clustered, Engine: ts.engine, Self: ts.cfg.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	peers := cluster.NewAdminPeers(router, ts.cfg.AdminToken)
	table, err := overrides.Open(overrides.Config{Store: ts.store, Peers: peers})
	if err != nil {
		t.Fatal(err)
	}
	ts.srv, err = New(Config{
		NodeName: ts.cfg.NodeName, AdminToken: ts.cfg.AdminToken, RefundToken: ts.cfg.RefundToken,
		RateLimitHeaders: ts.cfg.RateLimitHeaders, Limits: ts.cfg.Engine.Limits,
		HeaderFormat: ts.cfg.HeaderFormat, HeaderNames: ts.cfg.HeaderNames, ShadowMode: ts.cfg.ShadowMode, UsageDomains: ts.cfg.UsageDomains,
		ResponseDynamicMetadata: ts.cfg.DynamicMetadata,
		RuleMetricsMaxKeys:      ts.cfg.RuleMetricsMaxKeys, NearLimitRatio: ts.cfg.NearLimitRatio,
		MaxInflightBytes: ts.cfg.MaxInflightBytes, MaxConnInflightBytes: ts.cfg.MaxConnInflightBytes, BudgetWait: ts.cfg.BudgetWait,
	}, Deps{
		Engine: ts.engine, Decider: router, Cluster: router, Peers: peers, Overrides: table, Limits: ts.limits, Clock: ts.clk, Logger: log,
		GRPCAddr: func() string { return ts.addr }, Registry: ts.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(4 << 20)}
	if ts.cfg.Intercept != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(ts.cfg.Intercept))
	}
	ts.grpc = grpc.NewServer(append(opts, ts.srv.Interceptors()...)...)
	ts.srv.Register(ts.grpc)
	go ts.grpc.Serve(lis)
	if ts.conn, err = grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
}

// stop stops serving and closes the parts, flushing the data file.
func (ts *testServer) stop() {
	if ts.srv == nil {
		return
	}
	ts.conn.Close()
	ts.grpc.GracefulStop()
	if err := ts.engine.Close(); err != nil {
		ts.t.Errorf("close engine: %v", err)
	}
	if ts.limits != nil {
		ts.limits.Close()
	}
	if ts.store != nil {
		if err := ts.store.Close(); err != nil {
			ts.t.Errorf("close store: %v", err)
		}
	}
	ts.srv, ts.store, ts.limits = nil, nil, nil
}

// restart stops the services and starts them again on the same data dir.
func (ts *testServer) restart() {
	ts.t.Helper()
	ts.stop()
	ts.start()
}

// ctx is a context with a deadline generous for a loaded machine.
func (ts *testServer) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ts.t.Cleanup(cancel)
	return ctx
}
