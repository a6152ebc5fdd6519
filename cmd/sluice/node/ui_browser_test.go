package node

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-io/sluice/api/ui/chromium"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// screenshotDir is where TestUIPages writes its screenshots when
// SLUICE_UI_SCREENSHOTS=1 (docs/ui, from this package's directory).
const screenshotDir = "../../../docs/ui"

// demoToken is the admin token of the demo cluster.
const demoToken = "demo-admin-token"

// demoTraffic drives a three-node cluster for simulated seconds on the
// fake clock, one second at a time (the clock moves first): through every node, a hot tenant that
// spikes (and is denied), a tenant under an override, a Zipf tail of
// tenants, trial tenants under a prefix override, Envoy descriptors, and a
// few bad requests (errors).
func demoTraffic(t *testing.T, tc *testCluster, seconds int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	tail := rand.NewZipf(rng, 1.3, 1, 400)
	// Each call gets its own deadline: the demo's seconds are the fake
	// clock's, and on a loaded machine they take longer than one
	// deadline's worth of wall time.
	authed := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+demoToken)
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(authed, 30*time.Second) }
	check := func(key string, limit int64) *sluicepb.Check {
		return &sluicepb.Check{Key: []byte(key), Limit: limit, Window: durationpb.New(time.Minute)}
	}
	for s := range seconds {
		tc.clk.Advance(time.Second)
		wave := 1 + 0.6*math.Sin(2*math.Pi*float64(s)/90)
		for i, ts := range tc.nodes {
			var checks []*sluicepb.Check
			hot := int(math.Round(4 * wave))
			if s >= seconds-20 {
				hot += 12 // a spike on the hot tenant
			}
			for range hot {
				checks = append(checks, check("tenant:acme", 600))
			}
			for range 3 {
				checks = append(checks, check("tenant:globex", 100)) // the override raises it to 500
			}
			for range int(math.Round(8 * wave)) {
				checks = append(checks, check(fmt.Sprintf("tenant:%d", tail.Uint64()+1000), 30))
			}
			if s%3 == i {
				checks = append(checks, check(fmt.Sprintf("tenant:trial:%d", rng.IntN(5)), 1000)) // the override lowers it to 10
			}
			// A call refused as UNAVAILABLE (a lease or a standby late on
			// a loaded machine) is sent again, here and below.
			if err := testkit.Wait(2*time.Second, func() error {
				ctx, cancel := call()
				defer cancel()
				_, err := sluicepb.NewRateLimitServiceClient(ts.conn).Check(ctx, &sluicepb.CheckRequest{Checks: checks})
				if err != nil && status.Code(err) != codes.Unavailable {
					t.Fatalf("second %d: Check through node-%d: %v", s, i, err)
				}
				return err
			}); err != nil {
				t.Fatalf("second %d: Check through node-%d: %v", s, i, err)
			}
			d := &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: fmt.Sprintf("10.0.0.%d", 1+rng.IntN(4))}},
				Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 40, Unit: typev3.RateLimitUnit_MINUTE},
			}
			if err := testkit.Wait(2*time.Second, func() error {
				ctx, cancel := call()
				defer cancel()
				_, err := rlsv3.NewRateLimitServiceClient(ts.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
				if err != nil && status.Code(err) != codes.Unavailable {
					t.Fatalf("second %d: ShouldRateLimit through node-%d: %v", s, i, err)
				}
				return err
			}); err != nil {
				t.Fatalf("second %d: ShouldRateLimit through node-%d: %v", s, i, err)
			}
			if s >= seconds-20 && s < seconds-14 && i == 2 { // a client sending bad requests
				ctx, cancel := call()
				sluicepb.NewRateLimitServiceClient(ts.conn).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{check("tenant:acme", -1)}})
				cancel()
			}
		}
	}
	// A quota lease held by a web server, open at the end.
	lease := check("tenant:leased", 100)
	lease.Cost, lease.ReserveFor, lease.Lease, lease.Holder = proto.Int64(30), durationpb.New(30*time.Second), true, "web-7"
	ctx, cancel := call()
	defer cancel()
	if _, err := sluicepb.NewRateLimitServiceClient(tc.nodes[0].conn).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{lease}}); err != nil {
		t.Fatalf("a lease on tenant:leased: %v", err)
	}
}

