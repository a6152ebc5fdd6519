package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster/clustertest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestThreeNodesJoin: three nodes join through one seed; each sees all
// three with the gRPC address they advertise, and all agree on the owner
// of every key.
func TestThreeNodesJoin(t *testing.T) {
	nodes := startCluster(t, 3)
	for _, n := range nodes {
		for _, want := range nodes {
			got, ok := n.View().Member(want.cfg.NodeName)
			if !ok {
				t.Fatalf("%s does not see %s", n.cfg.NodeName, want.cfg.NodeName)
			}
			if got.GRPCAddr != want.cfg.GRPCAddr || got.GossipAddr != want.Local().GossipAddr || got.State != StateAlive {
				t.Errorf("%s sees %+v; want gRPC %s, gossip %s, alive", n.cfg.NodeName, got, want.cfg.GRPCAddr, want.Local().GossipAddr)
			}
			if !got.Started.Equal(want.Local().Started) || got.Started.IsZero() {
				t.Errorf("%s sees %s started %v; it says %v", n.cfg.NodeName, got.Name, got.Started, want.Local().Started)
			}
		}
	}
	owned := make(map[string]int)
	for i := 0; i < 1000; i++ {
		key := fmt.Sprintf("user:%d", i)
		want := nodes[0].Owner(key)
		for _, n := range nodes[1:] {
			if got := n.Owner(key); got.Name != want.Name || got.GRPCAddr != want.GRPCAddr {
				t.Fatalf("Owner(%q) on %s = %s; on %s = %s", key, n.cfg.NodeName, got.Name, nodes[0].cfg.NodeName, want.Name)
			}
		}
		owned[want.Name]++
	}
	t.Logf("1000 keys owned: %v", owned)
	for _, n := range nodes {
		if owned[n.cfg.NodeName] < 250 {
			t.Errorf("%s owns %d of 1000 keys; want about 333", n.cfg.NodeName, owned[n.cfg.NodeName])
		}
	}
}

