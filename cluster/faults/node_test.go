//go:build linux

package faults

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// Ports every node listens on inside its own namespace.
const (
	grpcPort   = "8081"
	httpPort   = "8080"
	gossipPort = "7946"
	// peerPort is where the peer service listens, on the host's second
	// address, when clusterConfig.peerAddr is set.
	peerPort = "8082"
)

// clusterConfig says how to run the nodes of one scenario.
type clusterConfig struct {
	// bin is the sluice binary.
	bin string
	// nodes is the number of nodes (3 if 0).
	nodes int
	// joinAll makes every node join every node's gossip address (the
	// headless Service of scripts/k8s); otherwise every node joins node 1
	// (scripts/cluster-up.sh).
	joinAll bool
	// extraFlags are added to every node's serve command line after the
	// harness's own.
	extraFlags []string
	// nodeFlags are added to one node's (by number, from 1) after
	// extraFlags: the later of two equal flags wins.
	nodeFlags map[int][]string
	// peerAddr serves each node's peer service on its host's second
	// address (--peer-addr), gossip and the rest staying on the first.
	peerAddr bool
	// gossipSecond runs gossip on each host's second address and serves
	// the peer service (Raft with it) on the first (--peer-addr): a cut
	// of the second address cuts gossip alone.
	gossipSecond bool
	// deferred are nodes (by number) that startCluster does not start: the
	// scenario starts them (a scale-up).
	deferred []int
	// mayExit are nodes (by number) that may exit instead of becoming ready
	// (a node refused at start-up): startCluster does not wait for them.
	mayExit []int
}

// cluster is sluice processes, each in its own namespace of a network,
// with an edge client beside each.
type cluster struct {
	nodes []*node
	mu    sync.Mutex
	// faults are the faults injected, in order (see beginFault).
	faults []*fault
	// lostBefore is set when a node was forgotten with the only copy of
	// its keys (one replica): hits acknowledged before it may be lost with
	// it, and the ledger does not count them as lost.
	lostBefore time.Time
}

// node is one sluice serve process, restarted as often as a scenario
// wants on the same data dir, and its edge client: a gRPC connection and an
// HTTP client whose sockets live in the node's namespace, so they reach it
// on loopback whatever happens to its link.
type node struct {
	name string // its --node-name: "n1", "n2", ...
	host *host
	args []string // ip's arguments: netns exec, the namespace, the binary, serve and its flags
	dir  string   // data dir, ready file and log live here

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
	log    *os.File      // every run of the node appends to it
	runs   int
	// started is set once the node was first started: its client sends
	// load only from then on.
	started atomic.Bool

	conn  *grpc.ClientConn
	limit sluicepb.RateLimitServiceClient
	admin sluicepb.AdminServiceClient
	http  *http.Client
}

