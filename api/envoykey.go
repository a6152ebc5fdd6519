package api

import (
	"strings"

	"github.com/sluice-io/sluice/api/limits"
)

// Envoy keys.
//
// A request descriptor of the Envoy RLS API is counted under one engine key
// built from its domain and entries:
//
//	domain|key1=value1|key2=value2
//
// The domain, each entry key and each entry value is escaped the same way:
// '%', '|', '=' and every byte outside the printable ASCII range 0x21-0x7E
// (space, control bytes, DEL, and each byte of a non-ASCII UTF-8 character)
// become '%' followed by two upper-case hex digits, as in a URL; every other
// byte stands for itself. For example:
//
//	domain "edge", (remote_address, 10.0.0.1)        edge|remote_address=10.0.0.1
//	domain "edge", (path, /a|b), (user, Zoë)         edge|path=/a%7Cb|user=Zo%C3%AB
//	domain "edge", (header, "a=b c")                 edge|header=a%3Db%20c
//
// Because the separators never appear unescaped inside a part, two different
// (domain, entries) pairs never share a key, and a key is always printable.
// Keys are canonical: parseEnvoyKey accepts exactly the keys envoyKey
// produces for a valid descriptor, so envoyKey(parseEnvoyKey(k)) == k.
//
// A descriptor matched through a wildcard value with share_threshold is
// counted under the key of the shared descriptor, whose value is the
// pattern: every value that files/* matches counts under
// "edge|file=files/*".

// envoyKey returns the engine key of the descriptor entries of domain. It is
// injective over all inputs, empty ones included.
func envoyKey(domain string, entries []limits.Entry) string {
	n := len(domain)
	for _, e := range entries {
		n += 2 + len(e.Key) + len(e.Value)
	}
	var b strings.Builder
	b.Grow(n + n/8)
	escapeKeyPart(&b, domain)
	for _, e := range entries {
		b.WriteByte('|')
		escapeKeyPart(&b, e.Key)
		b.WriteByte('=')
		escapeKeyPart(&b, e.Value)
	}
	return b.String()
}

// keyByteNeedsEscape reports whether envoyKey escapes c.
func keyByteNeedsEscape(c byte) bool {
	return c < 0x21 || c > 0x7e || c == '%' || c == '|' || c == '='
}

const upperHex = "0123456789ABCDEF"

// escapeKeyPart writes s to b with the bytes that need it percent-escaped.
func escapeKeyPart(b *strings.Builder, s string) {
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !keyByteNeedsEscape(c) {
			continue
		}
		b.WriteString(s[start:i])
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0xf])
		start = i + 1
	}
	b.WriteString(s[start:])
}

// parseEnvoyKey is the inverse of envoyKey. It reports false for a key that
// envoyKey would not produce for a valid descriptor: no domain, no entries,
// an entry with an empty key, a part with an unescaped separator or
// non-printable byte, a malformed escape, lower-case hex, or an escape of a
// byte that needs none. Entry values may be empty.
func parseEnvoyKey(key string) (domain string, entries []limits.Entry, ok bool) {
	rawDomain, rest, found := strings.Cut(key, "|")
	if !found {
		return "", nil, false
	}
	if domain, ok = unescapeKeyPart(rawDomain); !ok || domain == "" {
		return "", nil, false
	}
	entries = make([]limits.Entry, 0, strings.Count(rest, "|")+1)
	for {
		part, next, more := strings.Cut(rest, "|")
		rawKey, rawValue, hasEq := strings.Cut(part, "=")
		if !hasEq {
			return "", nil, false
		}
		k, okK := unescapeKeyPart(rawKey)
		v, okV := unescapeKeyPart(rawValue)
		if !okK || !okV || k == "" {
			return "", nil, false
		}
		entries = append(entries, limits.Entry{Key: k, Value: v})
		if !more {
			return domain, entries, true
		}
		rest = next
	}
}

// unescapeKeyPart decodes one part of a key, refusing anything that
// escapeKeyPart would not have written.
func unescapeKeyPart(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		for i := 0; i < len(s); i++ {
			if keyByteNeedsEscape(s[i]) {
				return "", false
			}
		}
		return s, true
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			if keyByteNeedsEscape(c) {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		hi, okH := upperHexValue(s[i+1])
		lo, okL := upperHexValue(s[i+2])
		if !okH || !okL {
			return "", false
		}
		d := hi<<4 | lo
		if !keyByteNeedsEscape(d) {
			return "", false
		}
		b.WriteByte(d)
		i += 2
	}
	return b.String(), true
}

func upperHexValue(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// limitsRuleForKey returns the limits-file rule of a native check's key when
// the key is an Envoy key (see envoyKey) that matches a rule, or nil: no
// limits file, not an Envoy key, or no rule. The rule may be unlimited, with
// no limit or window.
func (s *Server) limitsRuleForKey(key string) *limits.Rule {
	if s.limits == nil {
		return nil
	}
	domain, entries, ok := parseEnvoyKey(key)
	if !ok {
		return nil
	}
	rule, ok := s.limits.Current().Lookup(domain, entries)
	if !ok {
		return nil
	}
	return rule
}
