// Package nodetest starts what the tests of the client, the HTTP
// middleware and sluice edge talk to: a real Sluice node in-process on
// 127.0.0.1:0 (or a cluster of them), a gate in front of it that can stall or refuse
// connections (Sluice slow, Sluice killed), and a gRPC server that answers
// every check with a given error first (a node answering UNAVAILABLE).
// Tests only.
package nodetest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/clustertest"
	"github.com/sluice-io/sluice/cmd/sluice/node"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// Node is a single Sluice node in memory mode, serving gRPC on
// 127.0.0.1:0; it stops at the end of the test.
type Node struct {
	t    testing.TB
	srv  *node.Node
	Addr string // its gRPC address
	once sync.Once
	// stopped is set by Stop.
	stopped atomic.Bool
}

// logLines is how many lines of each node's log a failed test shows.
const logLines = 60

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
	// The node's log is shown only if the test fails, after the node
	// stopped (cleanups run last first).
	tail := testkit.NewTail(logLines)
	cfg.Logger = slog.New(slog.NewTextHandler(tail, nil))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last %d lines of %s's log:\n%s", logLines, name, tail)
		}
	})
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
func (n *Node) Stop() { n.stopCtx(context.Background()) }

// stopCtx is Stop with ctx bounding the graceful part of the shutdown.
func (n *Node) stopCtx(ctx context.Context) {
	n.once.Do(func() {
		n.stopped.Store(true)
		if err := n.srv.Shutdown(ctx); err != nil {
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

// Server returns the node itself, for what a test needs to look at (its
// router, its metrics registry).
func (n *Node) Server() *node.Node { return n.srv }

// Forwarded returns how many checks this node forwarded to other nodes
// (sluice_forwarded_checks_total, every result).
func (n *Node) Forwarded() float64 {
	n.t.Helper()
	mfs, err := n.srv.Registry().Gather()
	if err != nil {
		n.t.Fatalf("gather metrics: %v", err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "sluice_forwarded_checks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// Cluster is nodes of one cluster in this process (memory mode, the wall
// clock), joined through the first one's gossip address. Nodes are named
// node-0, node-1, ...
type Cluster struct {
	t      testing.TB
	Nodes  []*Node
	seed   string
	expect int
	edit   func(*node.Config)
}

// StartCluster starts n nodes, waits until each sees the others and holds
// a lease, and stops them at the end of the test; edit, if not nil, may
// change every node's config.
func StartCluster(t testing.TB, n int, edit func(*node.Config)) *Cluster {
	t.Helper()
	c := &Cluster{t: t, expect: n, edit: edit}
	for range n {
		c.Add()
	}
	c.WaitReady()
	t.Cleanup(c.stop)
	return c
}

// stop stops the nodes still running, the last started first, as their
// own cleanups would. The last one has no quorum left to end its epoch
// with, and would try for its whole ShutdownTimeout: it is given a second,
// which a leave through a quorum does not need.
func (c *Cluster) stop() {
	running := c.Running()
	for i := len(running) - 1; i > 0; i-- {
		running[i].Stop()
	}
	if len(running) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		running[0].stopCtx(ctx)
	}
}

// Add starts one more node, which joins the cluster; WaitReady waits
// until it is part of it.
func (c *Cluster) Add() *Node {
	c.t.Helper()
	gossip := "127.0.0.1:" + strconv.Itoa(clustertest.FreePort(c.t))
	if c.seed == "" {
		c.seed = gossip
	}
	name := fmt.Sprintf("node-%d", len(c.Nodes))
	n := Start(c.t, name, func(cfg *node.Config) {
		cc := cluster.DefaultConfig()
		cc.GossipAddr = gossip
		cc.Join = []string{c.seed}
		cc.Expect = c.expect
		cfg.Cluster = &cc
		if c.edit != nil {
			c.edit(cfg)
		}
	})
	c.Nodes = append(c.Nodes, n)
	return n
}

// Addrs returns the gRPC addresses of the nodes, comma-separated, as
// client.Config.Addr takes them.
func (c *Cluster) Addrs() string {
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr)
	}
	return strings.Join(addrs, ",")
}

// Running returns the nodes not stopped.
func (c *Cluster) Running() []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if !n.stopped.Load() {
			out = append(out, n)
		}
	}
	return out
}

// WaitReady waits (20 s at most) until every running node applied a map
// that lists every running node as up and is ready: it holds a lease and
// every key it acts for is here.
func (c *Cluster) WaitReady() {
	c.t.Helper()
	if err := testkit.Wait(20*time.Second, func() error {
		if why := c.notReady(); why != "" {
			return fmt.Errorf("cluster not ready: %s", why)
		}
		return nil
	}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *Cluster) notReady() string {
	running := c.Running()
	for _, n := range running {
		name := n.srv.Config().NodeName
		if w := n.srv.NotReady(); w != "" {
			return name + ": " + w
		}
		r := n.srv.Router()
		if r == nil {
			return name + ": no router yet"
		}
		_, routes := r.Routes()
		up := 0
		for _, x := range routes {
			if x.Up {
				up++
			}
		}
		if up != len(running) {
			return fmt.Sprintf("%s: %d members up, want %d", name, up, len(running))
		}
	}
	return ""
}
