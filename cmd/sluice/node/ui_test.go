package node

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// uiGet fetches a /ui/ path from the node at httpAddr with token (if any)
// and decodes its JSON into v (if not nil). It returns the status and body.
func uiGet(t *testing.T, httpAddr, path, token string, v any) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+httpAddr+"/ui/"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("GET /ui/%s: %v in %s", path, err, body)
		}
	}
	return resp.StatusCode, string(body)
}

// The JSON of the pages, as far as the tests read it.
type (
	uiOverview struct {
		Node    string `json:"node"`
		Epoch   uint64 `json:"epoch"`
		Members []struct {
			Name            string   `json:"name"`
			State           string   `json:"state"`
			Share           float64  `json:"share"`
			Error           string   `json:"error"`
			UptimeMs        float64  `json:"uptimeMs"`
			DecisionsPerSec float64  `json:"decisionsPerSec"`
			DenialsPerSec   float64  `json:"denialsPerSec"`
			ErrorsPerSec    float64  `json:"errorsPerSec"`
			Requests        uint64   `json:"requests"`
			MaxMs           float64  `json:"maxMs"`
			Decisions       []uint64 `json:"decisions"`
		} `json:"members"`
		Changes []struct {
			Epoch  uint64 `json:"epoch"`
			Kind   string `json:"kind"`
			Member string `json:"member"`
		} `json:"changes"`
		Series struct {
			Start     int64    `json:"start"`
			Decisions []uint64 `json:"decisions"`
			Denials   []uint64 `json:"denials"`
			Errors    []uint64 `json:"errors"`
		} `json:"series"`
		TopDecisions uiTop `json:"topDecisions"`
		TopDenials   uiTop `json:"topDenials"`
	}
	uiTop struct {
		WindowMs float64 `json:"windowMs"`
		Floor    uint64  `json:"floor"`
		Total    uint64  `json:"total"`
		Keys     []struct {
			Key   string `json:"key"`
			Count uint64 `json:"count"`
			Error uint64 `json:"error"`
			Owner string `json:"owner"`
		} `json:"keys"`
	}
	uiKey struct {
		Key          string  `json:"key"`
		Found        bool    `json:"found"`
		Node         string  `json:"node"`
		Owner        string  `json:"owner"`
		Standby      string  `json:"standby"`
		Algorithm    string  `json:"algorithm"`
		Limit        int64   `json:"limit"`
		WindowMs     float64 `json:"windowMs"`
		Used         int64   `json:"used"`
		Remaining    int64   `json:"remaining"`
		RetryAfterMs float64 `json:"retryAfterMs"`
		ResetAfterMs float64 `json:"resetAfterMs"`
		Runs         []struct {
			AtMs  float64 `json:"atMs"`
			Count int64   `json:"count"`
		} `json:"runs"`
		Override *struct {
			Key         string  `json:"key"`
			Prefix      bool    `json:"prefix"`
			Limit       int64   `json:"limit"`
			ExpiresInMs float64 `json:"expiresInMs"`
			Note        string  `json:"note"`
		} `json:"override"`
		Holders []struct {
			Holder       string `json:"holder"`
			Reservations int64  `json:"reservations"`
			Leases       int64  `json:"leases"`
			Hits         int64  `json:"hits"`
			ExpiresAt    string `json:"expiresAt"`
		} `json:"holders"`
		LeaseDenials int64 `json:"leaseDenials"`
	}
)

// top prints a top list as "key=count±error@owner ...".
func (t uiTop) String() string {
	var b strings.Builder
	for _, k := range t.Keys {
		fmt.Fprintf(&b, "%s=%d±%d@%s ", k.Key, k.Count, k.Error, k.Owner)
	}
	return b.String()
}

// check sends cost-1 checks of key against limit per minute through ts,
// n times.
func (ts *testServer) check(t *testing.T, key string, limit int64, n int) {
	t.Helper()
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	for range n {
		if _, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, limit, time.Minute, 1)}}); err != nil {
			t.Fatalf("Check(%s) = %v", key, err)
		}
	}
}

