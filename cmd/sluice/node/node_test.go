package node

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/api/apitest"
	"github.com/sluice-io/sluice/cluster/clustertest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

func TestMain(m *testing.M) { os.Exit(clustertest.Run(m)) }

// epoch is where the fake clocks of tests start.
var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// nativeCheck is apitest.Check: a native check of cost hits on key.
var nativeCheck = apitest.Check

// testServer is one node on 127.0.0.1:0 with a data file in t.TempDir() and
// a fake clock, and a gRPC client connection to it.
type testServer struct {
	t    testing.TB
	cfg  Config
	clk  *clock.Fake
	srv  *Node
	conn *grpc.ClientConn
	// adminConn reaches the admin service: conn, unless it has a
	// listener of its own.
	adminConn *grpc.ClientConn
}

// newTestServer starts a node; edit may change its config before start.
func newTestServer(t testing.TB, edit func(*Config)) *testServer {
	t.Helper()
	ts := &testServer{t: t, clk: clock.NewFake(epoch)}
	ts.cfg = DefaultConfig()
	ts.cfg.NodeName = "test-node"
	ts.cfg.GRPCAddr = "127.0.0.1:0"
	ts.cfg.HTTPAddr = "127.0.0.1:0"
	ts.cfg.DataDir = t.TempDir()
	ts.cfg.Clock = ts.clk
	ts.cfg.Engine.Actors = 4
	if testing.Verbose() {
		ts.cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if edit != nil {
		edit(&ts.cfg)
	}
	ts.start()
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testServer) start() {
	ts.t.Helper()
	srv, err := New(ts.cfg)
	if err != nil {
		ts.t.Fatalf("New: %v", err)
	}
	if err := srv.Start(); err != nil {
		srv.Shutdown(context.Background())
		ts.t.Fatalf("Start: %v", err)
	}
	ts.srv = srv
	creds := insecure.NewCredentials()
	if ts.cfg.TLSCert != "" {
		tc, err := newCerts(ts.cfg, nil, nil) // the node's own certificate: trusted, and presented
		if err != nil {
			ts.t.Fatal(err)
		}
		st := tc.cur.Load()
		creds = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*st.cert}, RootCAs: st.pool, MinVersion: tls.VersionTLS12})
	}
	ts.conn, err = grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.adminConn = ts.conn
	if srv.AdminAddr() != srv.GRPCAddr() {
		if ts.adminConn, err = grpc.NewClient(srv.AdminAddr(), grpc.WithTransportCredentials(creds)); err != nil {
			ts.t.Fatal(err)
		}
	}
}

func (ts *testServer) stop() { ts.stopCtx(context.Background()) }

// stopCtx is stop with ctx bounding the graceful part of the shutdown.
func (ts *testServer) stopCtx(ctx context.Context) {
	if ts.srv == nil {
		return
	}
	ts.closeConns()
	if err := ts.srv.Shutdown(ctx); err != nil {
		ts.t.Errorf("Shutdown: %v", err)
	}
	ts.srv = nil
}

// crash stops the node as kill -9 would for the cluster: no leave, no
// handoff. Its data file is closed, with every acknowledged hit in it.
func (ts *testServer) crash() {
	s := ts.srv
	ts.srv = nil
	ts.closeConns()
	s.Crash()
}

func (ts *testServer) closeConns() {
	ts.conn.Close()
	if ts.adminConn != ts.conn {
		ts.adminConn.Close()
	}
}

// ctx is a context with a deadline generous for a loaded machine.
func (ts *testServer) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ts.t.Cleanup(cancel)
	return ctx
}

// admin is an admin client of the node.
func (ts *testServer) admin() sluicepb.AdminServiceClient {
	return sluicepb.NewAdminServiceClient(ts.adminConn)
}