// TestGracefulLeave: a node that leaves is gone from the others' views as
// soon as its leave is gossiped, recorded as left, and the epochs advance.
func TestGracefulLeave(t *testing.T) {
	nodes := startCluster(t, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	ea, eb := a.Epoch(), b.Epoch()

	start := time.Now()
	if err := c.Leave(2 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	waitMembers(t, 2*time.Second, nodes[:2], 2)
	t.Logf("leave seen by both peers %v after Leave began (Leave itself returned in %v)", time.Since(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	for _, n := range []*testNode{a, b} {
		var got Member
		for _, m := range n.Nodes() {
			if m.Name == c.cfg.NodeName {
				got = m
			}
		}
		if got.State != StateLeft {
			t.Errorf("%s records %s as %v; want left", n.cfg.NodeName, c.cfg.NodeName, got.State)
		}
	}
	if a.Epoch() <= ea || b.Epoch() <= eb {
		t.Errorf("epochs after the leave: %d and %d; before: %d and %d; want both higher", a.Epoch(), b.Epoch(), ea, eb)
	}
	if got := c.Local().State; got != StateLeft {
		t.Errorf("the leaver's Local().State = %v; want left", got)
	}
	if err := c.Leave(time.Second); err != nil {
		t.Errorf("second Leave: %v; want nil", err)
	}
	if err := c.Shutdown(); err != nil {
		t.Errorf("Shutdown after Leave: %v", err)
	}
	if err := c.Leave(time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("Leave after Shutdown = %v; want ErrClosed", err)
	}
}

// TestFailureDetection: a node that stops without leaving is declared dead
// by the others within the tuned detection time, and when it comes back
// under its name from another port, it is alive again with its new address
// and owns the same keys.
func TestFailureDetection(t *testing.T) {
	nodes := startCluster(t, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	ownedByC := []string{}
	for i := 0; len(ownedByC) < 20; i++ {
		if k := fmt.Sprintf("key-%d", i); a.Owner(k).Name == c.cfg.NodeName {
			ownedByC = append(ownedByC, k)
		}
	}
	cfg := a.cfg
	// Expected on loopback: the dead node is probed within a round (two
	// intervals at worst), the probe and its indirect probes take one
	// interval, then the suspicion timeout (SuspicionMult intervals once the
	// other peer confirms), then the gossip of the death: 2-3s with the
	// defaults. The bound leaves room for a loaded test machine.
	bound := 3*cfg.ProbeInterval + time.Duration(cfg.SuspicionMult)*cfg.ProbeInterval + 2*time.Second

	start := time.Now()
	if err := c.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	seen := map[string]time.Duration{}
	if err := testkit.Wait(2*bound, func() error {
		for _, n := range []*testNode{a, b} {
			if _, ok := n.View().Member(c.cfg.NodeName); !ok {
				if _, done := seen[n.cfg.NodeName]; !done {
					seen[n.cfg.NodeName] = time.Since(start)
				}
			}
		}
		if len(seen) < 2 {
			return fmt.Errorf("dead node still seen; detected so far: %v", seen)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	worst := max(seen[a.cfg.NodeName], seen[b.cfg.NodeName])
	t.Logf("failure detected by %s after %v, by %s after %v (probe %v, timeout %v, suspicion mult %d; bound %v)",
		a.cfg.NodeName, seen[a.cfg.NodeName].Round(time.Millisecond), b.cfg.NodeName, seen[b.cfg.NodeName].Round(time.Millisecond),
		cfg.ProbeInterval, cfg.ProbeTimeout, cfg.SuspicionMult, bound)
	if worst > bound {
		t.Errorf("failure detected after %v; want within %v", worst, bound)
	}
	for _, m := range a.Nodes() {
		if m.Name == c.cfg.NodeName && m.State != StateDead {
			t.Errorf("%s records %s as %v; want dead", a.cfg.NodeName, m.Name, m.State)
		}
	}
	for _, k := range ownedByC {
		if o := a.Owner(k); o.Name == c.cfg.NodeName {
			t.Fatalf("Owner(%q) = %s after it died", k, o.Name)
		}
	}

	// The node comes back under the same name, from another port.
	c2 := startNode(t, c.cfg.NodeName, b.Local().GossipAddr)
	if c2.Local().GossipAddr == c.Local().GossipAddr {
		t.Fatalf("restarted node reuses gossip address %s; the test wants a new one", c2.Local().GossipAddr)
	}
	if err := testkit.Wait(5*time.Second, func() error {
		got, ok := a.View().Member(c.cfg.NodeName)
		if !ok || got.GossipAddr != c2.Local().GossipAddr || !got.Started.Equal(c2.Local().Started) {
			return fmt.Errorf("%s sees %s as %+v (present %v); want it back at %s", a.cfg.NodeName, c.cfg.NodeName, got, ok, c2.Local().GossipAddr)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, k := range ownedByC {
		if o := a.Owner(k); o.Name != c.cfg.NodeName {
			t.Errorf("Owner(%q) = %s after %s came back on a new address; want %s", k, o.Name, c.cfg.NodeName, c.cfg.NodeName)
		}
	}
}

// TestGossipKey: a node with another key, or none, cannot join an
// encrypted cluster; a node with the right key can.
func TestGossipKey(t *testing.T) {
	key := []byte("0123456789abcdef")
	cfg, l := testConfig(t, "seed")
	cfg.GossipKey = key
	seed := newNode(t, cfg, l)
	if err := seed.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	seedAddr := seed.Local().GossipAddr

	for _, tc := range []struct {
		name string
		key  []byte
	}{
		{"wrong-key", []byte("fedcba9876543210")},
		{"no-key", nil},
		{"aes256-key", []byte("0123456789abcdef0123456789abcdef")},
	} {
		cfg, l := testConfig(t, tc.name)
		cfg.GossipKey = tc.key
		cfg.Join = []string{seedAddr}
		n := newNode(t, cfg, l)
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		err := n.Start(ctx)
		cancel()
		if !errors.Is(err, ErrJoin) {
			t.Errorf("%s: Start = %v; want ErrJoin", tc.name, err)
		}
		if _, ok := seed.View().Member(tc.name); ok {
			t.Errorf("%s: the seed lists the node; want it kept out", tc.name)
		}
	}

	cfg, l = testConfig(t, "right-key")
	cfg.GossipKey = key
	cfg.Join = []string{seedAddr}
	good := newNode(t, cfg, l)
	if err := good.Start(context.Background()); err != nil {
		t.Fatalf("right key: Start: %v", err)
	}
	waitMembers(t, 3*time.Second, []*testNode{seed, good}, 2)
	for _, m := range seed.Nodes() {
		if m.Name != "seed" && m.Name != "right-key" {
			t.Errorf("the seed knows %s (%v); want only itself and right-key", m.Name, m.State)
		}
	}
}

// TestJoinDNSName: the join list may name hosts, resolved through DNS.
func TestJoinDNSName(t *testing.T) {
	seed := startNode(t, "seed")
	_, port, _ := net.SplitHostPort(seed.Local().GossipAddr)
	n := startNode(t, "joiner", "localhost:"+port)
	waitMembers(t, 3*time.Second, []*testNode{seed, n}, 2)
}

// TestJoinRetry: a node whose join list is not up yet keeps retrying, and
// joins once the seed starts.
func TestJoinRetry(t *testing.T) {
	port := clustertest.FreePort(t, "127.0.0.1")
	cfg, l := testConfig(t, "joiner")
	rec := &recorder{}
	cfg.Observer = rec
	cfg.Join = []string{"localhost:" + strconv.Itoa(port)}
	joiner := newNode(t, cfg, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- joiner.Start(ctx) }()

	if err := testkit.Wait(3*time.Second, func() error {
		if !l.contains("join attempt failed") {
			return errors.New("the joiner logged no failed attempt yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	scfg, sl := testConfig(t, "seed")
	scfg.GossipAddr = "127.0.0.1:" + strconv.Itoa(port)
	seed := newNode(t, scfg, sl)
	if err := seed.Start(context.Background()); err != nil {
		t.Fatalf("seed: Start: %v", err)
	}
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("joiner: Start = %v; want nil once the seed is up", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("joiner: Start still retrying 5s after the seed came up")
	}
	waitMembers(t, 3*time.Second, []*testNode{seed, joiner}, 2)
	rec.mu.Lock()
	attempts, last := len(rec.joins), rec.joins[len(rec.joins)-1]
	rec.mu.Unlock()
	t.Logf("joined after %d attempts", attempts)
	if attempts < 2 || last != nil {
		t.Errorf("observer saw %d join attempts, the last with error %v; want at least 2, the last nil", attempts, last)
	}
}

// TestJoinGivesUp: Start fails with ErrJoin when nobody answers before its
// context ends, and leaves nothing running.
func TestJoinGivesUp(t *testing.T) {
	cfg, l := testConfig(t, "lonely")
	cfg.Join = []string{"127.0.0.1:" + strconv.Itoa(clustertest.FreePort(t, "127.0.0.1")), "no-such-host.invalid:7946"}
	n := newNode(t, cfg, l)
	n.lookupIP = func(ctx context.Context, host string) ([]net.IPAddr, error) {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := n.Start(ctx)
	if !errors.Is(err, ErrJoin) {
		t.Fatalf("Start = %v; want ErrJoin", err)
	}
	if !strings.Contains(err.Error(), "no-such-host.invalid") || !strings.Contains(err.Error(), "refused") {
		t.Errorf("Start error %q does not say which addresses failed", err)
	}
	if err := n.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after a failed Start = %v; want ErrClosed", err)
	}
}

// TestJoinSelfOnly: a join list that names only this node starts a new
// cluster instead of waiting forever (a StatefulSet of one, or the first
// pod to appear in its headless Service).
func TestJoinSelfOnly(t *testing.T) {
	port := clustertest.FreePort(t, "127.0.0.1")
	cfg, l := testConfig(t, "solo")
	cfg.GossipAddr = "127.0.0.1:" + strconv.Itoa(port)
	cfg.Join = []string{"localhost:" + strconv.Itoa(port)}
	n := newNode(t, cfg, l)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatalf("Start with only itself to join = %v; want nil", err)
	}
	if got := n.View().Len(); got != 1 {
		t.Errorf("solo node sees %d members; want 1", got)
	}
}

// TestRejoinMergesSoloNodes: two pods of a headless Service that each
// started alone (DNS listed only itself) find each other through the rejoin
// loop once DNS lists both.
func TestRejoinMergesSoloNodes(t *testing.T) {
	ips := []string{"127.0.0.1", "127.0.0.2"}
	port := clustertest.FreePort(t, ips...)
	var bothVisible atomic.Bool
	var nodes []*testNode
	for i, ip := range ips {
		cfg, l := testConfig(t, fmt.Sprintf("pod-%d", i))
		cfg.GossipAddr = net.JoinHostPort(ip, strconv.Itoa(port))
		cfg.Join = []string{"pods.test"} // the gossip port is implied
		cfg.RejoinInterval = 100 * time.Millisecond
		n := newNode(t, cfg, l)
		own := net.IPAddr{IP: net.ParseIP(ip)}
		n.lookupIP = func(ctx context.Context, host string) ([]net.IPAddr, error) {
			if host != "pods.test" {
				return nil, fmt.Errorf("lookup %s: no such host", host)
			}
			if bothVisible.Load() {
				return []net.IPAddr{{IP: net.ParseIP(ips[0])}, {IP: net.ParseIP(ips[1])}}, nil
			}
			return []net.IPAddr{own}, nil
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatalf("%s: Start = %v; want a new cluster of one", cfg.NodeName, err)
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		if got := n.View().Len(); got != 1 {
			t.Fatalf("%s sees %d members before DNS lists both; want 1", n.cfg.NodeName, got)
		}
	}
	bothVisible.Store(true)
	waitMembers(t, 3*time.Second, nodes, 2)
}

// TestSubscribe: a subscriber gets the current view, then every change
// with increasing epochs; the observer counts the changes; Shutdown closes
// the channel.
func TestSubscribe(t *testing.T) {
	cfg, l := testConfig(t, "a")
	rec := &recorder{}
	cfg.Observer = rec
	a := newNode(t, cfg, l)
	views, cancel := a.Subscribe()
	defer cancel()
	if v := <-views; v.Epoch != 0 || v.Len() != 0 {
		t.Errorf("first view before Start: epoch %d, %d members; want 0 and 0", v.Epoch, v.Len())
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	b := startNode(t, "b", a.Local().GossipAddr)

	var last uint64
	deadline := time.After(3 * time.Second)
	for {
		select {
		case v := <-views:
			if v.Epoch <= last {
				t.Fatalf("view epoch %d after %d; want increasing", v.Epoch, last)
			}
			last = v.Epoch
			if v.Len() < 2 {
				continue
			}
		case <-deadline:
			t.Fatalf("no view with 2 members; last epoch %d", last)
		}
		break
	}
	if err := b.Leave(time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := testkit.Wait(2*time.Second, func() error {
		if got := rec.count(ChangeLeft); got != 1 {
			return fmt.Errorf("observer counted %d leaves; want 1 (changes %v)", got, rec.changes)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := rec.count(ChangeJoined); got != 2 {
		t.Errorf("observer counted %d joins; want 2 (itself and b)", got)
	}

	other, cancelOther := a.Subscribe()
	cancelOther()
	if _, ok := <-other; ok {
		if _, ok := <-other; ok {
			t.Errorf("a cancelled subscription's channel is still open")
		}
	}
	cancelOther() // twice is fine

	if err := a.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for range views { // drains, then ends: Shutdown closed it
	}
	if closed, _ := a.Subscribe(); closed != nil {
		if _, ok := <-closed; ok {
			t.Errorf("Subscribe after Shutdown returned an open channel")
		}
	}
}

// TestStartErrors: a gossip port in use fails Start at once; Start twice,
// and calls before Start, are refused; Shutdown is idempotent.
func TestStartErrors(t *testing.T) {
	a := startNode(t, "a")
	if err := a.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start = %v; want ErrStarted", err)
	}

	cfg, l := testConfig(t, "b")
	cfg.GossipAddr = a.Local().GossipAddr
	b := newNode(t, cfg, l)
	if err := b.Leave(time.Second); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Leave before Start = %v; want ErrNotStarted", err)
	}
	if err := b.Join(context.Background(), []string{"x:1"}); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Join before Start = %v; want ErrNotStarted", err)
	}
	if got := b.Owner("k"); got.Name != "" {
		t.Errorf("Owner before Start = %+v; want the zero Member", got)
	}
	err := b.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), a.Local().GossipAddr) {
		t.Errorf("Start on a port in use = %v; want an error naming %s", err, a.Local().GossipAddr)
	}
	if err := b.Shutdown(); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := b.Shutdown(); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	if err := b.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Shutdown = %v; want ErrClosed", err)
	}
}

// TestGRPCAddrUnspecifiedHost: a gRPC address without a host is advertised
// with the gossip IP.
func TestGRPCAddrUnspecifiedHost(t *testing.T) {
	cfg, l := testConfig(t, "a")
	cfg.GRPCAddr = ":8081"
	a := newNode(t, cfg, l)
	if err := a.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	b := startNode(t, "b", a.Local().GossipAddr)
	if err := testkit.Wait(2*time.Second, func() error {
		if got, _ := b.View().Member("a"); got.GRPCAddr != "127.0.0.1:8081" {
			return fmt.Errorf("b sees a's gRPC address as %q; want 127.0.0.1:8081", got.GRPCAddr)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestPeerAndAdminAddrs: a node's peer and admin addresses reach the
// other members, an unspecified host advertised with the gossip IP, and
// metadata from a node that sends only a gRPC address (every version
// before separate listeners) means all three on it.
func TestPeerAndAdminAddrs(t *testing.T) {
	cfg, l := testConfig(t, "a")
	cfg.PeerAddr, cfg.AdminAddr = "0.0.0.0:9082", "127.0.0.1:9083"
	a := newNode(t, cfg, l)
	if err := a.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	b := startNode(t, "b", a.Local().GossipAddr)
	if err := testkit.Wait(2*time.Second, func() error {
		got, _ := b.View().Member("a")
		if got.GRPCAddr != cfg.GRPCAddr || got.PeerAddr != "127.0.0.1:9082" || got.AdminAddr != "127.0.0.1:9083" {
			return fmt.Errorf("b sees a at gRPC %q, peer %q, admin %q; want %q, 127.0.0.1:9082, 127.0.0.1:9083", got.GRPCAddr, got.PeerAddr, got.AdminAddr, cfg.GRPCAddr)
		}
		if got, _ := a.View().Member("b"); got.PeerAddr != got.GRPCAddr || got.AdminAddr != got.GRPCAddr {
			return fmt.Errorf("a sees b (no peer or admin address) as %+v; want both on its gRPC address", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		in          string
		peer, admin string
	}{
		{`{"grpc":"10.0.0.1:8081","started":1,"inc":2}`, "10.0.0.1:8081", "10.0.0.1:8081"},
		{`{"grpc":"10.0.0.1:8081","peer":"10.0.0.1:8082","started":1}`, "10.0.0.1:8082", "10.0.0.1:8081"},
		{`{"grpc":"10.0.0.1:8081","admin":"10.0.0.1:8083","started":1,"future":true}`, "10.0.0.1:8081", "10.0.0.1:8083"},
	} {
		md, err := decodeMeta([]byte(tt.in))
		if err != nil || md.peerAddr() != tt.peer || md.adminAddr() != tt.admin {
			t.Errorf("decodeMeta(%s) = peer %q, admin %q, %v; want %q, %q", tt.in, md.peerAddr(), md.adminAddr(), err, tt.peer, tt.admin)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := func(c *Config) {}
	tests := []struct {
		name   string
		change func(*Config)
		want   string // substring of the error; empty for valid
	}{
		{"defaults", ok, ""},
		{"gossip host name", func(c *Config) { c.GossipAddr = "localhost:7946" }, "not an IP"},
		{"gossip no port", func(c *Config) { c.GossipAddr = "127.0.0.1" }, "gossip addr"},
		{"advertise port 0", func(c *Config) { c.AdvertiseAddr = "10.0.0.1:0" }, "advertise"},
		{"advertise unspecified", func(c *Config) { c.AdvertiseAddr = "0.0.0.0:7946" }, "reachable"},
		{"no gRPC", func(c *Config) { c.GRPCAddr = "" }, "gRPC addr is required"},
		{"gRPC no port", func(c *Config) { c.GRPCAddr = "127.0.0.1" }, "gRPC addr"},
		{"join without port", func(c *Config) { c.Join = []string{"sluice-headless"} }, ""},
		{"join bad port", func(c *Config) { c.Join = []string{"host:99999"} }, "join"},
		{"join without port on a random port", func(c *Config) { c.GossipAddr = "127.0.0.1:0"; c.Join = []string{"seed"} }, "random"},
		{"short key", func(c *Config) { c.GossipKey = []byte("short") }, "16, 24 or 32"},
		{"key 32", func(c *Config) { c.GossipKey = make([]byte, 32) }, ""},
		{"probe timeout above interval", func(c *Config) { c.ProbeTimeout = 2 * c.ProbeInterval }, "probe timeout"},
		{"backoff inverted", func(c *Config) { c.JoinBackoffMin = time.Minute }, "backoff"},
		{"long name", func(c *Config) { c.NodeName = strings.Repeat("n", 200) }, "node name"},
		{"peer and admin", func(c *Config) { c.PeerAddr, c.AdminAddr = "0.0.0.0:8082", "[::]:8083" }, ""},
		{"peer no port", func(c *Config) { c.PeerAddr = "10.0.0.1" }, "peer addr"},
		{"admin port 0", func(c *Config) { c.AdminAddr = "10.0.0.1:0" }, "admin addr"},
		{"peer too long", func(c *Config) { c.PeerAddr = strings.Repeat("p", 300) + ":1" }, "peer addr is"},
		{"addresses over the metadata limit", func(c *Config) {
			long := strings.Repeat("h", 200)
			c.GRPCAddr, c.PeerAddr, c.AdminAddr = long+":1", long+":2", long+":3"
		}, "gossip metadata"},
		{"escaped characters over the metadata limit", func(c *Config) { c.GRPCAddr = strings.Repeat("<", 120) + ":1" }, "gossip metadata"},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		c.GRPCAddr = "127.0.0.1:8081"
		tt.change(&c)
		err := c.Validate()
		if tt.want == "" && err != nil {
			t.Errorf("%s: Validate = %v; want nil", tt.name, err)
		}
		if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: Validate = %v; want an error containing %q", tt.name, err, tt.want)
		}
	}
	if d := DefaultConfig(); d.GossipAddr != "127.0.0.1:7946" || d.ProbeInterval != 500*time.Millisecond || d.NodeName == "" {
		t.Errorf("DefaultConfig() = %+v; want gossip 127.0.0.1:7946, probe 500ms, the host name", d)
	}
}