// TestUISingleNode: the pages' data on one node, from real decisions:
// members, rates, the per-second series, the top keys, a key's sliding
// log with its override, the overrides and the Envoy key lookup; and the
// pages themselves, with their security headers.
func TestUISingleNode(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, nil)
	addr := ts.srv.HTTPAddr()
	ts.check(t, "tenant:hot", 10, 30) // 10 allowed, 20 denied
	ts.clk.Advance(2 * time.Second)
	ts.check(t, "tenant:hot", 10, 5) // denied
	ts.check(t, "tenant:cold", 10, 3)
	expires := epoch.Add(time.Hour)
	if _, err := ts.admin().SetOverride(ts.ctx(), &sluicepb.SetOverrideRequest{Override: &sluicepb.Override{
		Key: []byte("tenant:"), Prefix: true, Limit: 12, Note: "INC-7", ExpiresAt: timestamppb.New(expires),
	}}); err != nil {
		t.Fatal(err)
	}
	ts.clk.Advance(1500 * time.Millisecond) // read 3.5 s after the first hits

	var o uiOverview
	if code, body := uiGet(t, addr, "api/overview?seconds=10&top=5", "", &o); code != 200 {
		t.Fatalf("GET overview = %d %s", code, body)
	}
	if len(o.Members) != 1 || o.Node != "test-node" {
		t.Fatalf("overview members = %+v; want test-node alone", o.Members)
	}
	m := o.Members[0]
	// Whole seconds: the first (30 decisions, 20 denials), the third (8, 5).
	if m.Name != "test-node" || m.State != "alive" || m.Share != 1 || m.Error != "" || m.UptimeMs != 3500 ||
		m.DecisionsPerSec != 3.8 || m.DenialsPerSec != 2.5 || m.Requests != 38 || m.MaxMs <= 0 {
		t.Errorf("member = %+v; want test-node alive, share 1, up 3.5 s, 3.8 decisions/s, 2.5 denials/s over 10 s, 38 requests", m)
	}
	// The series: the whole seconds before the current one.
	if got, want := fmt.Sprint(o.Series.Decisions), "[0 0 0 0 0 0 0 30 0 8]"; got != want || o.Series.Start != epoch.Unix()-7 {
		t.Errorf("series decisions = %s from %d; want %s from %d", got, o.Series.Start, want, epoch.Unix()-7)
	}
	if got, want := fmt.Sprint(m.Decisions), fmt.Sprint(o.Series.Decisions); got != want {
		t.Errorf("member decisions = %s; want the series of the only node, %s", got, want)
	}
	if got, want := o.TopDecisions.String(), "tenant:hot=35±0@test-node tenant:cold=3±0@test-node "; got != want {
		t.Errorf("top decisions = %s; want %s", got, want)
	}
	if got, want := o.TopDenials.String(), "tenant:hot=25±0@test-node "; got != want || o.TopDenials.Total != 25 {
		t.Errorf("top denials = %s (total %d); want %s (total 25)", got, o.TopDenials.Total, want)
	}
	if len(o.Changes) != 0 || o.Epoch != 0 {
		t.Errorf("changes %v, epoch %d; want none on a single node", o.Changes, o.Epoch)
	}

	var k uiKey
	if code, body := uiGet(t, addr, "api/key?key="+url.QueryEscape("tenant:hot"), "", &k); code != 200 {
		t.Fatalf("GET key = %d %s", code, body)
	}
	if !k.Found || k.Algorithm != "sliding log" || k.Limit != 10 || k.WindowMs != 60000 || k.Used != 10 || k.Remaining != 0 ||
		k.RetryAfterMs != 56500 || k.ResetAfterMs != 56500 || k.Owner != "test-node" || k.Node != "test-node" || k.Standby != "" ||
		len(k.Runs) != 1 || k.Runs[0].AtMs != -3500 || k.Runs[0].Count != 10 {
		t.Errorf("key tenant:hot = %+v; want a sliding log of 10 per 1m, 10 hits 3.5 s ago, retry and reset after 56.5 s, owned by test-node, no standby", k)
	}
	if ov := k.Override; ov == nil || ov.Key != "tenant:" || !ov.Prefix || ov.Limit != 12 || ov.Note != "INC-7" || ov.ExpiresInMs != 3600000-3500 {
		t.Errorf("key tenant:hot override = %+v; want the prefix override tenant: (limit 12, INC-7, expiring in 1h less 3.5 s)", ov)
	}
	if len(k.Holders) != 0 {
		t.Errorf("key tenant:hot holders = %+v; want none", k.Holders)
	}

	// A quota lease with a holder, and a check it makes a denial.
	lease := nativeCheck("api:leased", 10, time.Minute, 7)
	lease.ReserveFor, lease.Lease, lease.Holder = durationpb.New(time.Minute), true, "web-1"
	if _, err := sluicepb.NewRateLimitServiceClient(ts.conn).Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{lease}}); err != nil {
		t.Fatal(err)
	}
	ts.check(t, "api:leased", 10, 4) // 3 allowed, 1 denied
	var lk uiKey
	if code, body := uiGet(t, addr, "api/key?key="+url.QueryEscape("api:leased"), "", &lk); code != 200 {
		t.Fatalf("GET key = %d %s", code, body)
	}
	if len(lk.Holders) != 1 || lk.Holders[0].Holder != "web-1" || lk.Holders[0].Leases != 1 || lk.Holders[0].Hits != 7 || lk.Holders[0].ExpiresAt == "" || lk.LeaseDenials != 1 {
		t.Errorf("key api:leased holders %+v, lease denials %d; want web-1 holding one lease of 7, 1 denial", lk.Holders, lk.LeaseDenials)
	}
	if code, body := uiGet(t, addr, "api/key?key="+url.QueryEscape(`nobody\x00`), "", &k); code != 200 || k.Found || k.Key != `nobody\x00` {
		t.Errorf(`GET key nobody\x00 = %d %s; want found false, the key shown as it was asked`, code, body)
	}
	if code, _ := uiGet(t, addr, "api/key?key="+url.QueryEscape(`bad\q`), "", nil); code != 400 {
		t.Errorf(`GET key bad\q = %d; want 400`, code)
	}

	var ovs struct {
		Overrides []struct {
			Key    string  `json:"key"`
			Prefix bool    `json:"prefix"`
			Limit  int64   `json:"limit"`
			Note   string  `json:"note"`
			Window float64 `json:"windowMs"`
		} `json:"overrides"`
	}
	if code, body := uiGet(t, addr, "api/overrides", "", &ovs); code != 200 || len(ovs.Overrides) != 1 || ovs.Overrides[0].Key != "tenant:" || ovs.Overrides[0].Note != "INC-7" {
		t.Errorf("GET overrides = %d %s; want the one override", code, body)
	}
	var ek struct{ Key string }
	if code, body := uiGet(t, addr, "api/envoykey?domain=edge&entry=remote_address%3D10.0.0.1&entry=path%3D%2Fa", "", &ek); code != 200 || ek.Key != "edge|remote_address=10.0.0.1|path=/a" {
		t.Errorf("GET envoykey = %d %s; want edge|remote_address=10.0.0.1|path=/a", code, body)
	}
	if code, body := uiGet(t, addr, "api/envoykey?domain=edge", "", nil); code != 400 || !strings.Contains(body, "entries") {
		t.Errorf("GET envoykey without entries = %d %s; want 400 naming the entries", code, body)
	}

	for _, page := range []string{"", "key.html", "overrides.html", "app.js", "style.css"} {
		resp, err := http.Get("http://" + addr + "/ui/" + page)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("GET /ui/%s = %d, CSP %q; want 200 with a CSP", page, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
	}
	if code, _ := uiGet(t, addr, "api/nothing", "", nil); code != 404 {
		t.Errorf("GET /ui/api/nothing = %d; want 404", code)
	}
}

