package httplimit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/client/httplimit"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestMain starts the examples' node, runs the tests and checks that no
// goroutine outlives them.
func TestMain(m *testing.M) {
	stop, err := startExampleNode()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	if code == 0 {
		if err := testkit.Wait(10*time.Second, func() error { return goleak.Find() }); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newClient returns a client of addr with a generous deadline (the race
// detector on a shared machine); edit may change its config.
func newClient(t testing.TB, addr string, edit func(*client.Config)) *client.Client {
	t.Helper()
	cfg := client.DefaultConfig()
	cfg.Addr = addr
	cfg.Timeout = 5 * time.Second
	if edit != nil {
		edit(&cfg)
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echo answers 200 with the request body, so that tests see what the
// handler received.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	io.Copy(w, r.Body)
})

// serve starts an HTTP server on 127.0.0.1 with the limiter of cfg in
// front of echo, and returns its URL.
func serve(t testing.TB, cfg httplimit.Config) string {
	t.Helper()
	l, err := httplimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(l.Wrap(echo))
	t.Cleanup(srv.Close)
	return srv.URL
}

// response is what a request got.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request through a real HTTP client.
func do(t testing.TB, method, url string, header map[string]string, body string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestCountsAndHeaders: a rule lets exactly its limit through; every
// answer carries RateLimit-Policy and RateLimit; the denial is a 429 with
// Retry-After = retry_after + headroom + jitter, no-store, and a problem
// body that gives the wait and nothing about the rule.
func TestCountsAndHeaders(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	url := serve(t, httplimit.Config{
		Client: newClient(t, n.Addr, nil),
		Rules:  []httplimit.Rule{{Name: "per_ip", Key: httplimit.ClientIP(), Limit: 3, Window: time.Minute}},
	})
	for i := range 3 {
		r := do(t, "GET", url, nil, "")
		if r.status != 200 {
			t.Fatalf("request %d: status %d; want 200", i+1, r.status)
		}
		if got, want := r.header.Get("RateLimit-Policy"), `"per_ip";q=3;w=60`; got != want {
			t.Errorf("request %d: RateLimit-Policy %q; want %q", i+1, got, want)
		}
		if got, want := r.header.Get("RateLimit"), fmt.Sprintf(`"per_ip";r=%d;t=60`, 2-i); got != want {
			t.Errorf("request %d: RateLimit %q; want %q", i+1, got, want)
		}
		if r.header.Get("Retry-After") != "" {
			t.Errorf("request %d: an allowed answer has Retry-After %q", i+1, r.header.Get("Retry-After"))
		}
	}
	for i := range 2 { // from Sluice, then from the client's cache
		r := do(t, "GET", url, nil, "")
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("request %d: status %d; want 429", 4+i, r.status)
		}
		m := regexp.MustCompile(`^"per_ip";r=0;t=(\d+)$`).FindStringSubmatch(r.header.Get("RateLimit"))
		if m == nil {
			t.Fatalf("denied: RateLimit %q; want r=0 and t", r.header.Get("RateLimit"))
		}
		tSecs, _ := strconv.Atoi(m[1])
		retry, err := strconv.Atoi(r.header.Get("Retry-After"))
		// retry_after rounded up (t), + 2 s headroom, + 0 to 3 s jitter.
		if err != nil || retry < tSecs+2 || retry > tSecs+5 || tSecs < 59 || tSecs > 60 {
			t.Errorf("denied: Retry-After %q with t=%d; want t (59 or 60) + 2 to t + 5", r.header.Get("Retry-After"), tSecs)
		}
		if got := r.header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("denied: Cache-Control %q; want no-store", got)
		}
		if got := r.header.Get("Content-Type"); got != "application/problem+json" {
			t.Errorf("denied: Content-Type %q; want application/problem+json", got)
		}
		var p struct {
			Type, Title, Detail string
			Status              int
		}
		if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Status != 429 || p.Title != "Too Many Requests" ||
			!strings.Contains(p.Detail, "Retry after "+r.header.Get("Retry-After")+" seconds") {
			t.Errorf("denied: body %q (%v); want problem details with status 429 and the retry", r.body, err)
		}
		// Nothing else: not the rule, its limit or window, nor the key.
		want := `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Too many requests. Retry after ` +
			r.header.Get("Retry-After") + ` seconds."}` + "\n"
		if r.body != want {
			t.Errorf("denied: body %q; want exactly %q", r.body, want)
		}
	}
}

// TestRetryAfterJitter: Retry-After is retry_after rounded up plus the
// headroom plus 0 to the jitter, in whole seconds; every value of that
// range comes up, and none outside it.
func TestRetryAfterJitter(t *testing.T) {
	for _, tt := range []struct {
		headroom, jitter time.Duration
		lo, hi           int
	}{
		{0, 0, 8, 8},                           // defaults: 2 s and 3 s
		{-1, -1, 6, 6},                         // none
		{5 * time.Second, time.Second, 11, 12}, // configured
		{time.Second, 10 * time.Second, 7, 17}, // a wide jitter
		{1500 * time.Millisecond, -1, 8, 8},    // headroom rounded up
	} {
		if tt.headroom == 0 && tt.jitter == 0 {
			tt.lo, tt.hi = 8, 11
		}
		seen := map[int]int{}
		c := &fixedDenial{retry: 5500 * time.Millisecond} // rounds up to 6
		l, err := httplimit.New(httplimit.Config{
			Client:             c,
			Rules:              []httplimit.Rule{{Name: "r", Key: httplimit.Const("x"), Limit: 1, Window: time.Minute}},
			RetryAfterHeadroom: tt.headroom,
			RetryAfterJitter:   tt.jitter,
		})
		if err != nil {
			t.Fatal(err)
		}
		for range 2000 {
			w := httptest.NewRecorder()
			l.Serve(w, httptest.NewRequest("GET", "/", nil))
			v, err := strconv.Atoi(w.Header().Get("Retry-After"))
			if err != nil || v < tt.lo || v > tt.hi {
				t.Fatalf("headroom %v, jitter %v: Retry-After %q; want %d to %d", tt.headroom, tt.jitter, w.Header().Get("Retry-After"), tt.lo, tt.hi)
			}
			seen[v]++
		}
		for v := tt.lo; v <= tt.hi; v++ {
			if seen[v] == 0 {
				t.Errorf("headroom %v, jitter %v: Retry-After %d never came up in 2000 denials (%v)", tt.headroom, tt.jitter, v, seen)
			}
		}
	}
}

// fixedDenial is a Checker that denies everything with one retry_after.
type fixedDenial struct{ retry time.Duration }

func (f *fixedDenial) Check(_ context.Context, ch client.Check, _ ...client.Option) (client.Decision, error) {
	return client.Decision{Limit: ch.Limit, RetryAfter: f.retry, ResetAfter: f.retry, Source: client.SourceOwner}, nil
}

func (f *fixedDenial) CheckAll(ctx context.Context, checks []client.Check, _ ...client.Option) ([]client.Decision, error) {
	out := make([]client.Decision, len(checks))
	for i := range checks {
		out[i], _ = f.Check(ctx, checks[i])
	}
	return out, nil
}

// TestKeysApart: each value of a key has its own counter, and two rules
// on the same key never share one.
func TestKeysApart(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	url := serve(t, httplimit.Config{
		Client: newClient(t, n.Addr, nil),
		Rules: []httplimit.Rule{
			{Name: "per_key", Key: httplimit.Header("X-API-Key"), Limit: 2, Window: time.Minute},
			{Name: "per_key_method", Key: httplimit.Join(httplimit.Header("X-API-Key"), httplimit.Method()), Limit: 100, Window: time.Minute},
		},
	})
	for _, key := range []string{"alpha", "beta"} {
		for i, want := range []int{200, 200, 429} {
			if r := do(t, "GET", url, map[string]string{"X-API-Key": key}, ""); r.status != want {
				t.Errorf("key %s, request %d: status %d; want %d", key, i+1, r.status, want)
			}
		}
		r := do(t, "POST", url, map[string]string{"X-API-Key": key + "-2"}, "")
		if got, want := r.header.Get("RateLimit"), `"per_key";r=1;t=60, "per_key_method";r=99;t=60`; r.status != 200 || got != want {
			t.Errorf("a new key: %d, RateLimit %q; want 200, %q", r.status, got, want)
		}
	}
	// A request without the header is not counted by either rule.
	for range 3 {
		if r := do(t, "GET", url, nil, ""); r.status != 200 || r.header.Get("RateLimit-Policy") != "" {
			t.Errorf("no API key: %d, %v; want 200 without rate-limit headers", r.status, r.header)
		}
	}
}

// TestLoginRule: a login form limited per client IP and per submitted
// username, in one all-or-nothing call. A username over its limit is
// refused from any address without spending the address's allowance;
// the address's limit holds across usernames; the handler still gets the
// whole body, form or JSON.
func TestLoginRule(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	url := serve(t, httplimit.Config{
		Client:         newClient(t, n.Addr, nil),
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Rules: []httplimit.Rule{
			{Name: "login_ip", Key: httplimit.ClientIP(), Limit: 4, Window: time.Minute, OnFailure: client.FailClosed},
			{Name: "login_user", Key: httplimit.Form("username"), Limit: 2, Window: time.Minute, OnFailure: client.FailClosed},
		},
	})
	form := func(ip, user string) response {
		t.Helper()
		body := "username=" + url_(user) + "&password=hunter2"
		r := do(t, "POST", url, map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-For": ip}, body)
		if r.status == 200 && r.body != body {
			t.Errorf("the handler got body %q; want %q", r.body, body)
		}
		return r
	}
	for i, tt := range []struct {
		ip, user string
		want     int
	}{
		{"198.51.100.1", "alice", 200},
		{"198.51.100.2", "Alice ", 200}, // one user, whatever the case
		{"198.51.100.3", "alice", 429},  // alice is over, from any address
		{"198.51.100.3", "bob", 200},    // .3's denied attempt spent nothing
		{"198.51.100.3", "carol", 200},
		{"198.51.100.3", "dave", 200},
		{"198.51.100.3", "erin", 200},
		{"198.51.100.3", "frank", 429}, // .3 is over its 4
		{"198.51.100.4", "frank", 200}, // frank's denied attempt spent nothing
	} {
		r := form(tt.ip, tt.user)
		if r.status != tt.want {
			t.Errorf("login %d (%s as %q): status %d; want %d (RateLimit %q)", i+1, tt.ip, tt.user, r.status, tt.want, r.header.Get("RateLimit"))
		}
	}
	// JSON bodies count under the same username.
	body := `{"username":"ALICE","password":"x"}`
	r := do(t, "POST", url, map[string]string{"Content-Type": "application/json", "X-Forwarded-For": "198.51.100.9"}, body)
	if r.status != 429 {
		t.Errorf("JSON login as ALICE: status %d; want 429", r.status)
	}
	body = `{"username":"grace","password":"x"}`
	if r := do(t, "POST", url, map[string]string{"Content-Type": "application/json", "X-Forwarded-For": "198.51.100.9"}, body); r.status != 200 || r.body != body {
		t.Errorf("JSON login as grace: %d %q; want 200 and the body echoed", r.status, r.body)
	}
}

func url_(s string) string { return url.QueryEscape(s) }

// TestForwardedTrust: X-Forwarded-For sets the client identity only when
// the peer is a trusted proxy; otherwise every request is counted under
// the peer, whatever it claims.
func TestForwardedTrust(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	rule := []httplimit.Rule{{Name: "per_ip", Key: httplimit.ClientIP(), Limit: 2, Window: time.Minute}}
	untrusted := serve(t, httplimit.Config{Client: c, Rules: rule, KeyPrefix: "untrusted|"})
	trusted := serve(t, httplimit.Config{Client: c, Rules: rule, KeyPrefix: "trusted|", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	statuses := func(url string) []int {
		var got []int
		for i := range 4 {
			r := do(t, "GET", url, map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d", i)}, "")
			got = append(got, r.status)
		}
		return got
	}
	if got, want := fmt.Sprint(statuses(untrusted)), "[200 200 429 429]"; got != want {
		t.Errorf("untrusted peer, four claimed addresses: %s; want %s (all counted as 127.0.0.1)", got, want)
	}
	if got, want := fmt.Sprint(statuses(trusted)), "[200 200 200 200]"; got != want {
		t.Errorf("trusted peer, four addresses: %s; want %s (each its own)", got, want)
	}
}

// TestShadowRule: a shadow rule counts and logs its would-be denials but
// never denies, shows no header and does not stop the enforced rule from
// counting.
func TestShadowRule(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	var logs testkit.SyncBuffer
	var mu sync.Mutex
	var shadowDenied int
	url := serve(t, httplimit.Config{
		Client: newClient(t, n.Addr, nil),
		Rules: []httplimit.Rule{
			{Name: "enforced", Key: httplimit.ClientIP(), Limit: 5, Window: time.Minute},
			{Name: "strict", Key: httplimit.ClientIP(), Limit: 1, Window: time.Minute, Shadow: true},
		},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Observe: func(_ *http.Request, res *httplimit.Result) {
			for _, rr := range res.Rules {
				if rr.Rule.Shadow && !rr.Decision.Allowed {
					mu.Lock()
					shadowDenied++
					mu.Unlock()
				}
			}
		},
	})
	for i := range 6 {
		r := do(t, "GET", url, nil, "")
		want := 200
		if i == 5 {
			want = 429
		}
		if r.status != want {
			t.Errorf("request %d: status %d; want %d", i+1, r.status, want)
		}
		if strings.Contains(r.header.Get("RateLimit-Policy")+r.header.Get("RateLimit"), "strict") {
			t.Errorf("request %d: headers show the shadow rule: %v", i+1, r.header)
		}
		if got := fmt.Sprintf(`"enforced";r=%d;t=60`, max(4-i, 0)); r.header.Get("RateLimit") != got {
			t.Errorf("request %d: RateLimit %q; want %q", i+1, r.header.Get("RateLimit"), got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if shadowDenied != 5 {
		t.Errorf("the shadow rule would have denied %d requests; want 5", shadowDenied)
	}
	if !strings.Contains(logs.String(), "shadow rule would deny") || !strings.Contains(logs.String(), "rule=strict") {
		t.Errorf("logs: %q; want a would-be denial of rule strict", logs.String())
	}
}

// TestFailurePolicyPerRule: with Sluice unreachable, a request passes
// when its rules fail open and is refused (429, RateLimit-Policy but no
// RateLimit) when one fails closed.
func TestFailurePolicyPerRule(t *testing.T) {
	c := newClient(t, "127.0.0.1:1", func(c *client.Config) { c.Timeout = 200 * time.Millisecond })
	var logs testkit.SyncBuffer
	l, err := httplimit.New(httplimit.Config{
		Client: c,
		Rules: []httplimit.Rule{
			{Name: "open", Key: httplimit.ClientIP(), Limit: 5, Window: time.Minute},
			{Name: "closed", Key: httplimit.Form("username"), Limit: 5, Window: time.Minute, OnFailure: client.FailClosed},
		},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(l.Wrap(echo))
	defer srv.Close()
	if r := do(t, "GET", srv.URL, nil, ""); r.status != 200 || r.header.Get("RateLimit-Policy") != `"open";q=5;w=60` || r.header.Get("RateLimit") != "" {
		t.Errorf("fail-open rule only: %d %v; want 200 with RateLimit-Policy and no RateLimit", r.status, r.header)
	}
	r := do(t, "POST", srv.URL, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, "username=a")
	if r.status != 429 || r.header.Get("RateLimit") != "" || r.header.Get("Retry-After") == "" {
		t.Errorf("with a fail-closed rule: %d %v; want 429 with Retry-After and no RateLimit", r.status, r.header)
	}
	if !strings.Contains(logs.String(), "failure=unreachable") {
		t.Errorf("logs %q; want the failure", logs.String())
	}
}

// TestConfigErrors: New reports every bad rule at once.
func TestConfigErrors(t *testing.T) {
	_, err := httplimit.New(httplimit.Config{Rules: []httplimit.Rule{
		{Name: "a b", Limit: 0, Window: 0},
		{Name: "ok", Key: httplimit.ClientIP(), Limit: 1, Window: time.Second},
		{Name: "ok", Key: httplimit.ClientIP(), Limit: 1, Window: time.Second, Cost: 2},
	}})
	if err == nil {
		t.Fatal("New accepted bad rules")
	}
	for _, want := range []string{"Client is nil", `name "a b"`, "no key", "limit 0", "window 0s", `name "ok" is used twice`, "cost 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v; want it to say %q", err, want)
		}
	}
}