// startCluster creates a network of namespaces and starts a node in each
// (but the deferred ones), with fresh data dirs, then waits until every
// node it started is ready and sees all of them alive (but those that may
// exit); it returns an error if they are not within 30 s. The test's end
// kills the nodes, prints the tail of their logs if the test failed, and
// deletes the namespaces.
func startCluster(t *testing.T, cfg clusterConfig) (*cluster, error) {
	t.Helper()
	n := cmp.Or(cfg.nodes, 3)
	nw := newNetwork(t, n)
	t.Logf("network: namespaces %s (bridge) and %sn1..n%d on %s0/24", nw.sw, nw.prefix, len(nw.hosts), nw.subnet)
	c := &cluster{}
	var gossip []string
	for _, h := range nw.hosts {
		addr := h.ip
		if cfg.gossipSecond {
			addr = h.ip2
		}
		gossip = append(gossip, net.JoinHostPort(addr, gossipPort))
	}
	join := gossip[0]
	if cfg.joinAll {
		join = strings.Join(gossip, ",")
	}
	// The nodes' directories, made before the cleanup below is registered
	// so that they are removed after it has read the logs.
	root := t.TempDir()
	t.Cleanup(func() {
		c.stopMonitors()
		if t.Failed() && os.Getenv("SLUICE_FAULT_LOGS") != "" {
			// Every goroutine's stack into the node's log (Go's SIGQUIT),
			// for a node that was stuck.
			for _, n := range c.running() {
				n.signal(syscall.SIGCONT)
				n.signal(syscall.SIGQUIT)
			}
			for _, n := range c.running() {
				n.wait(5 * time.Second)
			}
		}
		for _, n := range c.nodes {
			n.kill()
			n.conn.Close()
			n.http.CloseIdleConnections()
			n.log.Close()
			if races := n.logLines("WARNING: DATA RACE"); len(races) > 0 {
				t.Errorf("%s: the race detector reported %d data races; the first:\n%s", n.name, len(races), n.logAfter("WARNING: DATA RACE", 60))
			}
		}
		if t.Failed() {
			keep := os.Getenv("SLUICE_FAULT_LOGS")
			for _, n := range c.nodes {
				t.Logf("last lines of %s's log (%d runs):\n%s", n.name, n.runs, n.logTail(40))
				if keep != "" {
					name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + n.name + ".log"
					if b, err := os.ReadFile(filepath.Join(n.dir, "log")); err == nil {
						os.WriteFile(filepath.Join(keep, name), b, 0o644)
					}
				}
			}
		}
	})
	for i, h := range nw.hosts {
		name := fmt.Sprintf("n%d", i+1)
		n := &node{name: name, host: h, dir: filepath.Join(root, name)}
		if err := os.Mkdir(n.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		n.args = []string{"serve",
			"--node-name", n.name,
			"--grpc-addr", "0.0.0.0:" + grpcPort,
			"--http-addr", "0.0.0.0:" + httpPort,
			"--gossip-addr", gossip[i],
			"--join", join,
			"--data-dir", n.dataDir(),
			"--ready-file", n.readyFile(),
			"--shutdown-timeout", "10s",
		}
		if cfg.peerAddr {
			n.args = append(n.args, "--peer-addr", net.JoinHostPort(h.ip2, peerPort))
		}
		if cfg.gossipSecond {
			n.args = append(n.args, "--peer-addr", net.JoinHostPort(h.ip, peerPort))
		}
		n.args = append(n.args, cfg.extraFlags...)
		n.args = append(n.args, cfg.nodeFlags[i+1]...)
		n.args = append([]string{"netns", "exec", h.ns, cfg.bin}, n.args...)
		var err error
		if n.log, err = os.Create(filepath.Join(n.dir, "log")); err != nil {
			t.Fatal(err)
		}
		if err := n.connect(); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	// Start them all before waiting for any: a node may wait for the
	// others before it says it is ready.
	var waitFor []*node
	for i, n := range c.nodes {
		if slices.Contains(cfg.deferred, i+1) {
			continue
		}
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(cfg.mayExit, i+1) {
			waitFor = append(waitFor, n)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range waitFor {
		if err := n.waitReady(deadline); err != nil {
			return c, err
		}
	}
	if err := waitMembers(waitFor, deadline); err != nil {
		return c, err
	}
	return c, nil
}

// node returns node i, from 1.
func (c *cluster) node(i int) *node { return c.nodes[i-1] }

// names returns the names of the nodes, in order.
func (c *cluster) names() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.name)
	}
	return out
}

// running returns the nodes whose process runs (started, not exited),
// paused or not.
func (c *cluster) running() []*node {
	var out []*node
	for _, n := range c.nodes {
		if n.running() {
			out = append(out, n)
		}
	}
	return out
}

// waitMembers polls each of nodes until it sees every one of them alive
// (and perhaps others).
func waitMembers(nodes []*node, deadline time.Time) error {
	var want []string
	for _, n := range nodes {
		want = append(want, n.name)
	}
	for _, n := range nodes {
		if err := testkit.Wait(time.Until(deadline), func() error {
			alive, err := n.alive()
			if err == nil && !slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(alive, w) }) {
				return nil
			}
			return fmt.Errorf("%s sees members %v alive (err %v); want %v", n.name, alive, err, want)
		}); err != nil {
			return err
		}
	}
	return nil
}

