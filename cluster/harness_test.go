package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster/clustertest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// / TestMain checks for leaked goroutines after the tests.
func TestMain(m *testing.M) { os.Exit(clustertest.Run(m)) }

// testLog routes a node's logs to t.Log until the test ends, and keeps the
// lines so a test can wait for one.
type testLog struct {
	mu    sync.Mutex
	t     testing.TB
	name  string
	done  bool
	lines []string
}

func (l *testLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	if !l.done {
		l.t.Log(l.name + ": " + line)
	}
	return len(p), nil
}

func (l *testLog) stop() {
	l.mu.Lock()
	l.done = true
	l.mu.Unlock()
}

func (l *testLog) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// testNode is a Membership of a test with its log.
type testNode struct {
	*Membership
	log *testLog
}

var grpcPorts atomic.Int32

// testConfig returns a config for a node on 127.0.0.1 with a random gossip
// port, fast join retries, and logs to t (debug logs with SLUICE_TEST_DEBUG=1).
func testConfig(t testing.TB, name string) (Config, *testLog) {
	level := slog.LevelInfo
	if os.Getenv("SLUICE_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	l := &testLog{t: t, name: name}
	cfg := Config{
		NodeName:       name,
		GossipAddr:     "127.0.0.1:0",
		GRPCAddr:       fmt.Sprintf("127.0.0.1:%d", 20000+grpcPorts.Add(1)),
		JoinBackoffMin: 50 * time.Millisecond,
		JoinBackoffMax: 400 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: level})),
	}
	return cfg, l
}

// newNode builds a node from cfg and shuts it down at the end of the test.
func newNode(t testing.TB, cfg Config, l *testLog) *testNode {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			t.Errorf("%s: Shutdown: %v", cfg.NodeName, err)
		}
		l.stop()
	})
	return &testNode{Membership: m, log: l}
}

// startNode starts a node named name that joins join, and fails the test if
// it cannot.
func startNode(t testing.TB, name string, join ...string) *testNode {
	t.Helper()
	cfg, l := testConfig(t, name)
	cfg.Join = join
	n := newNode(t, cfg, l)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatalf("%s: Start(join %v): %v", name, join, err)
	}
	return n
}

// startCluster starts n nodes, each joining the first.
func startCluster(t testing.TB, n int) []*testNode {
	t.Helper()
	nodes := []*testNode{startNode(t, "node-0")}
	for i := 1; i < n; i++ {
		nodes = append(nodes, startNode(t, fmt.Sprintf("node-%d", i), nodes[0].Local().GossipAddr))
	}
	waitMembers(t, 5*time.Second, nodes, n)
	return nodes
}

// waitMembers waits until every node sees exactly want live members.
func waitMembers(t testing.TB, timeout time.Duration, nodes []*testNode, want int) {
	t.Helper()
	if err := testkit.Wait(timeout, func() error {
		for _, n := range nodes {
			if got := n.View().Len(); got != want {
				return fmt.Errorf("%s sees %d members %v; want %d", n.cfg.NodeName, got, names(n.Members()), want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func names(ms []Member) []string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = m.Name
	}
	return s
}

// recorder is an Observer that counts changes by kind.
type recorder struct {
	mu      sync.Mutex
	changes map[ChangeKind]int
	joins   []error
}

func (r *recorder) Changed(kind ChangeKind, epoch uint64, members int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changes == nil {
		r.changes = make(map[ChangeKind]int)
	}
	r.changes[kind]++
}

func (r *recorder) JoinAttempt(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joins = append(r.joins, err)
}

func (r *recorder) count(kind ChangeKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changes[kind]
}