// TestUIPages renders the pages of a three-node demo cluster in headless
// Chromium through one node and checks the rendered DOM against what the
// cluster holds: the admin token is asked for and kept out of the URL and
// the page; the members table lists every node with its figures; the rates
// chart draws the series; the top lists show the merged counts with their
// owners; a key's page shows its state, owner, standby and override and
// draws one bar per run of its sliding log; the Envoy lookup finds a
// descriptor's key; the overrides page lists the overrides with their
// notes. With SLUICE_UI_SCREENSHOTS=1 it writes a screenshot of each page
// to docs/ui. Without Chromium it skips, or fails with CI set (.ci/run
// installs it).
func TestUIPages(t *testing.T) {
	t.Parallel()
	path := chromium.Find()
	if path == "" {
		const msg = "no Chromium: install Debian's chromium (or set SLUICE_CHROMIUM) to render the pages"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.Router.Replicas = 2
		c.AdminToken = demoToken
	})
	admin := tc.nodes[0].admin()
	actx := metadata.AppendToOutgoingContext(tc.nodes[0].ctx(), "authorization", "Bearer "+demoToken)
	for _, o := range []*sluicepb.Override{
		{Key: []byte("tenant:globex"), Limit: 500, Note: "INC-4711: raised for the launch", ExpiresAt: timestamppb.New(epoch.Add(6 * time.Hour))},
		{Key: []byte("tenant:trial:"), Prefix: true, Limit: 10, Note: "trials: 10 a minute"},
	} {
		if _, err := admin.SetOverride(actx, &sluicepb.SetOverrideRequest{Override: o}); err != nil {
			t.Fatal(err)
		}
	}
	demoTraffic(t, tc, 200)
	tc.clk.Advance(100 * time.Millisecond)

	b, err := chromium.Start(path, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Errorf("close Chromium: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	page, err := b.NewPage(ctx, 1280, 900)
	if err != nil {
		t.Fatal(err)
	}
	eval := func(t *testing.T, expr string, out any) {
		t.Helper()
		if err := page.Eval(ctx, expr, out); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(t *testing.T, expr string) {
		t.Helper()
		if err := page.WaitFor(ctx, expr); err != nil {
			t.Fatal(err)
		}
	}
	open := func(t *testing.T, path string) {
		t.Helper()
		if err := page.Navigate(ctx, "http://"+tc.nodes[1].srv.HTTPAddr()+"/ui/"+path); err != nil {
			t.Fatal(err)
		}
		waitFor(t, `document.body.dataset.ready === "1" || !document.getElementById("token-form").hidden`)
	}
	screenshot := func(t *testing.T, name string) {
		t.Helper()
		if os.Getenv("SLUICE_UI_SCREENSHOTS") != "1" {
			return
		}
		png, err := page.Screenshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(screenshotDir, name+".png")
		if err := os.WriteFile(file, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", file)
	}
	// rows returns the text of each cell of each row of a table's body.
	rows := func(t *testing.T, table string) [][]string {
		t.Helper()
		var out [][]string
		eval(t, `[...document.querySelectorAll("`+table+` tbody tr")].map((tr) => [...tr.cells].map((td) => td.textContent))`, &out)
		return out
	}
	var want uiOverview
	if code, body := uiGet(t, tc.nodes[1].srv.HTTPAddr(), "api/overview", demoToken, &want); code != 200 {
		t.Fatalf("GET overview = %d %s", code, body)
	}

	t.Run("token", func(t *testing.T) {
		open(t, "")
		var asked bool
		eval(t, `!document.getElementById("token-form").hidden && document.querySelectorAll("#members tbody tr").length === 0`, &asked)
		if !asked {
			t.Fatal("the cluster page without a token: no token form, or data shown; want the form and no data")
		}
		eval(t, `document.getElementById("token-input").value = `+fmt.Sprintf("%q", demoToken)+`; document.getElementById("token-form").requestSubmit()`, nil)
		waitFor(t, `document.body.dataset.ready === "1"`)
		var leaks struct {
			URL, DOM bool
			Stored   string
		}
		eval(t, `({URL: location.href.includes(`+fmt.Sprintf("%q", demoToken)+`), DOM: document.documentElement.outerHTML.includes(`+fmt.Sprintf("%q", demoToken)+`), Stored: sessionStorage.getItem("sluice-admin-token")})`, &leaks)
		if leaks.URL || leaks.DOM || leaks.Stored != demoToken {
			t.Errorf("after entering the token: in the URL %v, in the DOM %v, in sessionStorage %q; want only in sessionStorage", leaks.URL, leaks.DOM, leaks.Stored)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		open(t, "")
		members := rows(t, "#members")
		if len(members) != 3 {
			t.Fatalf("members table rows = %q; want 3", members)
		}
		for i, m := range members {
			name, state, uptime := m[0], m[1], m[4]
			if name != fmt.Sprintf("node-%d", i) || state != "alive" || uptime != "3 m 20 s" || m[5] == "0.0" {
				t.Errorf("members row %d = %q; want node-%d, alive, up 3 m 20 s, decisions/s above 0", i, m, i)
			}
		}
		for _, list := range []struct {
			table string
			want  uiTop
		}{{"#top-decisions", want.TopDecisions}, {"#top-denials", want.TopDenials}} {
			got := rows(t, list.table)
			if len(got) != len(list.want.Keys) || len(got) == 0 {
				t.Fatalf("%s: %d rows; want %d", list.table, len(got), len(list.want.Keys))
			}
			for i, k := range list.want.Keys {
				if r := got[i]; r[0] != k.Key || r[1] != commas(k.Count) || r[4] != k.Owner {
					t.Errorf("%s row %d = %q; want %s, %d, owner %s", list.table, i, r, k.Key, k.Count, k.Owner)
				}
			}
		}
		if got := rows(t, "#top-denials")[0][0]; got != "tenant:acme" {
			t.Errorf("the key denied most = %s; want tenant:acme, the hot tenant", got)
		}
		var chart struct{ Lines, Points int }
		eval(t, `({Lines: document.querySelectorAll("#rates polyline").length, Points: document.querySelector("#rates polyline.decisions").points.length})`, &chart)
		if chart.Lines != 3 || chart.Points != 300 {
			t.Errorf("rates chart: %d lines of %d points; want 3 lines (decisions, denials, errors) of 300 seconds", chart.Lines, chart.Points)
		}
		if changes := rows(t, "#changes"); len(changes) < 3 {
			t.Errorf("membership changes = %q; want at least the three joins", changes)
		}
		var summary string
		eval(t, `document.getElementById("summary").textContent`, &summary)
		if !strings.Contains(summary, "Answered by node-1") || !strings.Contains(summary, "3 live of 3 members") {
			t.Errorf("summary = %q; want node-1 answering, 3 live of 3 members", summary)
		}
		screenshot(t, "cluster")
	})

	t.Run("key", func(t *testing.T) {
		var k uiKey
		if code, body := uiGet(t, tc.nodes[1].srv.HTTPAddr(), "api/key?key=tenant:acme", demoToken, &k); code != 200 {
			t.Fatalf("GET key = %d %s", code, body)
		}
		open(t, "key.html?key="+url.QueryEscape("tenant:acme"))
		var got struct {
			Name    string
			Figures map[string]string
			Bars    int
			Log     bool
		}
		eval(t, `({Name: document.getElementById("key-name").textContent,
			Figures: Object.fromEntries([...document.querySelectorAll("#key-figures div")].map((d) => [d.querySelector("dt").textContent, d.querySelector("dd").textContent])),
			Bars: document.querySelectorAll("#timeline rect.hit").length,
			Log: !document.getElementById("key-log").hidden})`, &got)
		f := got.Figures
		if got.Name != "tenant:acme" || f["algorithm"] != "sliding log" || f["limit"] != "600 per 1 m" ||
			f["used"] != fmt.Sprint(k.Used) || f["owner"] != k.Owner || f["standby"] != k.Standby || k.Standby == "" {
			t.Errorf("key page figures = %v; want tenant:acme, a sliding log of 600 per 1 m, %d used, owner %s, standby %s", f, k.Used, k.Owner, k.Standby)
		}
		if !got.Log || got.Bars != len(k.Runs) || got.Bars < 50 {
			t.Errorf("timeline: shown %v, %d bars; want one bar per run of the log, %d", got.Log, got.Bars, len(k.Runs))
		}
		// The Envoy lookup, on the same page.
		eval(t, `document.getElementById("envoy-domain").value = "edge";
			document.getElementById("envoy-entries").value = "remote_address=10.0.0.3";
			document.getElementById("envoy-form").requestSubmit()`, nil)
		waitFor(t, `document.getElementById("envoy-result").dataset.key`)
		var envoyKey string
		eval(t, `document.querySelector("#envoy-result a").textContent`, &envoyKey)
		if envoyKey != "edge|remote_address=10.0.0.3" {
			t.Errorf("Envoy lookup of edge remote_address=10.0.0.3 = %q; want edge|remote_address=10.0.0.3", envoyKey)
		}
		screenshot(t, "key")

		open(t, "key.html?key="+url.QueryEscape("tenant:leased"))
		var holders [][]string
		eval(t, `document.getElementById("key-holders").hidden ? [] :
			[...document.querySelectorAll("#key-holders-rows tr")].map((r) => [...r.cells].map((c) => c.textContent))`, &holders)
		if len(holders) != 1 || holders[0][0] != "web-7" || holders[0][2] != "1" || holders[0][3] != "30" {
			t.Errorf("tenant:leased holders table = %q; want web-7 holding one lease of 30 hits", holders)
		}

		open(t, "key.html?key="+url.QueryEscape("tenant:globex"))
		var override string
		eval(t, `document.getElementById("key-override").hidden ? "" : document.getElementById("key-override").textContent`, &override)
		if !strings.Contains(override, "limit 500") || !strings.Contains(override, "INC-4711") {
			t.Errorf("tenant:globex override box = %q; want limit 500 and its note", override)
		}
	})

	t.Run("overrides", func(t *testing.T) {
		open(t, "overrides.html")
		got := rows(t, "#overrides")
		if len(got) != 2 || got[0][0] != "tenant:globex" || got[0][2] != "500" || !strings.Contains(got[0][6], "INC-4711") ||
			got[1][0] != "tenant:trial:" || got[1][1] != "prefix" || got[1][2] != "10" {
			t.Errorf("overrides table = %q; want tenant:globex (500, INC-4711), then the prefix tenant:trial: (10)", got)
		}
		screenshot(t, "overrides")
	})

	t.Run("forget token", func(t *testing.T) {
		open(t, "")
		eval(t, `window.sluiceOldDocument = true; document.getElementById("token-forget").click()`, nil)
		waitFor(t, `!window.sluiceOldDocument && !document.getElementById("token-form").hidden`)
	})
}

// commas writes n with a comma every three digits, as the pages do.
func commas(n uint64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
