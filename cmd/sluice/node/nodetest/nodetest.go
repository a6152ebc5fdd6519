// Package nodetest starts what the tests of the client, the HTTP
// middleware and sluice edge talk to: a real Sluice node in-process on
// 127.0.0.1:0, a gate in front of it that can stall or refuse
// connections (Sluice slow, Sluice killed), and a gRPC server that answers
// every check with a given error first (a node answering UNAVAILABLE).
// Tests only.
package nodetest

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/cmd/sluice/node"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Node is a single Sluice node in memory mode, serving gRPC on
// 127.0.0.1:0; it stops at the end of the test.
type Node struct {
	t    testing.TB
	srv  *node.Node
	Addr string // its gRPC address
	once sync.Once
}

// Start starts a node named name; edit, if not nil, may change its config.
func Start(t testing.TB, name string, edit func(*node.Config)) *Node {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.NodeName = name
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = ""
	cfg.Durability = "memory"
	cfg.DataDir = ""
	cfg.Engine.Actors = 2
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	if edit != nil {
		edit(&cfg)
	}
	if cfg.Cluster != nil && cfg.DataDir == "" {
		cfg.DataDir = t.TempDir() // the Raft log, whatever the durability
	}
	srv, err := node.New(cfg)
	if err != nil {
		t.Fatalf("node.New: %v", err)
	}
	if err := srv.Start(); err != nil {
		srv.Shutdown(context.Background())
		t.Fatalf("node Start: %v", err)
	}
	n := &Node{t: t, srv: srv, Addr: srv.GRPCAddr()}
	t.Cleanup(n.Stop)
	return n
}

// Stop shuts the node down (idempotent): Sluice killed.
func (n *Node) Stop() {
	n.once.Do(func() {
		if err := n.srv.Shutdown(context.Background()); err != nil {
			n.t.Errorf("node Shutdown: %v", err)
		}
	})
}

// Gate is a TCP forwarder in front of an address. Open, it passes bytes
// both ways; stalled, it keeps every connection (new ones too) but passes
// nothing, as a node that hangs would; closed, it refuses connections and
// cuts the ones it holds, as a dead host would.
type Gate struct {
	t       testing.TB
	lis     net.Listener
	target  string
	Addr    string
	stalled atomic.Bool
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closed  bool
	resume  chan struct{} // closed when the gate opens again
	wg      sync.WaitGroup
}

// NewGate listens on 127.0.0.1:0 and forwards to target; it closes at the
// end of the test.
func NewGate(t testing.TB, target string) *Gate {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gate{t: t, lis: lis, target: target, Addr: lis.Addr().String(), conns: map[net.Conn]struct{}{}, resume: make(chan struct{})}
	close(g.resume)
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(g.Close)
	return g
}

func (g *Gate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.lis.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", g.target)
		if err != nil {
			c.Close()
			continue
		}
		if !g.track(c, up) {
			return
		}
		g.wg.Add(2)
		go g.pipe(c, up)
		go g.pipe(up, c)
	}
}

func (g *Gate) track(cs ...net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		g.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, holding each chunk while the gate is stalled.
func (g *Gate) pipe(dst, src net.Conn) {
	defer g.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			g.mu.Lock()
			resume := g.resume
			g.mu.Unlock()
			<-resume
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Stall makes the gate hold every byte until Open.
func (g *Gate) Stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.stalled.Swap(true) {
		g.resume = make(chan struct{})
	}
}

// Open passes bytes again.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stalled.Swap(false) {
		close(g.resume)
	}
}

// Close refuses new connections and cuts every one it holds.
func (g *Gate) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	g.lis.Close()
	for c := range g.conns {
		c.Close()
	}
	if g.stalled.Swap(false) {
		close(g.resume)
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// Refuser is a gRPC server on 127.0.0.1:0 whose RateLimitService answers
// the first Fails checks calls with Err, and forwards the later ones to a
// real node (Next), if any, else answers Err too.
type Refuser struct {
	sluicepb.UnimplementedRateLimitServiceServer
	Addr  string
	Err   error
	Fails int64 // calls to refuse; negative: all
	Calls atomic.Int64
	next  sluicepb.RateLimitServiceClient
	srv   *grpc.Server
}

// NewRefuser starts a Refuser answering err to the first fails calls
// (negative: every call), forwarding the others to next ("" for none).
// It stops at the end of the test.
func NewRefuser(t testing.TB, err error, fails int64, next string) *Refuser {
	t.Helper()
	lis, lerr := net.Listen("tcp", "127.0.0.1:0")
	if lerr != nil {
		t.Fatal(lerr)
	}
	r := &Refuser{Addr: lis.Addr().String(), Err: err, Fails: fails, srv: grpc.NewServer()}
	if next != "" {
		conn, derr := grpc.NewClient(next, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if derr != nil {
			t.Fatal(derr)
		}
		t.Cleanup(func() { conn.Close() })
		r.next = sluicepb.NewRateLimitServiceClient(conn)
	}
	sluicepb.RegisterRateLimitServiceServer(r.srv, r)
	go r.srv.Serve(lis)
	t.Cleanup(r.srv.Stop)
	return r
}

// Check refuses or forwards.
func (r *Refuser) Check(ctx context.Context, req *sluicepb.CheckRequest) (*sluicepb.CheckResponse, error) {
	n := r.Calls.Add(1)
	if r.Fails < 0 || n <= r.Fails || r.next == nil {
		return nil, r.Err
	}
	return r.next.Check(ctx, req)
}
