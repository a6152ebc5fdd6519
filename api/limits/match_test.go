package limits

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// d builds a request descriptor from "key=value" pairs ("key=" for an
// empty value).
func d(pairs ...string) []Entry {
	var es []Entry
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		es = append(es, Entry{Key: k, Value: v})
	}
	return es
}

// want describes the rule a lookup should find: "none", "unlimited", or
// "N/unit", with " shadow" appended for shadow mode.
func describeRule(r *Rule, ok bool) string {
	switch {
	case !ok:
		return "none"
	case r.Unlimited:
		return "unlimited"
	}
	s := fmt.Sprintf("%d/%s", r.Limit, r.Unit)
	if r.ShadowMode {
		s += " shadow"
	}
	return s
}

type lookupCase struct {
	domain string
	desc   []Entry
	want   string
}

func runLookups(t *testing.T, c *Config, cases []lookupCase) {
	t.Helper()
	for _, tc := range cases {
		r, ok := c.Lookup(tc.domain, tc.desc)
		if got := describeRule(r, ok); got != tc.want {
			t.Errorf("Lookup(%q, %v) = %s; want %s", tc.domain, tc.desc, got, tc.want)
		}
	}
}

// The examples of envoyproxy/ratelimit's README, "Configuration" section.
func TestLookupReadmeExamples(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		cases []lookupCase
	}{{
		name: "example 1: key and value",
		yaml: `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
		cases: []lookupCase{
			{"mongo_cps", d("database=users"), "500/second"},
			{"mongo_cps", d("database=default"), "500/second"},
			{"mongo_cps", d("database=other"), "none"},
			{"mongo_cps", d("database=Users"), "none"}, // case-sensitive
			{"mongo_cps", d("Database=users"), "none"},
			{"other_domain", d("database=users"), "none"},
			{"mongo_cps", nil, "none"},
		},
	}, {
		name: "example 2: nested descriptors and a key-only default",
		yaml: `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
		cases: []lookupCase{
			{"messaging", d("message_type=marketing", "to_number=2061111111"), "5/day"},
			{"messaging", d("message_type=marketing", "to_number=2062222222"), "5/day"},
			{"messaging", d("to_number=2061111111"), "100/day"},
			{"messaging", d("message_type=marketing"), "none"}, // a placeholder without a limit
			{"messaging", d("message_type=transactional", "to_number=2061111111"), "none"},
			{"messaging", d("to_number=2061111111", "message_type=marketing"), "none"}, // order matters
		},
	}, {
		name: "example 3: the value beats the key-only default",
		yaml: `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
		cases: []lookupCase{
			{"edge_proxy_per_ip", d("remote_address=50.0.0.1"), "10/second"},
			{"edge_proxy_per_ip", d("remote_address=50.0.0.5"), "0/second"},
			{"edge_proxy_per_ip", d("remote_address="), "10/second"},
		},
	}, {
		name: "example 4: a longer descriptor does not match a shallower rule",
		yaml: `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`,
		cases: []lookupCase{
			{"example4", d("key=value", "subkey=subvalue"), "none"},
			{"example4", d("key=value"), "300/second"},
		},
	}, {
		name: "example 4, nested",
		yaml: `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`,
		cases: []lookupCase{
			{"example4", d("key=value", "subkey=subvalue"), "300/second"},
			{"example4", d("key=value"), "none"},
			{"example4", d("key=value", "subkey=subvalue", "more=x"), "none"},
		},
	}, {
		name: "example 5: unlimited",
		yaml: `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
		cases: []lookupCase{
			{"internal", d("ldap=x"), "unlimited"},
			{"internal", d("azure=x"), "100/minute"},
			{"internal", d("gcp=x"), "none"},
		},
	}, {
		name: "example 6: shadow mode",
		yaml: `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
		cases: []lookupCase{
			{"example6", d("service=auth-service", "user=user-a"), "10/second shadow"},
			{"example6", d("service=auth-service", "user=user-b"), "20/second"},
			{"example6", d("service=auth-service", "user=user-c"), "none"},
		},
	}, {
		name: "example 9: wildcards anywhere in the value",
		yaml: `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 21
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 22
`,
		cases: []lookupCase{
			{"example9", d("key1=value1"), "20/minute"},
			{"example9", d("key1=valueXYZ"), "20/minute"},
			{"example9", d("key1=value"), "20/minute"}, // '*' matches nothing too
			{"example9", d("key1=valu"), "none"},
			{"example9", d("key1=xvalue1"), "none"},
			{"example9", d("path=/api/123/action"), "21/minute"},
			{"example9", d("path=/api/user-id/action"), "21/minute"},
			{"example9", d("path=/api//action"), "21/minute"},
			{"example9", d("path=/api/123/other"), "none"},
			{"example9", d("path=/api/action"), "none"}, // prefix and suffix may not overlap
			{"example9", d("route=/api/v1/resource/123/action"), "22/minute"},
			{"example9", d("route=/api/v2/resource/456/action"), "22/minute"},
			{"example9", d("route=/api/v1/resource/123"), "none"},
			{"example9", d("route=/api/v1/other/123/action"), "none"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runLookups(t, mustParse(t, tt.yaml), tt.cases)
		})
	}
}

// At one level, a descriptor with the exact value beats a wildcard, which
// beats the key-only default; among wildcards the first in the file wins.
func TestLookupPrecedence(t *testing.T) {
	c := mustParse(t, `
domain: p
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: fo*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: foo
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: f*
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: w
    value: a*
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: w
    value: a*b
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: any
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: any
    rate_limit: {unit: second, requests_per_unit: 8}
`)
	runLookups(t, c, []lookupCase{
		{"p", d("k=foo"), "1/second"}, // exact
		{"p", d("k=fob"), "2/second"}, // first wildcard in file order
		{"p", d("k=fxx"), "4/second"}, // the other wildcard
		{"p", d("k=bar"), "3/second"}, // default
		{"p", d("k="), "3/second"},    // an empty value falls to the default
		{"p", d("w=axb"), "5/second"}, // a* comes first, though a*b also matches
		{"p", d("w=a*b"), "6/second"}, // the pattern's own text matches it exactly
		{"p", d("any=x"), "7/second"}, // "*" beats the default
		{"p", d("any="), "7/second"},  // and matches the empty value
		{"p", d("other=x"), "none"},   // no descriptor for that key
		{"p", d("k=foo", "x=y"), "none"},
	})
}

// The walk never backtracks: once a level picks the exact descriptor, a
// miss below it is a miss, though the default at that level would have
// matched.
func TestLookupNoBacktracking(t *testing.T) {
	c := mustParse(t, `
domain: b
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: a
    value: leaf
    rate_limit: {unit: second, requests_per_unit: 3}
`)
	runLookups(t, c, []lookupCase{
		{"b", d("a=x", "b=1"), "1/second"},
		{"b", d("a=y", "c=1"), "2/second"},
		{"b", d("a=x", "c=1"), "none"},    // exact a=x picked; it has no c
		{"b", d("a=leaf", "c=1"), "none"}, // a=leaf has no children
	})
}

// A descriptor with both a rate_limit and nested descriptors applies its own
// limit to a request that ends there, and its children's to longer ones.
func TestLookupLimitAndChildren(t *testing.T) {
	c := mustParse(t, `
domain: n
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 10}
`)
	runLookups(t, c, []lookupCase{
		{"n", d("tenant=acme"), "1000/hour"},
		{"n", d("tenant=acme", "user=bob"), "10/minute"},
		{"n", d("tenant=acme", "user=bob", "x=y"), "none"},
	})
}

func TestRuleFields(t *testing.T) {
	c := mustParse(t, `domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        detailed_metric: true
        quota_mode: true
        rate_limit:
          name: marketing_per_number
          unit: Day
          requests_per_unit: 5
        metadata:
          team: growth
`)
	r, ok := c.Lookup("messaging", d("message_type=marketing", "to_number=1"))
	if !ok {
		t.Fatal("Lookup found no rule")
	}
	want := Rule{
		Name: "marketing_per_number", Limit: 5, Unit: UnitDay, Window: 24 * time.Hour,
		DetailedMetric: true, QuotaMode: true,
		Domain: "messaging", Path: "domain=messaging key=message_type value=marketing > key=to_number",
		File: "f.yaml", Line: 6, StatKey: "message_type_marketing.to_number",
	}
	got := *r
	if k := got.RequestStatKey(d("message_type=marketing", "to_number=1")); k != "message_type_marketing.to_number_1" {
		t.Errorf("RequestStatKey = %q; want the request's values (detailed_metric)", k)
	}
	got.statLevels = nil
	if got.Metadata.GetFields()["team"].GetStringValue() != "growth" {
		t.Errorf("Metadata = %v; want team: growth", got.Metadata)
	}
	got.Metadata = nil
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("rule = %+v\nwant   %+v", got, want)
	}
	if rules := c.Rules("messaging"); len(rules) != 1 || rules[0] != r {
		t.Errorf("Rules = %v; want the one rule", rules)
	}
}

func TestUnits(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name string
		unit Unit
		dur  time.Duration
	}{
		{"second", UnitSecond, time.Second},
		{"MINUTE", UnitMinute, time.Minute},
		{"Hour", UnitHour, time.Hour},
		{"day", UnitDay, day},
		{"week", UnitWeek, 7 * day},
		{"month", UnitMonth, 30 * day},
		{"year", UnitYear, 365 * day},
	} {
		c := mustParse(t, "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+tc.name+", requests_per_unit: 1}\n")
		r, ok := c.Lookup("u", d("k=v"))
		if !ok || r.Unit != tc.unit || r.Window != tc.dur || r.Unit.Duration() != tc.dur {
			t.Errorf("unit %s: got %v, window %v; want %v, %v", tc.name, r.Unit, r.Window, tc.unit, tc.dur)
		}
		if r.Unit.String() != strings.ToLower(tc.name) {
			t.Errorf("Unit(%d).String() = %q; want %q", r.Unit, r.Unit.String(), strings.ToLower(tc.name))
		}
	}
	if UnitUnknown.Duration() != 0 || UnitUnknown.String() != "unknown" {
		t.Errorf("UnitUnknown = %q, %v; want unknown, 0", UnitUnknown, UnitUnknown.Duration())
	}
}

// With share_threshold, every value a wildcard matches shares one counter;
// without it, each value has its own.
func TestMatchShareThreshold(t *testing.T) {
	c := mustParse(t, `
domain: s
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 60}
`)
	tests := []struct {
		desc    []Entry
		wantKey []Entry
	}{
		{d("files=files/a.pdf"), d("files=files/*")},
		{d("files=files/b.csv"), d("files=files/*")},
		{d("files_no_share=files_no_share/a.pdf"), d("files_no_share=files_no_share/a.pdf")},
		{d("file=test1"), d("file=test1")}, // the exact value beats the shared wildcard
		{d("file=test2"), d("file=test*")},
		{d("tenant=t1prod", "user=bob"), d("tenant=t*prod", "user=bob")},
	}
	for _, tc := range tests {
		in := slices.Clone(tc.desc)
		_, key, ok := c.Match("s", tc.desc)
		if !ok || !slices.Equal(key, tc.wantKey) {
			t.Errorf("Match(%v) key = %v, %v; want %v", tc.desc, key, ok, tc.wantKey)
		}
		if !slices.Equal(tc.desc, in) {
			t.Errorf("Match(%v) modified its input", in)
		}
	}
}

// Example 7 of the README: a rule that replaces another drops it from the
// request, and only from requests that match both.
func TestApplyReplaces(t *testing.T) {
	c := mustParse(t, `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`)
	r1, _ := c.Lookup("example7", d("key_1=value_1", "user=bkthomps"))
	r2, _ := c.Lookup("example7", d("key_2=value_2", "user=bkthomps"))
	if r1 == nil || r2 == nil || !slices.Equal(r2.Replaces, []string{"specific_limit"}) {
		t.Fatalf("rules = %+v, %+v; want both, the second replacing specific_limit", r1, r2)
	}
	tests := []struct {
		in, want []*Rule
	}{
		{[]*Rule{r1}, []*Rule{r1}},
		{[]*Rule{r2}, []*Rule{r2}},
		{[]*Rule{r1, r2}, []*Rule{nil, r2}},
		{[]*Rule{r2, nil, r1}, []*Rule{r2, nil, nil}},
		{nil, nil},
	}
	for _, tc := range tests {
		in := slices.Clone(tc.in)
		if got := ApplyReplaces(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("ApplyReplaces(%v) = %v; want %v", tc.in, got, tc.want)
		}
		if !slices.Equal(tc.in, in) {
			t.Errorf("ApplyReplaces modified its input")
		}
	}
}

func TestNilConfig(t *testing.T) {
	var c *Config
	if r, ok := c.Lookup("d", d("k=v")); ok || r != nil {
		t.Errorf("nil Config Lookup = %v, %v; want nil, false", r, ok)
	}
	if c.Domains() != nil || c.Rules("d") != nil || c.Files() != nil || c.Version() != "" {
		t.Error("nil Config is not empty")
	}
}

// Lookup is on every request's path: it must not allocate.
func TestLookupDoesNotAllocate(t *testing.T) {
	c := mustParse(t, `
