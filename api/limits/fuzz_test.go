package limits

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

var fuzzSeeds = []string{
	"domain: d\ndescriptors:\n  - key: a\n    value: b*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: c\n        rate_limit: {unlimited: true}\n",
	"domain: d\ndescriptors:\n  - key: a\n    rate_limit: &r {unit: day, requests_per_unit: 5, name: x}\n  - key: b\n    rate_limit:\n      <<: *r\n      replaces: [{name: x}]\n",
	"domain: d\ndescriptors:\n  - key: a\n    metadata: {a: [1, {b: c}], d: 2001-01-01}\n",
	"domain: d\ndescriptors: &a\n  - key: a\n    descriptors: *a\n",
	"domain: d\n---\ndomain: e\n",
	"0.25: x\n",
	"- a\n",
	"",
}

// FuzzParse checks that Parse never panics, that every error it returns is
// an *Error, and that what it accepts can be looked up.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, "a", "b")
	}
	f.Add(aliasBomb(8), "k1", "")
	f.Fuzz(func(t *testing.T, data, key, value string) {
		c, err := Parse("f.yaml", []byte(data))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Reason == "" {
				t.Fatalf("Parse error %#v is not an *Error with a reason", err)
			}
			return
		}
		for _, dom := range c.Domains() {
			c.Lookup(dom, []Entry{{key, value}})
			c.Match(dom, []Entry{{key, value}, {value, key}})
			for _, r := range c.Rules(dom) {
				if r.Domain != dom || r.Line <= 0 || r.File != "f.yaml" || (r.Unlimited != (r.Unit == UnitUnknown)) {
					t.Fatalf("bad rule %+v", r)
				}
			}
		}
	})
}

// FuzzWildcard checks wildcard matching against a regular expression in
// which each '*' is ".*".
func FuzzWildcard(f *testing.F) {
	f.Add("bar*b", "barab")
	f.Add("foo*bar*baz", "foobarbaz")
	f.Add("ab*b", "ab")
	f.Add("*", "")
	f.Add("a**b", "ab")
	f.Fuzz(func(t *testing.T, pattern, value string) {
		// The regexp package works on UTF-8; compare on valid text only.
		if !strings.Contains(pattern, "*") || !utf8.ValidString(pattern) || !utf8.ValidString(value) {
			return
		}
		parts := strings.Split(pattern, "*")
		w := &wildcard{parts: parts}
		quoted := make([]string, len(parts))
		for i, p := range parts {
			w.minLen += len(p)
			quoted[i] = regexp.QuoteMeta(p)
		}
		re := regexp.MustCompile(`^(?s:` + strings.Join(quoted, ".*") + `)$`)
		if got, want := w.match(value), re.MatchString(value); got != want {
			t.Fatalf("pattern %q, value %q: match = %v; want %v", pattern, value, got, want)
		}
	})
}