// TestUIAdminToken: with an admin token, the pages' data needs it as a
// bearer token (a wrong one is refused); the pages themselves hold no data
// and need none.
func TestUIAdminToken(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, func(c *Config) { c.AdminToken = "s3cret" })
	addr := ts.srv.HTTPAddr()
	for _, path := range []string{"api/overview", "api/key?key=a", "api/overrides", "api/envoykey?domain=d&entry=a=b"} {
		for _, token := range []string{"", "wrong"} {
			if code, body := uiGet(t, addr, path, token, nil); code != http.StatusUnauthorized || !strings.Contains(body, "admin token") {
				t.Errorf("GET /ui/%s with token %q = %d %s; want 401 asking for the admin token", path, token, code, body)
			}
		}
		if code, body := uiGet(t, addr, path, "s3cret", nil); code != 200 {
			t.Errorf("GET /ui/%s with the token = %d %s; want 200", path, code, body)
		}
	}
	if code, _ := uiGet(t, addr, "", "", nil); code != 200 {
		t.Errorf("GET /ui/ without the token = %d; want 200 (the page asks for it)", code)
	}
}

// TestUICluster: through any node, the pages show the whole cluster:
// every member with its figures, the top keys merged across the nodes that
// were asked (a key checked through all three counts all its checks), each
// key's owner and standby, membership changes, and a key's state from its
// owner.
func TestUICluster(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 3, func(c *Config) { c.Router.Replicas = 2 })
	for i, ts := range tc.nodes {
		ts.check(t, "shared", 100, 10*(i+1)) // 60 in all
		ts.check(t, fmt.Sprintf("only-%d", i), 100, 5)
	}
	tc.clk.Advance(90 * time.Second) // uptime, and the checks leave the top lists' window...
	for i, ts := range tc.nodes {
		ts.check(t, "shared", 100, 10*(i+1)) // ...so count them again in it
	}
	tc.clk.Advance(time.Second)
	owner, _ := tc.nodes[0].srv.Router().Owner("shared")
	standby := tc.nodes[0].srv.Router().Standby("shared")
	if standby == "" || standby == owner {
		t.Fatalf("standby of shared = %q (owner %s); want another node", standby, owner)
	}
	for i, ts := range tc.nodes {
		var o uiOverview
		if code, body := uiGet(t, ts.srv.HTTPAddr(), "api/overview?seconds=120", "", &o); code != 200 {
			t.Fatalf("node-%d: GET overview = %d %s", i, code, body)
		}
		var figures []string
		for _, m := range o.Members {
			figures = append(figures, fmt.Sprintf("%s %s %q %.0fs %.1f/s", m.Name, m.State, m.Error, m.UptimeMs/1000, m.DecisionsPerSec))
		}
		want := `[node-0 alive "" 91s 1.0/s node-1 alive "" 91s 2.0/s node-2 alive "" 91s 3.0/s]`
		if got := fmt.Sprint(figures); got != want {
			t.Errorf("node-%d: members %s; want %s", i, got, want)
		}
		if got, want := o.TopDecisions.String(), "shared=60±0@"+owner+" "; got != want || o.TopDecisions.Total != 60 {
			t.Errorf("node-%d: top decisions %s (total %d); want %s (total 60)", i, got, o.TopDecisions.Total, want)
		}
		var sum uint64
		for _, n := range o.Series.Decisions {
			sum += n
		}
		if sum != 135 {
			t.Errorf("node-%d: series decisions sum to %d; want all 135 checks of the cluster", i, sum)
		}
		if o.Node != fmt.Sprintf("node-%d", i) || len(o.Changes) == 0 || o.Changes[0].Epoch != o.Epoch {
			t.Errorf("node-%d: overview by %s, epoch %d, changes %+v; want its own, the newest change first at the view's epoch", i, o.Node, o.Epoch, o.Changes)
		}
		var k uiKey
		if code, body := uiGet(t, ts.srv.HTTPAddr(), "api/key?key=shared", "", &k); code != 200 {
			t.Fatalf("node-%d: GET key = %d %s", i, code, body)
		}
		if !k.Found || k.Used != 60 || k.Node != owner || k.Owner != owner || k.Standby != standby {
			t.Errorf("node-%d: key shared = %+v; want 60 used, answered by its owner %s, standby %s", i, k, owner, standby)
		}
	}

	// A member that does not answer is listed with the error; the others'
	// figures and counts are still there.
	tc.nodes[2].srv.StopServing()
	var o uiOverview
	if code, body := uiGet(t, tc.nodes[0].srv.HTTPAddr(), "api/overview", "", &o); code != 200 {
		t.Fatalf("GET overview with node-2 not serving = %d %s", code, body)
	}
	if len(o.Members) != 3 || o.Members[0].Error != "" || o.Members[1].Error != "" || o.Members[2].Error == "" {
		t.Errorf("members with node-2 not serving = %+v; want node-0 and node-1 with figures, node-2 with an error", o.Members)
	}
	if got, want := o.TopDecisions.String(), "shared=30±0@"+owner+" "; got != want {
		t.Errorf("top decisions with node-2 not serving = %s; want %s (node-0's 10 and node-1's 20)", got, want)
	}
}
