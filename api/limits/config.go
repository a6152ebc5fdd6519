package limits

import (
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// Entry is one key/value pair of a request descriptor, in the order Envoy
// sends them. Keys and values are compared byte for byte (case matters).
type Entry struct {
	Key   string
	Value string
}

// Rule is one rate_limit of a limits file: the limit that applies to the
// request descriptors that reach its descriptor. Rules belong to a Config
// and are shared by every request that matches them: treat them, and the
// slices and messages they point to, as read-only.
type Rule struct {
	// Name is rate_limit.name, the name other rules' replaces refer to; ""
	// when the rule has none.
	Name string
	// Limit is rate_limit.requests_per_unit: how many hits the window allows.
	// 0 blocks every request (envoyproxy/ratelimit users write it to block a
	// route). It is 0 for an unlimited rule.
	Limit int64
	// Unit is rate_limit.unit, or UnitUnknown for an unlimited rule.
	Unit Unit
	// Window is Unit.Duration(): the length of the window, 0 for an
	// unlimited rule. envoyproxy/ratelimit counts in fixed windows aligned
	// to the Unix epoch (a per-day limit resets at 00:00 UTC); Sluice's
	// algorithms use Window as the length of their sliding window.
	Window time.Duration
	// Unlimited is rate_limit.unlimited: the descriptor is known and always
	// allowed, and nothing is counted (envoyproxy/ratelimit answers OK with
	// limit_remaining set to the largest uint32).
	Unlimited bool
	// ShadowMode is the descriptor's shadow_mode: hits are counted and
	// reported, but the rule never denies a request.
	ShadowMode bool
	// Usage is the descriptor's usage (a Sluice extension): its hits are
	// usage already spent (tokens a response used, reported when it is
	// done), recorded even when they do not fit, so the key may go above
	// its limit and later requests wait until the window has room; a
	// request of 0 hits is over the limit while the key is at or above it
	// (see actor.Check.Usage and docs/envoy.md).
	Usage bool
	// Lease is the descriptor's lease (a Sluice extension): nodes that do
	// not own the key decide its hits from quota leases, slices of its
	// room that they hold, rather than forwarding each hit to its owner
	// (see docs/envoy.md, "Hot keys: quota leases").
	Lease bool
	// QuotaMode is the descriptor's quota_mode (an envoyproxy/ratelimit
	// extension): when the rule is over its limit it fails the request only
	// if every quota-mode rule of the request is over its limit.
	QuotaMode bool
	// DetailedMetric is the descriptor's detailed_metric: metrics for the
	// rule should carry the request's values, not only the configured ones.
	DetailedMetric bool
	// Replaces lists the names in rate_limit.replaces: when one request
	// matches this rule and a rule with one of these names, the named rule
	// is dropped for that request (see ApplyReplaces).
	Replaces []string
	// replacesAt is the line of each name of Replaces in File.
	replacesAt []int
	// Metadata is the descriptor's metadata, nil when it has none.
	// envoyproxy/ratelimit merges the metadata of the rules that allowed a
	// request into the response's dynamic metadata. Clone it before
	// modifying it.
	Metadata *structpb.Struct

	// Domain is the domain of the file the rule is in.
	Domain string
	// Path names the rule's descriptor for messages and logs, for example
	// "domain=messaging key=message_type value=marketing > key=to_number".
	// Keys and values longer than 128 bytes are shortened in it.
	Path string
	// File is the file the rule is in, as given to Parse or found by Load.
	File string
	// Line is the line of the rule's descriptor in File.
	Line int
	// StatKey names the rule in statistics and in /rlconfig as
	// envoyproxy/ratelimit does, without the domain: the descriptors from
	// the top of the domain to the rule, each as key_value or, without a
	// value, key, joined by dots ("message_type_marketing.to_number"). See
	// RequestStatKey for the key of one request.
	StatKey string

	// statLevels are the levels of the statistics key when some show the
	// request's values (detailed_metric, value_to_metric); nil otherwise.
	statLevels []statLevel
}

// Config is a parsed, checked set of limits files: one file per domain.
// It is immutable once built and safe for concurrent use. A nil *Config has
// no domains and matches nothing.
type Config struct {
	domains map[string]*domain
	names   []string // sorted
	files   []string // in load order
	version string
}

// domain is one domain's tree of descriptors: one file's, or, when domains
// may span files, several files'.
type domain struct {
	name  string
	file  string // the first file's
	line  int
	root  node
	rules []*Rule // in file order
	// top holds where each top-level descriptor was defined, to refuse one
	// that a second file of the domain repeats.
	top map[Entry]position
}

// position is a place in a limits file.
type position struct {
	file string
	line int
}

// node is one descriptor of the tree, or a domain's root. Its children are
// indexed three ways, in the order Lookup tries them.
type node struct {
	// exact holds the children that have a value, by key and value
	// (wildcard values included, so that a request value that is literally
	// the pattern matches it exactly, as in envoyproxy/ratelimit).
	exact map[Entry]*node
	// wild holds the children whose value has a '*', by key, in file order.
	wild map[string][]*wildcard
	// byKey holds the children that have no value: the default for a key.
	byKey map[string]*node

	rule        *Rule
	share       string // the value pattern, when share_threshold is set
	hasChildren bool
}

// wildcard is a value pattern split at its '*'s.
type wildcard struct {
	parts  []string // at least two
	minLen int      // the length of the literal parts together
	node   *node
}

// match reports whether v matches the pattern, each '*' standing for any
// run of bytes, the empty one included.
func (w *wildcard) match(v string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(v) < w.minLen || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, lit := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, lit)
		if i < 0 {
			return false
		}
		rest = rest[i+len(lit):]
	}
	return true
}

