package limits

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Every error names the file and line of the problem and says what to
// change. The cases include each of envoyproxy/ratelimit's own
// test/config error files.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // the whole message
	}{
		{"empty file", "", `limits: f.yaml: the file is empty; it needs a domain and a list of descriptors`},
		{"only comments", "# nothing\n", `limits: f.yaml: the file is empty; it needs a domain and a list of descriptors`},
		{"not a mapping", "- a\n- b\n", `limits: f.yaml:1: the top of the file must be a mapping, found a list`},
		{"empty domain", "domain: \"\"\ndescriptors: []\n",
			`limits: f.yaml:1: the file has no domain; add domain: <name>, the domain Envoy sends in its rate limit requests`},
		{"no domain", "descriptors:\n  - key: a\n",
			`limits: f.yaml:1: the file has no domain; add domain: <name>, the domain Envoy sends in its rate limit requests`},
		{"domain not a string", "domain: [a]\n", `limits: f.yaml:1: domain must be a string, found a list`},
		// The line of a syntax error is the YAML parser's; for an unclosed
		// flow sequence it is the line before the '['.
		{"bad yaml", "domain: d\ndescriptors:\n  - key: a\n    value: [b\n",
			`limits: f.yaml:3: invalid YAML: did not find expected ',' or ']'`},
		{"bad indentation", "domain: d\ndescriptors:\n  - key: a\n     value: b\n",
			`limits: f.yaml:4: invalid YAML: mapping values are not allowed in this context`},
		{"second document", "domain: a\n---\ndomain: b\n",
			`limits: f.yaml:3: a second YAML document starts here; a file holds one domain, so put each domain in its own file`},
		{"non-string key", "0.25: test-domain\ndescriptors: []\n",
			`limits: f.yaml:1: unknown field "0.25" in the top of the file; the top of the file takes only domain, descriptors`},
		{"descriptors not a list", "domain: d\ndescriptors:\n  key: a\n",
			`limits: f.yaml:3: descriptors must be a list of descriptors, each starting with - key:, found a mapping`},
		{"non-map list", "domain: d\ndescriptors:\n  - a\n  - b\n",
			"limits: f.yaml:3: a descriptor must be a mapping with at least a key, found \"a\"\n" +
				`limits: f.yaml:4: a descriptor must be a mapping with at least a key, found "b"`},
		{"empty key", "domain: d\ndescriptors:\n  - value: value1\n",
			`limits: f.yaml:3: the descriptor has no key; add key: <descriptor key>, the key Envoy sends in its descriptor entry`},
		{"wildcard key", "domain: d\ndescriptors:\n  - key: a*\n",
			`limits: f.yaml:3: key "a*" has a '*': wildcards are only supported in value; write the key exactly as Envoy sends it`},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
			`limits: f.yaml:6: duplicate descriptor key=key1 value=value1 at this level (first on line 3); merge the two into one`},
		{"duplicate default", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n",
			`limits: f.yaml:6: duplicate descriptor key=b at this level (first on line 5); merge the two into one`},
		{"duplicate field", "domain: d\ndescriptors:\n  - key: a\n    key: b\n",
			`limits: f.yaml:4: field "key" is set twice in a descriptor (also on line 3); keep one`},
		{"misspelled rate_limit", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
			`limits: f.yaml:5: unknown field "ratelimit" in a descriptor; did you mean "rate_limit"?`},
		{"misspelled requests_per_unit", "domain: d\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			`limits: f.yaml:6: unknown field "requestsperunit" in rate_limit; did you mean "requests_per_unit"?`},
		{"unknown field", "domain: d\ndescriptors:\n  - key: a\n    colour: blue\n",
			`limits: f.yaml:4: unknown field "colour" in a descriptor; a descriptor takes only key, value, rate_limit, descriptors, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata, usage, lease`},
		{"shadow_mode inside rate_limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n      shadow_mode: true\n",
			`limits: f.yaml:7: unknown field "shadow_mode" in rate_limit; shadow_mode belongs on the descriptor, next to rate_limit, not inside it`},
		{"unit beside rate_limit", "domain: d\ndescriptors:\n  - key: a\n    unit: day\n",
			`limits: f.yaml:4: unknown field "unit" in a descriptor; unit belongs inside rate_limit`},
		{"key at the top", "domain: d\nkey: a\n",
			`limits: f.yaml:2: unknown field "key" in the top of the file; key belongs on a descriptor, in the descriptors list`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
			`limits: f.yaml:6: unknown unit "foo" (want second, minute, hour, day, week, month or year)`},
		{"unit unknown", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: unknown, requests_per_unit: 5}\n",
			`limits: f.yaml:4: unknown unit "unknown" (want second, minute, hour, day, week, month or year)`},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n",
			`limits: f.yaml:5: rate_limit has no unit; add unit: second, minute, hour, day, week, month or year`},
		{"no requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n",
			`limits: f.yaml:5: rate_limit has no requests_per_unit; add requests_per_unit: <count> (0 blocks every request)`},
		{"null requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit:\n",
			`limits: f.yaml:6: rate_limit has no requests_per_unit; add requests_per_unit: <count> (0 blocks every request)`},
		{"negative requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`limits: f.yaml:4: requests_per_unit must be a whole number from 0 to 4294967295, found "-1"`},
		{"requests_per_unit too big", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
			`limits: f.yaml:4: requests_per_unit must be a whole number from 0 to 4294967295, found "4294967296"`},
		{"quoted requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: \"5\"}\n",
			`limits: f.yaml:4: requests_per_unit must be a whole number from 0 to 4294967295, found "5"`},
		{"fractional requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2.5}\n",
			`limits: f.yaml:4: requests_per_unit must be a whole number from 0 to 4294967295, found "2.5"`},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n",
			`limits: f.yaml:6: an unlimited rate_limit takes no unit; remove unit, or remove unlimited: true to enforce the limit`},
		{"unlimited with requests_per_unit", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      requests_per_unit: 25\n",
			`limits: f.yaml:6: an unlimited rate_limit takes no requests_per_unit; remove requests_per_unit, or remove unlimited: true to enforce the limit`},
		{"unlimited not a bool", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: always\n",
			`limits: f.yaml:5: unlimited must be true or false, found "always"`},
		{"quoted bool", "domain: d\ndescriptors:\n  - key: foo\n    shadow_mode: \"true\"\n",
			`limits: f.yaml:4: shadow_mode must be true or false, found "true"`},
		{"empty rate_limit", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit:\n",
			`limits: f.yaml:4: rate_limit is empty; give it unit and requests_per_unit, or unlimited: true, or remove it`},
		{"rate_limit not a mapping", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit: 5/s\n",
			`limits: f.yaml:4: rate_limit must be a mapping, found "5/s"`},
		{"replaces self", "domain: d\ndescriptors:\n  - key: key1\n    rate_limit:\n      name: self\n      replaces:\n        - name: self\n      unit: second\n      requests_per_unit: 5\n",
			`limits: f.yaml:7: rate_limit "self" lists itself in replaces; remove that entry`},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: key1\n    rate_limit:\n      name: self\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n",
			`limits: f.yaml:7: a replaces entry has no name; write - name: <the name of the rate_limit to replace>`},
		{"replaces of bare names", "domain: d\ndescriptors:\n  - key: key1\n    rate_limit:\n      replaces: [other]\n      unit: second\n      requests_per_unit: 5\n",
			`limits: f.yaml:5: a replaces entry is a mapping: write - name: other`},
		{"replaces not a list", "domain: d\ndescriptors:\n  - key: key1\n    rate_limit:\n      replaces: other\n      unit: second\n      requests_per_unit: 5\n",
			`limits: f.yaml:5: replaces must be a list of - name: <rate_limit name>, found "other"`},
		{"replaces an unknown rule", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5, name: per_a}\n  - key: b\n    rate_limit:\n      replaces:\n        - name: per_a\n        - name: per_x\n      unit: second\n      requests_per_unit: 5\n",
			`limits: f.yaml:9: replaces names "per_x", but no rate_limit of domain "d" has that name; correct it, or give the rate_limit it means name: per_x`},
		{"quota_mode not a boolean", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: sometimes\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
			`limits: f.yaml:4: quota_mode must be true or false, found "sometimes"`},
		{"quota_mode quoted", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: \"true\"\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
			`limits: f.yaml:4: quota_mode must be true or false, found "true"`},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: files\n    value: files/a\n    share_threshold: true\n",
			`limits: f.yaml:5: share_threshold needs a wildcard value (one with a '*'), but this descriptor's value is "files/a"; remove share_threshold or use a wildcard value`},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: a\n    metadata: [1]\n",
			`limits: f.yaml:4: metadata must be a mapping, found a list`},
		{"alias cycle", "domain: d\ndescriptors: &a\n  - key: a\n    descriptors: *a\n",
			`limits: f.yaml:2: descriptors nest more than 64 levels deep; Envoy descriptors have far fewer entries (is an alias referring to itself?)`},
		{"alias bomb", aliasBomb(8),
			`limits: f.yaml: the file expands to too many YAML nodes through aliases; write it out without anchors and aliases`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("f.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("Parse = %v, nil; want error %q", c, tt.want)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("Parse error =\n%s\nwant\n%s", got, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "f.yaml" {
				t.Errorf("Parse error %#v is not an *Error for f.yaml", err)
			}
		})
	}
}

