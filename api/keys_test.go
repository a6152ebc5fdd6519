package api

import (
	"bytes"
	"testing"
)

// TestKeyForms: printable and parseKey are each other's inverse, for any
// bytes, and parseKey refuses a lone backslash.
func TestKeyForms(t *testing.T) {
	for _, key := range [][]byte{[]byte("tenant:42"), []byte(`a\b`), {0, 0xff, '\\', 'x', '4', '1'}, []byte("edge|k=v")} {
		p := PrintableKey(key)
		got, err := ParseKey(p)
		if err != nil || !bytes.Equal(got, key) {
			t.Errorf("ParseKey(PrintableKey(%q) = %q) = %q, %v; want %q", key, p, got, err, key)
		}
	}
	if got, err := ParseKey(`\X41\x4a`); err == nil || got != nil {
		t.Errorf(`ParseKey(\X41\x4a) = %q, %v; want an error (\X is not an escape)`, got, err)
	}
	if got, _ := ParseKey(`\x4A\x4a`); string(got) != "JJ" {
		t.Errorf(`ParseKey(\x4A\x4a) = %q; want JJ (either case)`, got)
	}
	for _, bad := range []string{`\`, `a\q`, `\x4`, `\xzz`} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) = nil error; want one", bad)
		}
	}
}

// FuzzParseKey: parseKey never panics, and what it reads prints back to a
// form it reads the same.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"a", `\\`, `\x00`, `\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, err := ParseKey(s)
		if err != nil {
			return
		}
		again, err := ParseKey(PrintableKey(key))
		if err != nil || !bytes.Equal(again, key) {
			t.Fatalf("ParseKey(PrintableKey(%q)) = %q, %v", key, again, err)
		}
	})
}