// child returns the child that entry e selects, and whether it was found
// through a wildcard.
func (n *node) child(e Entry) (*node, bool) {
	if next := n.exact[e]; next != nil {
		return next, false
	}
	for _, w := range n.wild[e.Key] {
		if w.match(e.Value) {
			return w.node, true
		}
	}
	return n.byKey[e.Key], false
}

// Lookup returns the rule for one request descriptor of domain: the rule of
// the descriptor that the descriptor's last entry reaches. It reports false
// when the domain is unknown, entries is empty, the walk stops before the
// last entry, or the descriptor reached has no rate_limit.
//
// At each level it tries, for the entry (key, value): the descriptor with
// exactly that key and value, then the wildcard values of that key in file
// order (the first that matches wins), then the key's descriptor without a
// value. It never backtracks: once a level picks a descriptor, a miss
// further down is a miss, even if another candidate at that level would
// have matched. Lookup does not allocate.
func (c *Config) Lookup(domain string, entries []Entry) (*Rule, bool) {
	r, _, ok := c.Match(domain, entries)
	return r, ok
}

// Match is Lookup that also returns the descriptor that identifies the
// counter: two requests of one domain whose keys are equal share a counter.
// key is entries itself (not a copy) unless a wildcard descriptor with
// share_threshold was matched; then it is a copy in which that entry's value
// is replaced by the pattern (for example "files/*"), so that every value
// the pattern matches shares one counter. Do not modify key.
func (c *Config) Match(domain string, entries []Entry) (rule *Rule, key []Entry, ok bool) {
	if c == nil || len(entries) == 0 {
		return nil, nil, false
	}
	d := c.domains[domain]
	if d == nil {
		return nil, nil, false
	}
	n := &d.root
	key = entries
	copied := false
	for i, e := range entries {
		next, viaWildcard := n.child(e)
		if next == nil {
			return nil, nil, false
		}
		if viaWildcard && next.share != "" {
			if !copied {
				key, copied = slices.Clone(entries), true
			}
			key[i].Value = next.share
		}
		if i == len(entries)-1 {
			if next.rule == nil {
				return nil, nil, false
			}
			return next.rule, key, true
		}
		if !next.hasChildren {
			return nil, nil, false
		}
		n = next
	}
	return nil, nil, false // not reached
}

// ApplyReplaces applies replaces across the rules matched by one request:
// rules[i] is the rule of the request's i-th descriptor, nil when none.
// Every rule whose Name appears in the Replaces of any rule of the request
// (unlimited ones included) is dropped, as envoyproxy/ratelimit does: the
// result has nil in its place. The input is not modified; when nothing is
// replaced, the input itself is returned.
func ApplyReplaces(rules []*Rule) []*Rule {
	var replaced map[string]bool
	for _, r := range rules {
		if r == nil {
			continue
		}
		for _, name := range r.Replaces {
			if replaced == nil {
				replaced = make(map[string]bool)
			}
			replaced[name] = true
		}
	}
	if replaced == nil {
		return rules
	}
	var out []*Rule
	for i, r := range rules {
		if r == nil || r.Name == "" || !replaced[r.Name] {
			continue
		}
		if out == nil {
			out = slices.Clone(rules)
		}
		out[i] = nil
	}
	if out == nil {
		return rules
	}
	return out
}

// Domains returns the domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.names)
}

// Rules returns the rules of domain in file order, or nil for an unknown
// domain. The slice is a copy; the rules are shared.
func (c *Config) Rules(domain string) []*Rule {
	if c == nil {
		return nil
	}
	d := c.domains[domain]
	if d == nil {
		return nil
	}
	return slices.Clone(d.rules)
}

// Files returns the files the Config was built from, in the order they were
// read (sorted by name for a directory).
func (c *Config) Files() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.files)
}

// Version returns a short hex digest of the files' names and contents, the
// same for the same input: a value to log and export, to tell which limits
// a node is running.
func (c *Config) Version() string {
	if c == nil {
		return ""
	}
	return c.version
}
