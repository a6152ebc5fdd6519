package edge

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// TestSecretKeysNotLogged: a rule keyed by X-API-Key (a credential by its
// name) or marked secret never puts the value in the edge's logs, here the
// WARN of a check Sluice did not decide (the Sluice address refuses
// connections), which quoted the key before.
func TestSecretKeysNotLogged(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	lis.Close() // nothing listens there now
	o := newOrigin(t)
	logPath := filepath.Join(t.TempDir(), "log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	e := startEdge(t, o.url, down, func(c *Config) {
		c.Rules = &RulesFile{Routes: []RouteSpec{{Name: "api", PathPrefix: "/", Rules: []RuleSpec{
			{Name: "by_api_key", Key: "header:X-API-Key", Limit: 5, Window: "1m"},
			{Name: "by_tenant", Key: "header:X-Tenant+method", Limit: 5, Window: "1m", Secret: true},
		}}}}
		c.Logger = slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	r := get(t, "GET", "http://"+e.Addr()+"/", map[string]string{"X-API-Key": "sk-live-0123456789", "X-Tenant": "tenant-secret-42"}, "")
	if r.status != 200 {
		t.Fatalf("GET with Sluice down (fail open): %d; want 200", r.status)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	if !strings.Contains(got, "Sluice did not decide") {
		t.Fatalf("no WARN for the undecided check; log:\n%s", got)
	}
	for _, secret := range []string{"sk-live-0123456789", "tenant-secret-42"} {
		if strings.Contains(got, secret) {
			t.Errorf("the log holds %q in clear:\n%s", secret, got)
		}
	}
	if !strings.Contains(got, "sha256:") {
		t.Errorf("the log names no hashed key:\n%s", got)
	}
}

// TestRealIPFollowsTrustedProxies: the origin's X-Real-IP is the client as
// the edge counts it: the peer when the peer is not a trusted proxy (what
// it wrote in X-Real-IP is dropped), the client its X-Forwarded-For names
// when it is. Before, X-Real-IP went through as the client wrote it.
func TestRealIPFollowsTrustedProxies(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	seen := make(chan string, 1)
	o := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("X-Real-Ip")
	}))
	t.Cleanup(o.Close)
	for _, tt := range []struct {
		trusted string
		header  map[string]string
		want    string
	}{
		{"", map[string]string{"X-Real-IP": "203.0.113.66"}, "127.0.0.1"},
		{"", map[string]string{"X-Real-IP": "203.0.113.66", "X-Forwarded-For": "203.0.113.66"}, "127.0.0.1"},
		{"127.0.0.0/8", map[string]string{"X-Real-IP": "203.0.113.66", "X-Forwarded-For": "198.51.100.7"}, "198.51.100.7"},
		{"127.0.0.0/8", nil, "127.0.0.1"},
	} {
		e := startEdge(t, o.URL, n.Addr, func(c *Config) {
			c.Rules = oneRule("ip", 100, "1m", "")
			if tt.trusted != "" {
				c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix(tt.trusted)}
			}
		})
		if r := get(t, "GET", "http://"+e.Addr()+"/", tt.header, ""); r.status != 200 {
			t.Fatalf("GET: %d", r.status)
		}
		if got := <-seen; got != tt.want {
			t.Errorf("trusted %q, headers %v: the origin got X-Real-IP %q; want %q", tt.trusted, tt.header, got, tt.want)
		}
	}
}