// aliasBomb returns a file whose descriptors expand to 10^levels nodes
// through aliases, though it is a few kilobytes long.
func aliasBomb(levels int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &l0\n")
	for i := range 10 {
		fmt.Fprintf(&b, "      - key: k%d\n", i)
	}
	for l := 1; l < levels; l++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n", l, l)
		for i := range 10 {
			fmt.Fprintf(&b, "      - {key: k%d, descriptors: *l%d}\n", i, l-1)
		}
	}
	return b.String()
}

// A load reports every problem it finds, in line order, up to ten.
func TestParseReportsManyProblems(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 12 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", i)
	}
	_, err := Parse("f.yaml", []byte(b.String()))
	if err == nil {
		t.Fatal("Parse accepted twelve bad units")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 11 {
		t.Fatalf("error has %d lines; want 10 problems and a summary:\n%s", len(lines), err)
	}
	for i, l := range lines[:10] {
		if want := fmt.Sprintf("limits: f.yaml:%d: unknown unit", 4+2*i); !strings.HasPrefix(l, want) {
			t.Errorf("line %d = %q; want it to start %q", i, l, want)
		}
	}
	if want := "limits: 2 more problems not shown; fix the ones above first"; lines[10] != want {
		t.Errorf("last line = %q; want %q", lines[10], want)
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != 4 {
		t.Errorf("errors.As found %v; want the first problem, on line 4", e)
	}
}

// Files envoyproxy/ratelimit accepts load the same here: values are the
// YAML text as written, booleans may be spelled as in YAML 1.1, units in
// any case, and anchors, aliases and merge keys work.
func TestParseAccepts(t *testing.T) {
	c := mustParse(t, `
domain: 42
descriptors:
  - key: code
    value: 404
    shadow_mode: yes
    rate_limit: &base
      unit: SECOND
      requests_per_unit: 1_000
  - key: on
    value: off
    quota_mode: on
    detailed_metric: false
    value_to_metric: true
    rate_limit:
      <<: *base
      requests_per_unit: 0x10
  - key: empty
    value: ""
    rate_limit: {unlimited: true, requests_per_unit: 0}
  - key: nested
    descriptors:
  - key: meta
    metadata:
      date: 2001-12-14
      n: 3
      list: [a, yes]
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	if got := c.Domains(); len(got) != 1 || got[0] != "42" {
		t.Fatalf("Domains = %v; want [42]", got)
	}
	runLookups(t, c, []lookupCase{
		{"42", d("code=404"), "1000/second shadow"},
		{"42", d("on=off"), "16/second"},
		{"42", d("empty=anything"), "unlimited"},
		{"42", d("nested=x"), "none"},
	})
	r, _ := c.Lookup("42", d("on=off"))
	if !r.QuotaMode || r.DetailedMetric {
		t.Errorf("on=off rule: quota_mode %v, detailed_metric %v; want true, false", r.QuotaMode, r.DetailedMetric)
	}
	r, _ = c.Lookup("42", d("meta=x"))
	f := r.Metadata.GetFields()
	if f["date"].GetStringValue() != "2001-12-14" || f["n"].GetNumberValue() != 3 ||
		!f["list"].GetListValue().GetValues()[1].GetBoolValue() {
		t.Errorf("Metadata = %v; want date as text, n a number, yes a boolean", r.Metadata)
	}
}

// Rule.Line points at the descriptor, and Version identifies the input.
func TestVersion(t *testing.T) {
	a := mustParse(t, "domain: a\n")
	b := mustParse(t, "domain: a\n")
	c := mustParse(t, "domain: a\ndescriptors: []\n")
	if a.Version() != b.Version() || a.Version() == c.Version() || len(a.Version()) != 16 {
		t.Errorf("versions %q %q %q; want the first two equal, the third different, 16 hex digits", a.Version(), b.Version(), c.Version())
	}
}

// Merge keys take a list of mappings too; the first mapping to set a field
// wins, and the mapping's own fields win over all of them.
func TestParseMergeList(t *testing.T) {
	c := mustParse(t, `
domain: m
descriptors:
  - key: a
    rate_limit: &unit {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: &count {unit: hour, requests_per_unit: 7}
  - key: c
    rate_limit:
      <<: [*unit, *count]
  - key: d
    rate_limit:
      <<: [*count, *unit]
      unit: day
`)
	runLookups(t, c, []lookupCase{
		{"m", d("c=x"), "1/minute"},
		{"m", d("d=x"), "7/day"},
	})
	_, err := Parse("f.yaml", []byte("domain: m\ndescriptors:\n  - key: a\n    rate_limit:\n      <<: [5]\n      unit: day\n      requests_per_unit: 1\n"))
	if want := "limits: f.yaml:5: a merge key (<<) needs a mapping or a list of mappings, found \"5\""; err == nil || err.Error() != want {
		t.Errorf("Parse = %v; want %s", err, want)
	}
}

// TestParseUsage checks the usage field (a Sluice extension): it marks its
// descriptor's rule, and needs one.
func TestParseUsage(t *testing.T) {
	c := mustParse(t, `
domain: ai
descriptors:
  - key: user
    usage: true
    rate_limit: {unit: minute, requests_per_unit: 100000}
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 5000}
`)
	for _, tc := range []struct {
		entries []Entry
		want    bool
	}{
		{d("user=u1"), true},
		{d("user=u1", "model=m"), false}, // usage is per descriptor, not inherited
	} {
		r, ok := c.Lookup("ai", tc.entries)
		if !ok || r.Usage != tc.want {
			t.Errorf("Lookup(ai, %v) = %+v, %v; want a rule with Usage %v", tc.entries, r, ok, tc.want)
		}
	}
	_, err := Parse("f.yaml", []byte(`
domain: ai
descriptors:
  - key: user
    usage: true
`))
	if err == nil || !strings.Contains(err.Error(), "f.yaml:5: usage applies to the descriptor's own rate_limit, and this descriptor has none") {
		t.Errorf("Parse(usage without rate_limit) = %v; want an error that says usage needs the descriptor's rate_limit", err)
	}
}

// TestParseLease checks the lease field (a Sluice extension): it marks its
// descriptor's rule, needs one, and does not go with usage.
func TestParseLease(t *testing.T) {
	c := mustParse(t, `
domain: api
descriptors:
  - key: tenant
    lease: true
    rate_limit: {unit: second, requests_per_unit: 10000}
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 50}
`)
	if r, ok := c.Lookup("api", d("tenant=acme")); !ok || !r.Lease {
		t.Errorf("Lookup(tenant) = %+v, %v; want a rule with Lease", r, ok)
	}
	if r, ok := c.Lookup("api", d("tenant=acme", "user=u1")); !ok || r.Lease {
		t.Errorf("Lookup(tenant, user) = %+v, %v; want a rule without Lease (not inherited)", r, ok)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"without rate_limit", "domain: api\ndescriptors:\n  - key: tenant\n    lease: true\n", "f.yaml:4: lease applies to the descriptor's own rate_limit"},
		{"with usage", "domain: api\ndescriptors:\n  - key: tenant\n    lease: true\n    usage: true\n    rate_limit: {unit: second, requests_per_unit: 5}\n", "f.yaml:4: lease and usage do not go together"},
	} {
		if _, err := Parse("f.yaml", []byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(lease %s) = %v; want an error with %q", tc.name, err, tc.want)
		}
	}
}
