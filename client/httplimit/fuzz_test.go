package httplimit_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/sluice-io/sluice/client/httplimit"
)

// FuzzClientAddr: whatever the headers say, an untrusted peer is the
// client; a trusted peer's headers give a valid address; and nothing a
// client writes to the left of the first address that is not a trusted
// proxy changes its identity.
//
//	go test -fuzz FuzzClientAddr -fuzztime 15s ./client/httplimit
func FuzzClientAddr(f *testing.F) {
	f.Add("10.0.0.2:80", "198.51.100.1, 10.1.1.1", "")
	f.Add("10.0.0.2:80", "", `for=198.51.100.7;proto=https, for="[2001:db8::1]:4711"`)
	f.Add("203.0.113.9:1", "1.2.3.4", "for=unknown")
	f.Add("[::ffff:10.0.0.1]:5", "evil, 10.9.9.9", "for=_x")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	request := func(peer, xff, fwd string) *http.Request {
		r := &http.Request{RemoteAddr: peer, Header: http.Header{}}
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		if fwd != "" {
			r.Header.Set("Forwarded", fwd)
		}
		return r
	}
	f.Fuzz(func(t *testing.T, peer, xff, fwd string) {
		peerAddr := httplimit.ClientAddr(request(peer, "", ""), nil)
		got := httplimit.ClientAddr(request(peer, xff, fwd), trusted)
		if !isTrusted(peerAddr) {
			if got != peerAddr {
				t.Fatalf("ClientAddr(%q, %q, %q) = %v; want the untrusted peer %v", peer, xff, fwd, got, peerAddr)
			}
			return
		}
		if !got.IsValid() {
			t.Fatalf("ClientAddr(%q, %q, %q) is invalid; the peer %v is not", peer, xff, fwd, peerAddr)
		}
		if isTrusted(got) {
			return
		}
		// A client that writes more to the left changes nothing.
		xff2, fwd2 := xff, fwd
		if fwd != "" {
			fwd2 = "for=198.51.100.66, " + fwd
		} else {
			xff2 = "198.51.100.66, " + xff
		}
		if again := httplimit.ClientAddr(request(peer, xff2, fwd2), trusted); again != got {
			t.Fatalf("ClientAddr(%q, %q, %q) = %v, but %v once the client prepends an address (%q, %q)", peer, xff, fwd, got, again, xff2, fwd2)
		}
	})
}
