package api

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/api/limits"
)

// entries builds descriptor entries from key, value pairs.
func entries(kv ...string) []limits.Entry {
	var es []limits.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, limits.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestEnvoyKeyExamples(t *testing.T) {
	tests := []struct {
		domain  string
		entries []limits.Entry
		want    string
	}{
		{"edge", entries("remote_address", "10.0.0.1"), "edge|remote_address=10.0.0.1"},
		{"edge", entries("path", "/a|b", "user", "Zoë"), "edge|path=/a%7Cb|user=Zo%C3%AB"},
		{"edge", entries("header", "a=b c"), "edge|header=a%3Db%20c"},
		{"edge", entries("k", ""), "edge|k="},
		{"100%", entries("k=", "%"), "100%25|k%3D=%25"},
		{"d", entries("k", "\x00\t\n\x7f\xff"), "d|k=%00%09%0A%7F%FF"},
		{"d", entries("file", "files/*", "a", "b"), "d|file=files/*|a=b"},
	}
	for _, tt := range tests {
		got := envoyKey(tt.domain, tt.entries)
		if got != tt.want {
			t.Errorf("envoyKey(%q, %v) = %q; want %q", tt.domain, tt.entries, got, tt.want)
		}
		domain, es, ok := parseEnvoyKey(got)
		if !ok || domain != tt.domain || !slices.Equal(es, tt.entries) {
			t.Errorf("parseEnvoyKey(%q) = %q, %v, %v; want %q, %v, true", got, domain, es, ok, tt.domain, tt.entries)
		}
	}
}

// TestParseEnvoyKeyRejects: parseEnvoyKey accepts only keys envoyKey
// produces for valid descriptors.
func TestParseEnvoyKeyRejects(t *testing.T) {
	for _, key := range []string{
		"",
		"domain",             // no entries
		"|k=v",               // no domain
		"d|",                 // empty entry
		"d|k",                // no '='
		"d|=v",               // empty key
		"d|k=v=w",            // unescaped '='
		"d|k=v|",             // trailing separator
		"d||k=v",             // empty entry
		"d|k=a b",            // raw space
		"d|k=\x00",           // raw control byte
		"d|k=caf\xc3\xa9",    // raw non-ASCII
		"d|k=%",              // truncated escape
		"d|k=%4",             // truncated escape
		"d|k=%zz",            // not hex
		"d|k=%7c",            // lower-case hex
		"d|k=%41",            // 'A' needs no escape
		"d%7C|k=v%7Cx|y=z%2", // truncated escape at the end
	} {
		if domain, es, ok := parseEnvoyKey(key); ok {
			t.Errorf("parseEnvoyKey(%q) = %q, %v, true; want false", key, domain, es)
		}
	}
}

// randomPart returns a string that favours the bytes the encoding treats
// specially.
func randomPart(r *rand.Rand, allowEmpty bool) string {
	const special = "%|=% \x00\x7f\xff%25%7C|a=b"
	n := r.IntN(6)
	if n == 0 && !allowEmpty {
		n = 1
	}
	var b strings.Builder
	for range n {
		switch r.IntN(3) {
		case 0:
			b.WriteByte(special[r.IntN(len(special))])
		case 1:
			b.WriteByte(byte(r.IntN(256)))
		default:
			b.WriteByte("abcXYZ019/*._-"[r.IntN(14)])
		}
	}
	return b.String()
}

func randomDescriptor(r *rand.Rand) (string, []limits.Entry) {
	domain := randomPart(r, false)
	es := make([]limits.Entry, 1+r.IntN(4))
	for i := range es {
		es[i] = limits.Entry{Key: randomPart(r, false), Value: randomPart(r, true)}
	}
	return domain, es
}

// TestEnvoyKeyRoundTripAndInjective: over random descriptors heavy in
// separators and escapes, parseEnvoyKey inverts envoyKey, every key is
// printable, and two different descriptors never share a key.
func TestEnvoyKeyRoundTripAndInjective(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	type desc struct {
		domain  string
		entries []limits.Entry
	}
	seen := make(map[string]desc)
	for range 50000 {
		domain, es := randomDescriptor(r)
		key := envoyKey(domain, es)
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("envoyKey(%q, %q) = %q: byte %d is not printable", domain, es, key, i)
			}
		}
		gotDomain, gotEs, ok := parseEnvoyKey(key)
		if !ok || gotDomain != domain || !slices.Equal(gotEs, es) {
			t.Fatalf("parseEnvoyKey(envoyKey(%q, %q) = %q) = %q, %q, %v; want the input back", domain, es, key, gotDomain, gotEs, ok)
		}
		if prev, dup := seen[key]; dup && (prev.domain != domain || !slices.Equal(prev.entries, es)) {
			t.Fatalf("envoyKey(%q, %q) = envoyKey(%q, %q) = %q", domain, es, prev.domain, prev.entries, key)
		}
		seen[key] = desc{domain, es}
	}
	// Near-misses that a naive join would confuse.
	pairs := [][2]desc{
		{{"a|b", entries("c", "d")}, {"a", entries("b", "", "c", "d")}},
		{{"a", entries("b=c", "d")}, {"a", entries("b", "c=d")}},
		{{"a", entries("b", "c|d=e")}, {"a", entries("b", "c", "d", "e")}},
		{{"a", entries("b", "%7C")}, {"a", entries("b", "|")}},
	}
	for _, p := range pairs {
		if k1, k2 := envoyKey(p[0].domain, p[0].entries), envoyKey(p[1].domain, p[1].entries); k1 == k2 {
			t.Errorf("envoyKey(%q, %q) = envoyKey(%q, %q) = %q", p[0].domain, p[0].entries, p[1].domain, p[1].entries, k1)
		}
	}
}

