package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// cliEdge is a "sluice edge" running in-process, through run.
type cliEdge struct {
	t       testing.TB
	listen  string
	metrics string
	logs    *testkit.SyncBuffer
	cancel  context.CancelFunc
	done    chan int
	stopped bool
}

// startEdgeCLI runs "sluice edge" with addresses on port 0 and a ready
// file, then args, and returns once it serves. It stops at the end of the
// test, which fails unless it exits 0.
func startEdgeCLI(t testing.TB, args ...string) *cliEdge {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "edge-ready.json")
	e := &cliEdge{t: t, logs: &testkit.SyncBuffer{}, done: make(chan int, 1)}
	full := append([]string{"edge", "--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--ready-file", ready}, args...)
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.done <- run(ctx, full, io.Discard, e.logs, env{}.get) }()
	t.Cleanup(func() {
		e.stop()
		if t.Failed() {
			t.Logf("edge logs:\n%s", e.logs)
		}
	})
	var b []byte
	if err := testkit.Wait(10*time.Second, func() (err error) {
		if b, err = os.ReadFile(ready); err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("sluice %s: no ready file: %v\n%s", strings.Join(full, " "), err, e.logs)
		}
		select {
		case code := <-e.done:
			e.stopped = true
			t.Fatalf("sluice %s exited with %d before it was ready:\n%s", strings.Join(full, " "), code, e.logs)
		default:
		}
		return err
	}); err != nil {
		t.Fatalf("sluice %s: no ready file: %v\n%s", strings.Join(full, " "), err, e.logs)
	}
	var info edgeReady
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatalf("ready file: %v", err)
	}
	e.listen, e.metrics = info.Listen, info.MetricsAddr
	return e
}

// stop ends the edge as SIGTERM would and checks that it exits 0.
func (e *cliEdge) stop() {
	e.t.Helper()
	if e.stopped {
		return
	}
	e.stopped = true
	e.cancel()
	select {
	case code := <-e.done:
		if code != exitOK {
			e.t.Errorf("edge exited with code %d after a graceful stop; want 0\n%s", code, e.logs)
		}
	case <-time.After(20 * time.Second):
		e.t.Errorf("edge did not stop within 20s")
	}
}

// newTestOrigin is an HTTP server that counts what reaches it.
func newTestOrigin(t testing.TB) (string, *atomic.Int64) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "origin %s", r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &hits
}

// TestEdgeCommand: sluice edge with one rule from flags, in front of a
// real origin and a real node (sluice serve): the limit holds, the
// headers and the 429 are as documented, /metrics and /healthz answer,
// and a stop is graceful.
func TestEdgeCommand(t *testing.T) {
	n := startNode(t, env{})
	originURL, hits := newTestOrigin(t)
	e := startEdgeCLI(t, "--origin", originURL, "--sluice", n.grpcAddr, "--key", "header:X-API-Key", "--limit", "2", "--window", "1m",
		"--decision-timeout", "5s", "--name", "per_key")
	for i, want := range []int{200, 200, 429} {
		req, _ := http.NewRequest("GET", "http://"+e.listen+"/hello", nil)
		req.Header.Set("X-API-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || resp.Header.Get("RateLimit-Policy") != `"per_key";q=2;w=60` {
			t.Errorf("request %d: %d %v %q; want %d with RateLimit-Policy", i+1, resp.StatusCode, resp.Header, body, want)
		}
		if want == 200 && string(body) != "origin /hello" {
			t.Errorf("request %d: body %q; want the origin's", i+1, body)
		}
		if want == 429 && (resp.Header.Get("Retry-After") == "" || resp.Header.Get("Content-Type") != "application/problem+json") {
			t.Errorf("the 429 lacks Retry-After or the problem body: %v", resp.Header)
		}
	}
	if got := hits.Load(); got != 2 {
		t.Errorf("the origin got %d requests; want 2", got)
	}
	resp, err := http.Get("http://" + e.metrics + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("/healthz: %v %v; want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, err = http.Get("http://" + e.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`sluice_edge_requests_total{result="allowed",route="default"} 2`,
		`sluice_edge_requests_total{result="denied",route="default"} 1`,
		`sluice_edge_decision_duration_seconds_count{route="default"} 3`,
	} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	e.stop()
}

// TestEdgeFlagErrors: flags that cannot work are refused with a message
// that says what to change.
func TestEdgeFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--origin", "http://127.0.0.1:1"}, "no rules"},
		{[]string{"--origin", "http://127.0.0.1:1", "--key", "ip", "--limit", "5"}, "no rules"},
		{[]string{"--origin", "http://127.0.0.1:1", "--rules", "x.yaml", "--key", "ip"}, "--rules and --key"},
		{[]string{"--origin", "http://127.0.0.1:1", "--rules", "x.yaml", "--on-error", "closed"}, "--on-error goes with one rule"},
		{[]string{"--key", "ip", "--limit", "5", "--window", "1m"}, "no origin"},
		{[]string{"--origin", "ftp://x", "--key", "ip", "--limit", "5", "--window", "1m"}, `origin "ftp://x"`},
		{[]string{"--origin", "http://127.0.0.1:1", "--key", "cookie:x", "--limit", "5", "--window", "1m"}, `key "cookie:x"`},
		{[]string{"--origin", "http://127.0.0.1:1", "--key", "ip", "--limit", "5", "--window", "1m", "--trusted-proxies", "10.0.0.0/8,nope"}, `"nope" is neither`},
		{[]string{"--origin", "http://127.0.0.1:1", "--key", "ip", "--limit", "5", "--window", "1m", "--on-error", "maybe"}, "want open or closed"},
		{[]string{"--origin", "http://127.0.0.1:1", "--rules", filepath.Join(t.TempDir(), "missing.yaml")}, "no such file"},
	} {
		r := runCLI(t, env{}, append([]string{"edge", "--listen", "127.0.0.1:0", "--metrics-addr", ""}, tt.args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("sluice edge %s: %v\nwant exit 1 and %q", strings.Join(tt.args, " "), r, tt.want)
		}
	}
}