// dataDir is the node's data directory, kept across its restarts.
func (n *node) dataDir() string { return filepath.Join(n.dir, "data") }

// readyFile is where the node writes its addresses once it serves.
func (n *node) readyFile() string { return filepath.Join(n.dir, "ready.json") }

// adminToken sends the suite's admin token (see serveFlags) on every call.
type adminToken struct{}

func (adminToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + suiteAdminToken}, nil
}

func (adminToken) RequireTransportSecurity() bool { return false }

// connect sets up the node's edge client. Connections are made on demand
// and remade quickly after the node restarts.
func (n *node) connect() error {
	dial := func(ctx context.Context, addr string) (net.Conn, error) { return n.host.dial(ctx, addr) }
	conn, err := grpc.NewClient("passthrough:///127.0.0.1:"+grpcPort,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(adminToken{}),
		grpc.WithContextDialer(dial),
		// A sidecar retries its node quickly: gRPC's default backoff grows
		// to two minutes, which would measure the client, not the node.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}),
	)
	if err != nil {
		return fmt.Errorf("%s: client: %v", n.name, err)
	}
	n.conn = conn
	n.limit = sluicepb.NewRateLimitServiceClient(conn)
	n.admin = sluicepb.NewAdminServiceClient(conn)
	n.http = &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return n.host.dial(ctx, addr) },
			DisableKeepAlives: true,
		},
	}
	return nil
}

