package edge

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/node"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestLeaseRule: a route-wide rule with `lease` decides from slices the
// edge holds: exactly its limit reaches the origin, most requests without
// a call; a reload of the rules settles the old slices (their unspent
// hits go back to the key), and so does Shutdown.
func TestLeaseRule(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	o := newOrigin(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	rules := func(name string) string {
		return "routes:\n  - name: api\n    rules:\n      - {name: " + name + ", key: route, limit: 40, window: 1h, lease: {slice: 15, ttl: 1m}}\n"
	}
	writeRules(t, path, rules("api"))
	e := startEdge(t, o.url, n.Addr, func(c *Config) { c.RulesFile = path; c.RulesPollInterval = 20 * time.Millisecond })
	url := "http://" + e.Addr()
	for range 50 {
		get(t, "GET", url+"/x", nil, "")
	}
	if got := o.hits.Load(); got != 40 {
		t.Errorf("%d requests reached the origin; want exactly the limit, 40", got)
	}
	c := e.Client()
	peek := func(rule string) int64 {
		t.Helper()
		d, err := c.Check(context.Background(), client.Check{Key: "edge|" + rule + "|api", Limit: 40, Window: time.Hour, Peek: true})
		if err != nil || !d.Known() {
			t.Fatalf("peek %s: %+v, %v", rule, d, err)
		}
		return d.Remaining
	}
	if left := peek("api"); left != 0 {
		t.Fatalf("the key has %d left after 40 allowed; want 0 (is the key name right?)", left)
	}
	m := scrape(t, e)
	const lease = `sluice_edge_decisions_total{result="allowed",route="api",rule="api",source="lease"} `
	var fromLease int
	if i := strings.Index(m, lease); i >= 0 {
		fmt.Sscan(m[i+len(lease):], &fromLease)
	}
	if fromLease < 30 {
		t.Errorf("the metrics count %d allowed requests as decided from slices; want most of 40:\n%s", fromLease, m)
	}

	// A new rule (a new key) with slices open: the reload settles them.
	writeRules(t, path, rules("api2"))
	if err := testkit.Wait(10*time.Second, func() error {
		if got := get(t, "GET", url+"/x", nil, "").header.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"api2"`) {
			return fmt.Errorf("RateLimit-Policy %q; want the new rule", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	get(t, "GET", url+"/x", nil, "") // from the new rule's slice
	if left := peek("api2"); left != 40-15 {
		t.Fatalf("with a slice of 15 open: %d left; want 25", left)
	}
	writeRules(t, path, rules("api"))
	if err := testkit.Wait(10*time.Second, func() error {
		if left := peek("api2"); left != 40-2 {
			return fmt.Errorf("after the reload the replaced rule's key has %d left; want 38 (its slice settled at 2)", left)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseRuleErrors: a lease's bad TTL, and a lease where a rule cannot
// take one, are refused with the route and rule named.
func TestLeaseRuleErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"lease: {ttl: soon}":                                   `rule 0 ("r"): lease ttl "soon"`,
		"lease: {slice: 5}, shadow: true":                      "shadow rule takes no lease",
		"lease: {}, algorithm: sliding_window":                 "takes no leases",
		"lease: {slice: -1}":                                   "must not be negative",
		"lease: {}, response_cost: \"response-header:X-Cost\"": "response cost",
	} {
		f := "routes:\n  - name: a\n    rules:\n      - {name: r, key: route, limit: 10, window: 1m, " + spec + "}\n"
		if _, err := ParseRules([]byte(f)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: ParseRules = %v; want an error saying %s", spec, err, want)
		}
	}
}

// TestLeaseRuleWithToken: against a node with a refund token, a leased
// rule leases only when the edge sends it (--sluice-token); without it
// every slice request is refused, and requests are decided by calls
// instead, none by the failure policy.
func TestLeaseRuleWithToken(t *testing.T) {
	n := nodetest.Start(t, "n1", func(c *node.Config) { c.RefundToken = "r3fund" })
	for _, token := range []string{"r3fund", ""} {
		o := newOrigin(t)
		e := startEdge(t, o.url, n.Addr, func(c *Config) {
			c.Rules = &RulesFile{Routes: []RouteSpec{{Name: "api", PathPrefix: "/", Rules: []RuleSpec{
				{Name: "api" + token, Key: "route", Limit: 40, Window: "1h", Lease: &LeaseSpec{Slice: 10, TTL: "1m"}}}}}}
			c.Client.Token = token
		})
		for range 20 {
			get(t, "GET", "http://"+e.Addr()+"/x", nil, "")
		}
		m := scrape(t, e)
		leased, failed := strings.Contains(m, `source="lease"`), strings.Contains(m, `source="failure"`)
		if leased != (token != "") || failed || o.hits.Load() != 20 {
			t.Errorf("token %q: decisions from slices: %v, by the failure policy: %v, %d at the origin; want %v, false, 20:\n%s", token, leased, failed, o.hits.Load(), token != "", m)
		}
	}
}