domain: a
descriptors:
  - key: k
    value: v*
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	desc := d("k=value", "user=bob")
	if n := testing.AllocsPerRun(100, func() { c.Lookup("a", desc) }); n != 0 {
		t.Errorf("Lookup allocates %v times; want 0", n)
	}
}

func BenchmarkLookup(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("domain: bench\ndescriptors:\n")
	for i := range 1000 {
		fmt.Fprintf(&sb, "  - key: route\n    value: /r/%d\n    descriptors:\n      - key: remote_address\n        rate_limit: {unit: second, requests_per_unit: 10}\n", i)
	}
	sb.WriteString("  - key: route\n    value: /w/*\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	c := mustParse(b, sb.String())
	desc := d("route=/r/500", "remote_address=10.0.0.1")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.Lookup("bench", desc); !ok {
			b.Fatal("no rule")
		}
	}
}

// Unit's numbers are those of Envoy's enum, so that the RLS adapter can
// convert with a cast.
func TestUnitMatchesEnvoyEnum(t *testing.T) {
	for _, u := range []Unit{UnitUnknown, UnitSecond, UnitMinute, UnitHour, UnitDay, UnitWeek, UnitMonth, UnitYear} {
		e := rlspb.RateLimitResponse_RateLimit_Unit(u)
		if got, want := e.String(), strings.ToUpper(u.String()); got != want {
			t.Errorf("Unit %d is %s in Envoy's enum; want %s", u, got, want)
		}
	}
}
