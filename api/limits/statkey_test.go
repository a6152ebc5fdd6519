package limits

import (
	"strings"
	"testing"
)

const statKeyLimits = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: remote_address
    value: 10.0.0.1
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: user
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: method
    value_to_metric: true
    descriptors:
      - key: path
        value: "/api/*"
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: file
    value: "files/*"
    share_threshold: true
    descriptors:
      - key: op
        detailed_metric: true
        rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: route
    value: "r/*"
    value_to_metric: true
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: tenant
    value: acme
    shadow_mode: true
    quota_mode: true
    rate_limit: { unlimited: true }
`

// TestStatKeys: a rule's statistics key is envoyproxy/ratelimit's: the
// descriptors on the way, key or key_value, joined by dots; detailed_metric
// and value_to_metric put the request's values in it.
func TestStatKeys(t *testing.T) {
	c := mustParse(t, statKeyLimits)
	for _, tc := range []struct {
		entries           []Entry
		static, request   string
		fromRequestValues bool
	}{
		{d("remote_address=10.0.0.9"), "remote_address", "remote_address", false},
		{d("remote_address=10.0.0.1"), "remote_address_10.0.0.1", "remote_address_10.0.0.1", false},
		{d("user=bob"), "user", "user_bob", true},
		{d("method=GET", "path=/api/v1"), "method.path_/api/*", "method_GET.path_/api/*", true},
		{d("file=files/a.pdf", "op=read"), "file_files/*.op", "file_files/*.op_read", true},
		{d("route=r/7"), "route_r/*", "route_r/7", true},
		{d("tenant=acme"), "tenant_acme", "tenant_acme", false},
	} {
		r, ok := c.Lookup("edge", tc.entries)
		if !ok {
			t.Fatalf("Lookup(%v) found no rule", tc.entries)
		}
		if r.StatKey != tc.static {
			t.Errorf("Lookup(%v).StatKey = %q; want %q", tc.entries, r.StatKey, tc.static)
		}
		if got := r.RequestStatKey(tc.entries); got != tc.request {
			t.Errorf("Lookup(%v).RequestStatKey = %q; want %q", tc.entries, got, tc.request)
		}
		if got := r.StatKeyFromRequest(); got != tc.fromRequestValues {
			t.Errorf("Lookup(%v).StatKeyFromRequest = %v; want %v", tc.entries, got, tc.fromRequestValues)
		}
	}
}

// TestDump: one line per rule in envoyproxy/ratelimit's /rlconfig format,
// domains sorted, rules in file order.
func TestDump(t *testing.T) {
	c, err := build([]source{
		{name: "b.yaml", data: []byte(statKeyLimits)},
		{name: "a.yaml", data: []byte("domain: api\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 3 }\n")},
	}, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"api.k: unit=DAY requests_per_unit=3, shadow_mode: false, quota_mode: false",
		"edge.remote_address: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false",
		"edge.remote_address_10.0.0.1: unit=SECOND requests_per_unit=0, shadow_mode: false, quota_mode: false",
		"edge.user: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false",
		"edge.method.path_/api/*: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false",
		"edge.file_files/*.op: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false",
		"edge.route_r/*: unit=HOUR requests_per_unit=5, shadow_mode: false, quota_mode: false",
		"edge.tenant_acme: unit=UNKNOWN requests_per_unit=0, shadow_mode: true, quota_mode: true",
	}, "\n") + "\n"
	if got := c.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}
	if got := (*Config)(nil).Dump(); got != "" {
		t.Errorf("nil Config: Dump() = %q; want empty", got)
	}
}
