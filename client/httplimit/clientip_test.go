package httplimit_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/sluice-io/sluice/client/httplimit"
)

// TestClientAddr: forwarded headers are believed only from trusted
// proxies, read from the right, and never let a client choose its
// identity.
func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	tests := []struct {
		name    string
		peer    string
		trusted []netip.Prefix
		headers map[string][]string
		want    string
	}{
		{"no proxy", "203.0.113.9:5555", trusted, nil, "203.0.113.9"},
		{"untrusted peer's header ignored", "203.0.113.9:5555", trusted,
			map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, "203.0.113.9"},
		{"no trusted proxies configured", "10.0.0.2:80", nil,
			map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, "10.0.0.2"},
		{"trusted proxy", "10.0.0.2:80", trusted,
			map[string][]string{"X-Forwarded-For": {"198.51.100.1"}}, "198.51.100.1"},
		{"client-written entries to the left are ignored", "10.0.0.2:80", trusted,
			map[string][]string{"X-Forwarded-For": {"1.2.3.4, 5.6.7.8, 198.51.100.1"}}, "198.51.100.1"},
		{"a chain of trusted proxies", "10.0.0.2:80", trusted,
			map[string][]string{"X-Forwarded-For": {"198.51.100.1, 10.1.1.1", "10.2.2.2"}}, "198.51.100.1"},
		{"all trusted: the leftmost", "10.0.0.2:80", trusted,
			map[string][]string{"X-Forwarded-For": {"10.3.3.3, 10.1.1.1"}}, "10.3.3.3"},
		{"garbage where the client should be: the nearest proxy", "10.0.0.2:80", trusted,
			map[string][]string{"X-Forwarded-For": {"198.51.100.1, evil-name, 10.1.1.1"}}, "10.1.1.1"},
		{"empty header: the peer", "10.0.0.2:80", trusted,
			map[string][]string{"X-Forwarded-For": {""}}, "10.0.0.2"},
		{"Forwarded wins over X-Forwarded-For", "10.0.0.2:80", trusted,
			map[string][]string{"Forwarded": {`for=198.51.100.7;proto=https`}, "X-Forwarded-For": {"198.51.100.1"}}, "198.51.100.7"},
		{"Forwarded IPv6 with port", "10.0.0.2:80", trusted,
			map[string][]string{"Forwarded": {`for=1.2.3.4, for="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::17"},
		{"Forwarded unknown: the nearest proxy", "10.0.0.2:80", trusted,
			map[string][]string{"Forwarded": {`for=1.2.3.4, for=unknown`}}, "10.0.0.2"},
		{"Forwarded obfuscated: the nearest proxy", "10.0.0.2:80", trusted,
			map[string][]string{"Forwarded": {`for=_hidden, for=10.9.9.9`}}, "10.9.9.9"},
		{"IPv4-mapped peer", "[::ffff:203.0.113.9]:5555", trusted, nil, "203.0.113.9"},
		{"trusted IPv6 proxy", "[2001:db8:ffff::1]:443", trusted,
			map[string][]string{"X-Forwarded-For": {"2001:db8:1::5"}}, "2001:db8:1::5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tt.peer, Header: http.Header{}}
			for k, vs := range tt.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got := httplimit.ClientAddr(r, tt.trusted)
			if want := netip.MustParseAddr(tt.want); got != want {
				t.Errorf("ClientAddr(peer %s, %v) = %v; want %v", tt.peer, tt.headers, got, want)
			}
		})
	}
}