// start runs sluice serve in the node's namespace, appending its output to
// the node's log.
func (n *node) start() error {
	if err := os.Remove(n.readyFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	n.runs++
	fmt.Fprintf(n.log, "=== run %d of %s at %s\n", n.runs, n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("ip", n.args...)
	cmd.Env = []string{} // no SLUICE_ variable of the test's environment
	cmd.Stdout, cmd.Stderr = n.log, n.log
	// ip netns exec execs sluice in place: the child is the node itself,
	// and it dies with the test process if that is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %v", n.name, err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	n.started.Store(true)
	go func(exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(n.exited)
	return nil
}

// running reports whether the node's process runs (paused or not).
func (n *node) running() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// waitReady waits until the node has written its ready file and its
// /readyz answers 200, or deadline passes.
func (n *node) waitReady(deadline time.Time) error {
	var exited error
	err := testkit.Wait(time.Until(deadline), func() error {
		select {
		case <-n.exited:
			exited = fmt.Errorf("%s exited (%v) before it was ready", n.name, n.cmd.ProcessState)
			return nil
		default:
		}
		if _, err := os.Stat(n.readyFile()); err != nil {
			return errors.New("no ready file")
		}
		code, body, err := n.readyz()
		switch {
		case err != nil:
			return err
		case code != http.StatusOK:
			return fmt.Errorf("/readyz answers %d: %s", code, body)
		}
		return nil
	})
	if exited != nil {
		return exited
	}
	if err != nil {
		return fmt.Errorf("%s not ready in time: %v", n.name, err)
	}
	return nil
}

// readyz returns the status code of the node's /readyz.
func (n *node) readyz() (int, string, error) {
	resp, err := n.http.Get("http://127.0.0.1:" + httpPort + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// alive returns the names of the members the node sees alive.
func (n *node) alive() ([]string, error) {
	states, err := n.members(2 * time.Second)
	if err != nil {
		return nil, err
	}
	var alive []string
	for name, st := range states {
		if st.state == "alive" {
			alive = append(alive, name)
		}
	}
	slices.Sort(alive)
	return alive, nil
}

// memberState is how a node lists a member: its state in the cluster map
// and gossip ("alive", "leaving", "left", "dead", "joining"), and what
// gossip alone says of it ("alive", "dead", "left", "").
type memberState struct{ state, gossip string }

// members returns how the node lists every member, by name, asking for at
// most timeout.
func (n *node) members(timeout time.Duration) (map[string]memberState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := n.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return nil, err
	}
	states := make(map[string]memberState, len(resp.Members))
	for _, m := range resp.Members {
		states[m.Name] = memberState{m.State, m.Gossip}
	}
	return states, nil
}

// signal sends sig to the node.
func (n *node) signal(sig syscall.Signal) error {
	if err := n.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: signal %v: %v", n.name, sig, err)
	}
	return nil
}

// wait waits up to timeout for the node to exit and returns its exit code
// (-1 if a signal ended it).
func (n *node) wait(timeout time.Duration) (int, error) {
	select {
	case <-n.exited:
		return n.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s still running %v later", n.name, timeout)
	}
}

// waitStopped waits for the node to exit after SIGTERM and returns its
// exit code. A node still running after timeout is stuck: it gets SIGQUIT,
// and the error shows where its goroutines were (see stacks).
func (n *node) waitStopped(timeout time.Duration) (int, error) {
	code, err := n.wait(timeout)
	if err == nil {
		return code, nil
	}
	n.signal(syscall.SIGCONT)
	n.signal(syscall.SIGQUIT)
	n.wait(10 * time.Second)
	return 0, fmt.Errorf("%w; its goroutines in Sluice's code and Raft's at SIGQUIT:\n%s", err, n.stacks())
}

// stacks returns, from the node's last SIGQUIT dump in its log, each
// goroutine whose stack passes through Sluice's code or Raft's: its
// header line (with how long it has waited) and its functions but the
// runtime's, without their arguments and file lines.
func (n *node) stacks() string {
	b, err := os.ReadFile(n.log.Name())
	if err != nil {
		return err.Error()
	}
	i := bytes.LastIndex(b, []byte("SIGQUIT: quit"))
	if i < 0 {
		return "(no goroutine dump in the log)"
	}
	var out []string
	for _, g := range strings.Split(string(b[i:]), "\n\n") {
		if !strings.HasPrefix(g, "goroutine ") || !strings.Contains(g, "sluice-io/sluice") && !strings.Contains(g, "hashicorp/raft") {
			continue
		}
		lines := strings.Split(g, "\n")
		keep := []string{lines[0]}
		for _, l := range lines[1:] {
			if l == "" || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "runtime.") {
				continue
			}
			if i := strings.LastIndex(l, "("); i > 0 {
				l = l[:i]
			}
			keep = append(keep, "  "+l)
		}
		out = append(out, strings.Join(keep, "\n"))
	}
	return strings.Join(out, "\n")
}

// kill ends the node at once if it runs (stopped or not) and waits for it.
func (n *node) kill() {
	if n.cmd == nil {
		return
	}
	select {
	case <-n.exited:
	default:
		n.cmd.Process.Kill()
		<-n.exited
	}
}

// logLines returns the lines of the node's log (every run) that contain s.
func (n *node) logLines(s string) []string {
	b, err := os.ReadFile(n.log.Name())
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(l, []byte(s)) {
			out = append(out, string(l))
		}
	}
	return out
}

// logAfter returns up to lines lines of the node's log from the first that
// contains s.
func (n *node) logAfter(s string, lines int) string {
	b, err := os.ReadFile(n.log.Name())
	if err != nil {
		return err.Error()
	}
	i := bytes.Index(b, []byte(s))
	if i < 0 {
		return ""
	}
	all := bytes.SplitN(b[i:], []byte("\n"), lines+1)
	return string(bytes.Join(all[:min(len(all), lines)], []byte("\n")))
}

// logTail returns the last lines of the node's log, over all its runs.
func (n *node) logTail(lines int) string {
	b, err := os.ReadFile(n.log.Name())
	if err != nil {
		return err.Error()
	}
	all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return string(bytes.Join(all, []byte("\n")))
}
