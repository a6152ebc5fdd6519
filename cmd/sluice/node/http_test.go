package node

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestHealthReadyMetrics: grpc health and /readyz report serving, /metrics
// counts decisions, and both flip to not serving on shutdown.
func TestHealthReadyMetrics(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, nil)
	base := "http://" + ts.srv.HTTPAddr()
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d; want 200", code)
	}
	if code, _ := httpGet(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d; want 200", code)
	}
	hc := healthpb.NewHealthClient(ts.conn)
	if resp, err := hc.Check(ts.ctx(), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Check = %v, %v; want SERVING", resp, err)
	}
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	for i := 0; i < 3; i++ {
		if _, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("m", 2, time.Minute, 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	_, body := httpGet(t, base+"/metrics")
	for _, want := range []string{
		`sluice_decisions_total{api="native",result="allowed"} 2`,
		`sluice_decisions_total{api="native",result="denied"} 1`,
		`sluice_keys_in_memory 1`,
		`sluice_storage_commit_records_count`,
		`sluice_request_duration_seconds_count{api="native"} 3`,
		`sluice_data_file_bytes `,
		`sluice_data_file_compactions_total 0`,
		`sluice_storage_checkpoint_records_count 0`,
		`sluice_storage_checkpoint_failures_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The WAL holds its header and the frames of the decisions.
	if m := regexp.MustCompile(`(?m)^sluice_wal_bytes (\S+)$`).FindStringSubmatch(body); m == nil {
		t.Errorf("/metrics lacks sluice_wal_bytes")
	} else if v, _ := strconv.ParseFloat(m[1], 64); v <= 16 {
		t.Errorf("sluice_wal_bytes = %s after 3 decisions; want more than a WAL file's header", m[1])
	}
	// A message over the maximum size is refused, and the node keeps serving.
	huge := &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(strings.Repeat("k", 5<<20), 2, time.Minute, 1)}}
	if _, err := client.Check(ts.ctx(), huge); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Check(5 MiB message) = %v; want ResourceExhausted", err)
	}
	srv, conn := ts.srv, ts.conn
	ts.srv = nil
	srv.Shutdown(ts.ctx())
	conn.Close()
	if _, err := http.Get(base + "/readyz"); err == nil {
		t.Fatal("/readyz still answers after shutdown")
	}
}

// TestLastStopMetric: sluice_store_last_stop says how the last process on
// the data file stopped: fresh on a new data dir, clean after a graceful
// stop.
func TestLastStopMetric(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, nil)
	check := func(want string) {
		t.Helper()
		_, body := httpGet(t, "http://"+ts.srv.HTTPAddr()+"/metrics")
		got := regexp.MustCompile(`(?m)^sluice_store_last_stop\{.*$`).FindAllString(body, -1)
		if line := `sluice_store_last_stop{how="` + want + `"} 1`; len(got) != 1 || got[0] != line {
			t.Errorf("/metrics has %q; want only %q", got, line)
		}
	}
	check("fresh")
	ts.stop()
	ts.start()
	check("clean")
}

// TestCheckpointMetrics: once more keys than a checkpoint holds have been
// committed, a checkpoint writes them into the data file and the
// sluice_storage_checkpoint_* metrics count it.
func TestCheckpointMetrics(t *testing.T) {
	t.Parallel()
	// The least --max-keys: the smallest checkpoint (4096 keys).
	ts := newTestServer(t, func(c *Config) { c.Engine.MaxKeys = 1000 })
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	keys := checkpointKeys(ts.cfg.Engine.MaxKeys) + 10
	const perCall = 500
	for k := 0; k < keys; k += perCall {
		req := &sluicepb.CheckRequest{}
		for i := k; i < min(k+perCall, keys); i++ {
			req.Checks = append(req.Checks, nativeCheck(fmt.Sprintf("ckpt-%d", i), 5, time.Hour, 1))
		}
		if _, err := client.Check(ts.ctx(), req); err != nil {
			t.Fatal(err)
		}
	}
	re := regexp.MustCompile(`(?m)^sluice_storage_checkpoint_records_(count|sum) (\S+)$`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := httpGet(t, "http://"+ts.srv.HTTPAddr()+"/metrics")
		got := map[string]float64{}
		for _, m := range re.FindAllStringSubmatch(body, -1) {
			got[m[1]], _ = strconv.ParseFloat(m[2], 64)
		}
		if got["count"] >= 1 {
			if got["sum"] < float64(checkpointKeys(ts.cfg.Engine.MaxKeys)) {
				t.Errorf("checkpoints wrote %v keys in all; want at least %d", got["sum"], checkpointKeys(ts.cfg.Engine.MaxKeys))
			}
			for _, want := range []string{`sluice_storage_checkpoint_failures_total 0`, `sluice_storage_checkpoint_duration_seconds_count`} {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint counted 30 s after %d keys were written: %v", keys, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPprof: profiles are served only when asked for.
func TestPprof(t *testing.T) {
	t.Parallel()
	off := newTestServer(t, nil)
	if code, _ := httpGet(t, "http://"+off.srv.HTTPAddr()+"/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/ without Pprof = %d; want 404", code)
	}
	on := newTestServer(t, func(c *Config) { c.Pprof = true })
	if code, body := httpGet(t, "http://"+on.srv.HTTPAddr()+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/ with Pprof = %d; want 200 with the profile index", code)
	}
}

// TestMetricsOfAFreshNode: before anything happened, /metrics already
// carries every labelled series with a known label set, at zero (so that
// increase() sees the first event), the Go and process collectors, the
// build info, and sluice_members 1 for a node alone; a scraper that asks for
// OpenMetrics gets it.
func TestMetricsOfAFreshNode(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, nil)
	url := "http://" + ts.srv.HTTPAddr() + "/metrics"
	_, body := httpGet(t, url)
	want := []string{
		`sluice_members 1`,
		`sluice_build_info{go_version="` + runtime.Version() + `",revision="`,
		`go_goroutines `,
		`go_memstats_heap_alloc_bytes `,
		`sluice_request_duration_seconds_count{api="envoy"} 0`,
	}
	for _, api := range []string{"native", "envoy"} {
		for _, result := range []string{"allowed", "denied", "shadow_denied", "error"} {
			want = append(want, fmt.Sprintf(`sluice_decisions_total{api=%q,result=%q} 0`, api, result))
		}
	}
	for name, values := range map[string][]string{
		"sluice_limits_reloads_total{result":     {"ok", "error"},
		"sluice_forwarded_checks_total{result":   {"ok", "error"},
		"sluice_handoff_keys_total{direction":    {"sent", "received", "failed"},
		"sluice_refused_checks_total{reason":     {"no_quorum", "moving", "owner_down", "standby"},
		"sluice_unserved_seconds_total{reason":   {"no_quorum", "waiting"},
		"sluice_lease_renewals_total{result":     {"granted", "refused"},
		"sluice_replicated_records_total{result": {"ok", "error"},
		"sluice_membership_changes_total{kind":   {"joined", "updated", "left", "failed"},
	} {
		for _, v := range values {
			want = append(want, fmt.Sprintf(`%s=%q} 0`, name, v))
		}
	}
	if runtime.GOOS == "linux" {
		want = append(want, `process_open_fds `, `process_resident_memory_bytes `)
	}
	for _, w := range want {
		if !strings.Contains(body, "\n"+w) {
			t.Errorf("/metrics of a fresh node lacks %q", w)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}

	for _, tc := range []struct {
		accept, wantType string
		wantEOF          bool
	}{
		{"", "text/plain; version=0.0.4", false},
		{"application/openmetrics-text; version=1.0.0", "application/openmetrics-text; version=1.0.0", true},
	} {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, tc.wantType) {
			t.Errorf("GET /metrics with Accept %q: Content-Type %q; want %q", tc.accept, ct, tc.wantType)
		}
		if got := strings.HasSuffix(string(b), "# EOF\n"); got != tc.wantEOF {
			t.Errorf("GET /metrics with Accept %q: ends with # EOF = %v; want %v", tc.accept, got, tc.wantEOF)
		}
	}
}

// TestHealthListener: with TLS on and client certificates required, the
// health listener answers /healthz and /readyz in plain HTTP, without a
// certificate, and serves nothing else; the HTTP listener still wants TLS.
func TestHealthListener(t *testing.T) {
	t.Parallel()
	cert, key := apitest.Cert(t, t.TempDir(), "node")
	ts := newTestServer(t, func(c *Config) {
		c.TLSCert, c.TLSKey, c.TLSClientCA = cert, key, cert
		c.HealthAddr = "127.0.0.1:0"
	})
	base := "http://" + ts.srv.HealthAddr()
	for _, tc := range []struct {
		path string
		want int
	}{{"/healthz", 200}, {"/readyz", 200}, {"/metrics", 404}, {"/debug/pprof/", 404}} {
		if code, body := httpGet(t, base+tc.path); code != tc.want {
			t.Errorf("GET %s on the health listener = %d %q; want %d", tc.path, code, body, tc.want)
		}
	}
	if code, _ := httpGet(t, "http://"+ts.srv.HTTPAddr()+"/healthz"); code != http.StatusBadRequest {
		t.Errorf("plain GET /healthz on the TLS HTTP listener = %d; want 400 (TLS only)", code)
	}
	srv := ts.srv
	ts.stop()
	if srv.HealthAddr() == "" {
		t.Fatal("HealthAddr is empty")
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("the health listener still answers after shutdown")
	}
}

// TestHealthAddrClash: the health listener cannot share an address with
// another listener.
func TestHealthAddrClash(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.HealthAddr = cfg.HTTPAddr
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--health-addr") {
		t.Errorf("Validate with --health-addr = --http-addr = %s: %v; want an error naming --health-addr", cfg.HTTPAddr, err)
	}
}