// FuzzParseEnvoyKey: parseEnvoyKey never panics, and whatever it accepts
// is canonical: encoding what it returns gives the key back.
func FuzzParseEnvoyKey(f *testing.F) {
	for _, s := range []string{"", "d|k=v", "edge|path=/a%7Cb|user=Zo%C3%AB", "d|k=%7c", "%|=", "d|k=v|", "a|b=c=d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		domain, es, ok := parseEnvoyKey(key)
		if !ok {
			return
		}
		if domain == "" || len(es) == 0 {
			t.Fatalf("parseEnvoyKey(%q) accepted an invalid descriptor: %q, %q", key, domain, es)
		}
		if got := envoyKey(domain, es); got != key {
			t.Fatalf("parseEnvoyKey(%q) = %q, %q, but envoyKey of that is %q", key, domain, es, got)
		}
	})
}

// FuzzEnvoyKeyRoundTrip: for any domain and entries (split from the fuzz
// input on NUL and SOH), envoyKey is inverted by parseEnvoyKey.
func FuzzEnvoyKeyRoundTrip(f *testing.F) {
	f.Add("edge\x00k\x01v", "")
	f.Add("a|b\x00c=\x01%", "x")
	f.Fuzz(func(t *testing.T, in, extra string) {
		parts := strings.Split(in, "\x00")
		domain := parts[0]
		var es []limits.Entry
		for _, p := range parts[1:] {
			k, v, _ := strings.Cut(p, "\x01")
			es = append(es, limits.Entry{Key: k, Value: v + extra})
		}
		key := envoyKey(domain, es)
		gotDomain, gotEs, ok := parseEnvoyKey(key)
		valid := domain != "" && len(es) > 0 && !slices.ContainsFunc(es, func(e limits.Entry) bool { return e.Key == "" })
		if ok != valid {
			t.Fatalf("parseEnvoyKey(envoyKey(%q, %q) = %q) ok = %v; want %v", domain, es, key, ok, valid)
		}
		if ok && (gotDomain != domain || !slices.Equal(gotEs, es)) {
			t.Fatalf("parseEnvoyKey(envoyKey(%q, %q)) = %q, %q", domain, es, gotDomain, gotEs)
		}
	})
}
