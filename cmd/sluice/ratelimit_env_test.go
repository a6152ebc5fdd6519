package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRatelimitEnv: serve reads envoyproxy/ratelimit's environment
// variables that have a meaning in Sluice, below the command line and
// SLUICE_* (which win), so that a ratelimit Deployment's environment
// carries over: its runtime directory, its response headers, its
// connection age. The variables without a meaning (statsd, Redis) are
// listed in one log line; a value that does not parse stops it.
func TestRatelimitEnv(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	limits := filepath.Join(root, "ratelimit", "config", "teams", "edge.yaml")
	if err := os.MkdirAll(filepath.Dir(limits), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(limits, []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := env{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "true",
		"GRPC_MAX_CONNECTION_AGE":        "2m",
		"GRPC_PORT":                      "1",    // the command line's --grpc-addr wins
		"SHADOW_MODE":                    "true", // SLUICE_SHADOW wins
		"SLUICE_SHADOW":                  "false",
		"LOG_FORMAT":                     "json",
		"USE_STATSD":                     "true", "REDIS_URL": "redis:6379",
		"TRACING_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
		"PORT": "tcp://10.0.0.1:80", // a Kubernetes service link, not ratelimit's
	}
	n := startNode(t, e)
	// The limits of the runtime directory are in force: 1 a minute.
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		resp, err := http.Post("http://"+n.httpAddr+"/json", "application/json",
			strings.NewReader(`{"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("POST /json %d under the runtime directory's limit of 1 a minute = %d; want %d", i+1, resp.StatusCode, want)
		}
	}
	n.stop()

	var start, rl map[string]any
	for _, line := range strings.Split(strings.TrimSpace(n.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not JSON (LOG_FORMAT=json): %v", line, err)
		}
		switch rec["msg"] {
		case "limits loaded":
			if c := strings.Count(line, `"component":"limits"`); c != 1 {
				t.Errorf("limits loaded names its component %d times; want once:\n%s", c, line)
			}
		case "starting sluice":
			start = rec
		case "envoyproxy/ratelimit environment variables":
			rl = rec
		}
	}
	transport, _ := start["transport"].(map[string]any)
	for key, want := range map[string]any{
		"limits_file":               filepath.Join(root, "ratelimit", "config"),
		"rate_limit_headers":        true,
		"rate_limit_headers_format": "draft03",
		"log_format":                "json",
	} {
		if start[key] != want {
			t.Errorf("start-up line %s = %v; want %v", key, start[key], want)
		}
	}
	if tr, _ := start["tracing"].(map[string]any); tr["otlp_endpoint"] != "http://127.0.0.1:1" {
		t.Errorf("start-up line tracing = %v; want otlp_endpoint from OTEL_EXPORTER_OTLP_ENDPOINT (TRACING_ENABLED)", start["tracing"])
	}
	if transport["max_connection_age"] != "2m0s" {
		t.Errorf("start-up line transport.max_connection_age = %v; want 2m0s (GRPC_MAX_CONNECTION_AGE)", transport["max_connection_age"])
	}
	if _, ok := start["shadow"]; ok {
		t.Errorf("start-up line shadow = %v; want the default (SLUICE_SHADOW=false wins over SHADOW_MODE)", start["shadow"])
	}
	strs := func(v any) []string {
		var out []string
		for _, s := range v.([]any) {
			out = append(out, s.(string))
		}
		return out
	}
	if rl == nil {
		t.Fatalf("no log line about ratelimit's variables:\n%s", n.logs)
	}
	if got, want := strs(rl["ignored"]), []string{"PORT", "REDIS_URL", "USE_STATSD"}; !slices.Equal(got, want) {
		t.Errorf("ignored = %v; want %v", got, want)
	}
	if got := strs(rl["read"]); !slices.Contains(got, "LIMIT_RESPONSE_HEADERS_ENABLED") || slices.Contains(got, "SHADOW_MODE") || slices.Contains(got, "GRPC_HOST, GRPC_PORT") {
		t.Errorf("read = %v; want LIMIT_RESPONSE_HEADERS_ENABLED, and neither SHADOW_MODE nor GRPC_PORT (overridden)", got)
	}

	for _, tt := range []struct {
		env  env
		name string
	}{
		{env{"MERGE_DOMAIN_CONFIG": "yes"}, "MERGE_DOMAIN_CONFIG"},
		{env{"CONFIG_TYPE": "REDIS"}, "CONFIG_TYPE"},
		{env{"GRPC_MAX_CONNECTION_AGE": "soon"}, "GRPC_MAX_CONNECTION_AGE"},
		{env{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "grpc"}, "TRACING_EXPORTER_PROTOCOL"},
	} {
		r := mustRun(t, exitError, tt.env, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--durability", "memory")
		if !strings.Contains(r.stderr, "environment variable "+tt.name) {
			t.Errorf("serve with %v: stderr %q; want %s named", tt.env, r.stderr, tt.name)
		}
	}
}
