package limits

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// field is one name: value pair of a mapping.
type field struct {
	name string
	key  *yaml.Node // the name's node, for the line of messages about it
	val  *yaml.Node // the value, aliases followed
}

// level is a kind of mapping in a limits file and the fields it takes.
// envoyproxy/ratelimit checks field names against one list for the whole
// file; we check each mapping against its own, so that a field in the
// wrong place (shadow_mode inside rate_limit, say, which ratelimit would
// silently ignore) is an error.
type level struct {
	what  string
	known []string
}

var (
	topLevel = level{"the top of the file", []string{"domain", "descriptors"}}

	descriptorLevel = level{"a descriptor", []string{
		"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "metadata",
		"usage", "lease",
	}}

	rateLimitLevel = level{"rate_limit", []string{"unit", "requests_per_unit", "unlimited", "name", "replaces"}}

	replacesLevel = level{"a replaces entry", []string{"name"}}
)

// fieldSet is the fields of one mapping by name.
type fieldSet struct {
	m map[string]field
	// unknown is set when the mapping has a field it does not take. A
	// field that seems missing may then be one misspelled, already
	// reported: callers do not report missing fields.
	unknown bool
}

func (fs *fieldSet) get(name string) (field, bool) {
	f, ok := fs.m[name]
	return f, ok
}

// fields returns the fields of mapping m by name, with merge keys (<<)
// applied, reporting unknown and repeated names. It reports false only
// when m is not a mapping.
func (p *parser) fields(m *yaml.Node, l *level) (*fieldSet, bool) {
	if m.Kind != yaml.MappingNode {
		p.errorf(m, "%s must be a mapping, found %s", l.what, describe(m))
		return nil, false
	}
	own, merged := p.pairs(m)
	fs := &fieldSet{m: make(map[string]field, len(own))}
	out := fs.m
	add := func(kv [2]*yaml.Node, isMerged bool) {
		k := p.deref(kv[0])
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, "a field name in %s must be a word, found %s", l.what, describe(k))
			fs.unknown = true
			return
		}
		name := k.Value
		if !slices.Contains(l.known, name) {
			p.errorf(k, "unknown field %q in %s; %s", clip(name), l.what, hint(l, name))
			fs.unknown = true
			return
		}
		if prev, dup := out[name]; dup {
			if !isMerged {
				p.errorf(k, "field %q is set twice in %s (also on line %d); keep one", name, l.what, prev.key.Line)
			}
			return // a merged field never overrides one already set
		}
		out[name] = field{name: name, key: k, val: p.deref(kv[1])}
	}
	for _, kv := range own {
		add(kv, false)
	}
	for _, kv := range merged {
		add(kv, true)
	}
	return fs, true
}

// pairs returns a mapping's own key/value pairs and, separately, those its
// merge keys bring in, in order.
func (p *parser) pairs(m *yaml.Node) (own, merged [][2]*yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		p.spend()
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merged = append(merged, p.mergeSource(v)...)
			continue
		}
		own = append(own, [2]*yaml.Node{k, v})
	}
	return own, merged
}

// mergeSource returns the pairs a merge key's value brings in.
func (p *parser) mergeSource(v *yaml.Node) [][2]*yaml.Node {
	v = p.deref(v)
	var maps []*yaml.Node
	switch v.Kind {
	case yaml.MappingNode:
		maps = []*yaml.Node{v}
	case yaml.SequenceNode:
		for _, item := range v.Content {
			p.spend()
			maps = append(maps, p.deref(item))
		}
	default:
		p.errorf(v, "a merge key (<<) needs a mapping or a list of mappings, found %s", describe(v))
		return nil
	}
	var out [][2]*yaml.Node
	for _, m := range maps {
		if m.Kind != yaml.MappingNode {
			p.errorf(m, "a merge key (<<) needs a mapping or a list of mappings, found %s", describe(m))
			continue
		}
		own, merged := p.pairs(m)
		out = append(append(out, own...), merged...)
	}
	return out
}

// hint says what to do about an unknown field name in l.
func hint(l *level, name string) string {
	inRateLimit := slices.Contains(rateLimitLevel.known, name)
	inDescriptor := slices.Contains(descriptorLevel.known, name)
	switch {
	case l == &descriptorLevel && inRateLimit:
		return name + " belongs inside rate_limit"
	case l == &rateLimitLevel && inDescriptor:
		return name + " belongs on the descriptor, next to rate_limit, not inside it"
	case l == &topLevel && inRateLimit:
		return name + " belongs inside the rate_limit of a descriptor, in the descriptors list"
	case l == &topLevel && inDescriptor:
		return name + " belongs on a descriptor, in the descriptors list"
	case name == "domain":
		return "domain belongs at the top of the file"
	}
	if s := closest(l.known, name); s != "" {
		return fmt.Sprintf("did you mean %q?", s)
	}
	return fmt.Sprintf("%s takes only %s", l.what, strings.Join(l.known, ", "))
}

// closest returns the known name that name is most likely a misspelling
// of, or "".
func closest(known []string, name string) string {
	norm := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '_' || r == '-' || r == ' ' {
				return -1
			}
			return r
		}, strings.ToLower(s))
	}
	n := norm(name)
	best, bestDist := "", 3 // at most two edits away
	for _, k := range known {
		if d := editDistance(n, norm(k)); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return len(a) + len(b) // not worth comparing
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
