package node

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestLeaseRuleLedger: a hot key of a lease rule, asked through all three
// nodes of a cluster five times beyond its limit, two fake milliseconds
// apart for four windows. The nodes that do not own it decide its hits
// from quota lease slices (their metrics say so); every window of the
// fake clock still allows at most the limit, and the key is used: the
// slices do not starve it. In owner-crash, the owner is killed halfway,
// the others' slices out: its standby goes on from its copy, which counts
// them; in holder-crash, a node holding a slice is, and its slice counts
// whole until a window after its expiry.
func TestLeaseRuleLedger(t *testing.T) {
	t.Parallel()
	t.Run("steady", func(t *testing.T) {
		t.Parallel()
		leaseRuleLedger(t, "", false)
	})
	t.Run("hot-key", func(t *testing.T) {
		// No lease rule: --lease-hot-keys leases the key once the
		// nodes' traffic shows it hot.
		t.Parallel()
		leaseRuleLedger(t, "", true)
	})
	for _, victim := range []string{"owner", "holder"} {
		t.Run(victim+"-crash", func(t *testing.T) {
			t.Parallel()
			if testing.Short() {
				t.Skip("waits for failure detection")
			}
			leaseRuleLedger(t, victim, false)
		})
	}
}

// leaseRuleLedger runs TestLeaseRuleLedger, with the key's owner or one
// of the nodes holding its slices killed halfway if crash says which;
// with hot, the rule does not lease and the nodes lease hot keys
// (--lease-hot-keys 1).
func leaseRuleLedger(t *testing.T, crash string, hot bool) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	const limit = 100
	lease := "\n    lease: true"
	if hot {
		lease = ""
	}
	if err := os.WriteFile(path, []byte(`domain: hot
descriptors:
  - key: tenant`+lease+`
    rate_limit: {unit: second, requests_per_unit: 100}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.LimitsFile, c.Router.Replicas = path, 2
		if hot {
			c.LeaseHotKeys = 1
		}
	})
	req := &rlsv3.RateLimitRequest{Domain: "hot", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}},
	}}}
	owner, _ := tc.nodes[0].srv.Router().Owner("hot|tenant=acme")
	// A bound on the whole run (failover included) on a loaded machine,
	// not a timing of it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	live := tc.nodes
	var allowed []time.Time // the fake clock's time of each allowed hit
	local := 0.0
	for step := 0; step < 2000; step++ {
		if crash != "" && step == 1000 {
			for _, ts := range tc.nodes {
				local += metric(t, ts, "sluice_lease_local_decisions_total")
			}
			var rest []*testServer
			killed := false
			for _, ts := range tc.nodes {
				if !killed && (ts.cfg.NodeName == owner) == (crash == "owner") {
					ts.crash()
					killed = true
				} else {
					rest = append(rest, ts)
				}
			}
			live = rest
			tc.waitMembers(2)
		}
		tc.clk.Advance(2 * time.Millisecond)
		ts := live[step%len(live)]
		resp, err := shouldRateLimit(ctx, rlsv3.NewRateLimitServiceClient(ts.conn), req)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			allowed = append(allowed, tc.clk.Now())
		}
	}
	most := mostInASecond(allowed)
	for _, ts := range live {
		local += metric(t, ts, "sluice_lease_local_decisions_total")
	}
	t.Logf("%d of 2000 hits allowed over 4 s, at most %d within one second (limit %d); %.0f decided from slices (owner %s)", len(allowed), most, limit, local, owner)
	if most > limit {
		t.Fatalf("%d hits allowed within one second; want at most the limit %d", most, limit)
	}
	if local == 0 {
		t.Fatal("no hit was decided from a slice")
	}
	if len(allowed) < 2*limit {
		t.Fatalf("%d hits allowed in four windows of %d: the slices starved the key", len(allowed), limit)
	}
}

// mostInASecond returns the most of the times allowed (in order) that fall
// within one second.
func mostInASecond(allowed []time.Time) int {
	most := 0
	for i := range allowed {
		n := 0
		for j := i; j < len(allowed) && allowed[j].Before(allowed[i].Add(time.Second)); j++ {
			n++
		}
		most = max(most, n)
	}
	return most
}

// metric returns the value of the counter name on ts's /metrics.
func metric(t *testing.T, ts *testServer, name string) float64 {
	t.Helper()
	_, body := httpGet(t, "http://"+ts.srv.HTTPAddr()+"/metrics")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestLeaseRuleFairShare: a lease rule's key asked through the two nodes
// that do not own it, one at 500 hits a second and the other at 25, on
// the fake clock. Each node states its demand with its slice requests,
// so the owner divides the key by max-min fair share: the modest node
// gets about all it asks for, although the greedy one asks twenty times as
// often and is denied at home once it holds its share; no second of the
// fake clock allows more than the limit.
func TestLeaseRuleFairShare(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	const limit = 100
	if err := os.WriteFile(path, []byte(`domain: hot
descriptors:
  - key: tenant
    lease: true
    rate_limit: {unit: second, requests_per_unit: 100}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := newTestClusterWith(t, 3, func(c *Config) { c.LimitsFile = path })
	req := &rlsv3.RateLimitRequest{Domain: "hot", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}},
	}}}
	owner, _ := tc.nodes[0].srv.Router().Owner("hot|tenant=acme")
	var holders []*testServer
	for _, ts := range tc.nodes {
		if ts.cfg.NodeName != owner {
			holders = append(holders, ts)
		}
	}
	greedy, modest := holders[0], holders[1]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var allowed []time.Time
	asked, got := 0, 0 // the modest node's, over the last two seconds
	ask := func(ts *testServer) bool {
		resp, err := shouldRateLimit(ctx, rlsv3.NewRateLimitServiceClient(ts.conn), req)
		if err != nil {
			t.Fatal(err)
		}
		ok := resp.OverallCode == rlsv3.RateLimitResponse_OK
		if ok {
			allowed = append(allowed, tc.clk.Now())
		}
		return ok
	}
	const steps = 1750 // 2 ms each: three and a half seconds
	for step := range steps {
		tc.clk.Advance(2 * time.Millisecond)
		ask(greedy)
		if step%20 == 0 {
			ok := ask(modest)
			if step >= steps-1000 {
				asked++
				if ok {
					got++
				}
			}
		}
	}
	most := mostInASecond(allowed)
	deniedHere := metric(t, greedy, "sluice_lease_denied_here_total")
	t.Logf("modest node: %d of %d allowed over the last two seconds; %d allowed in all, at most %d within one second (limit %d); greedy node denied %.0f at home",
		got, asked, len(allowed), most, limit, deniedHere)
	if most > limit {
		t.Fatalf("%d hits allowed within one second; want at most the limit %d", most, limit)
	}
	if got < asked*8/10 {
		t.Fatalf("the modest node had %d of its %d hits allowed; want at least 80%%: its demand is below its fair share", got, asked)
	}
	if deniedHere == 0 {
		t.Fatal("the greedy node denied nothing at home")
	}
}
