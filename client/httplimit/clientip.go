package httplimit

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ClientAddr returns the address of the client that sent r, as ClientIP
// counts it before the IPv6 prefix is applied: the connection's peer
// (r.RemoteAddr), unless the peer is one of the trusted proxies. Then the
// proxies' own report is read from the right: the Forwarded header (RFC
// 7239) if the request has one, else X-Forwarded-For. Each trusted proxy
// appends the address it received the request from, so the rightmost
// address that is not a trusted proxy is the client; the addresses to its
// left were written by the client itself and are ignored. A report that
// cannot be read where the client should be ("unknown", an obfuscated
// identifier, garbage) gives the nearest trusted proxy's address: requests
// are then counted together, never under a name the client chose.
//
// With no trusted proxies (the default), the headers are never read:
// anyone can send them.
func ClientAddr(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseHostPort(r.RemoteAddr)
	if !peer.IsValid() || !isTrusted(peer, trusted) {
		return peer
	}
	hops := forwardedFor(r.Header)
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseNode(hops[i])
		if !a.IsValid() {
			return client
		}
		client = a
		if !isTrusted(a, trusted) {
			return a
		}
	}
	return client
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedFor returns the client addresses the proxies reported, oldest
// (leftmost) first: the for= parameters of every Forwarded header, else
// the entries of every X-Forwarded-For header.
func forwardedFor(h http.Header) []string {
	var hops []string
	if fw := h.Values("Forwarded"); len(fw) > 0 {
		for _, line := range fw {
			for _, elem := range strings.Split(line, ",") {
				v := ""
				for _, pair := range strings.Split(elem, ";") {
					k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if ok && strings.EqualFold(k, "for") {
						v = strings.Trim(val, `"`)
					}
				}
				hops = append(hops, v)
			}
		}
		return hops
	}
	for _, line := range h.Values("X-Forwarded-For") {
		for _, v := range strings.Split(line, ",") {
			hops = append(hops, strings.TrimSpace(v))
		}
	}
	return hops
}

// parseNode parses an address as proxies write it: "192.0.2.1",
// "192.0.2.1:4711", "2001:db8::1", "[2001:db8::1]:4711".
func parseNode(s string) netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("")
	}
	return parseHostPort(s)
}

func parseHostPort(s string) netip.Addr {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = strings.Trim(s, "[]")
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap().WithZone("")
}

// clientKey is the value ClientIP counts r under: the client address, an
// IPv6 one reduced to its prefix.
func (l *Limiter) clientKey(r *http.Request) string {
	a := ClientAddr(r, l.cfg.TrustedProxies)
	if !a.IsValid() {
		return ""
	}
	if a.Is6() && l.cfg.IPv6PrefixLen < 128 {
		p, err := a.Prefix(l.cfg.IPv6PrefixLen)
		if err == nil {
			return p.String()
		}
	}
	return a.String()
}
