package limits

import (
	"strconv"
	"strings"
)

// Statistics keys.
//
// envoyproxy/ratelimit names each rule in its statistics (and in its
// /rlconfig dump) by the descriptors on the way to it: for each level, the
// descriptor's key, followed by "_" and its value when it has one, the
// levels joined by dots. Under domain messaging, the rule of
//
//	- key: message_type
//	  value: marketing
//	  descriptors:
//	    - key: to_number
//
// is "message_type_marketing.to_number" (Rule.StatKey), which ratelimit
// prefixes with the domain: "messaging.message_type_marketing.to_number".
//
// Two descriptor fields put the request's values into the key
// (Rule.RequestStatKey):
//
//   - detailed_metric on the rule's descriptor: every level shows the
//     request's value ("message_type_marketing.to_number_5551234"), except a
//     wildcard level with share_threshold, which shows its pattern;
//   - value_to_metric on a level without a value, or with a wildcard value
//     and no share_threshold: that level shows the request's value instead
//     of nothing, or of the pattern.

// statLevel is one level of a rule's statistics key.
type statLevel struct {
	key string
	// fixed is the level's value when it does not come from the request:
	// the descriptor's value or pattern, or "" for a key-only descriptor.
	fixed string
	// fromRequest says the level shows the request's value.
	fromRequest bool
	// shared says the level is a wildcard with share_threshold, whose
	// values share one counter and always show as the pattern.
	shared bool
}

// appendStatPart appends one level as key_value, or key when value is
// empty.
func appendStatPart(b []byte, key, value string) []byte {
	b = append(b, key...)
	if value != "" {
		b = append(b, '_')
		b = append(b, value...)
	}
	return b
}

// staticStatKey renders levels with their fixed values.
func staticStatKey(levels []statLevel) string {
	var b []byte
	for i, l := range levels {
		if i > 0 {
			b = append(b, '.')
		}
		b = appendStatPart(b, l.key, l.fixed)
	}
	return string(b)
}

// RequestStatKey returns the rule's statistics key for a request descriptor
// that matched it, entries as the request sent them: StatKey, unless
// detailed_metric or value_to_metric put request values in it (see
// StatKeyFromRequest).
func (r *Rule) RequestStatKey(entries []Entry) string {
	if r.statLevels == nil || len(entries) != len(r.statLevels) {
		return r.StatKey
	}
	return string(r.AppendRequestStatKey(nil, entries))
}

// AppendRequestStatKey appends RequestStatKey(entries) to b, so that a
// caller that only looks the key up need not allocate it.
func (r *Rule) AppendRequestStatKey(b []byte, entries []Entry) []byte {
	if r.statLevels == nil || len(entries) != len(r.statLevels) {
		return append(b, r.StatKey...)
	}
	for i, l := range r.statLevels {
		if i > 0 {
			b = append(b, '.')
		}
		v := l.fixed
		if l.fromRequest {
			v = entries[i].Value
		}
		b = appendStatPart(b, l.key, v)
	}
	return b
}

// StatKeyFromRequest reports whether RequestStatKey shows request values, so
// that the number of keys is the clients' to choose.
func (r *Rule) StatKeyFromRequest() bool { return r.statLevels != nil }

// Dump describes the rules in force as envoyproxy/ratelimit's /rlconfig
// endpoint does, one line per rule:
//
//	DOMAIN.STATKEY: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false
//
// (an unlimited rule shows unit=UNKNOWN requests_per_unit=0). Domains are
// sorted and each domain's rules are in file order; ratelimit's order is
// random. A nil Config dumps nothing.
func (c *Config) Dump() string {
	if c == nil {
		return ""
	}
	var b strings.Builder
	for _, name := range c.names {
		for _, r := range c.domains[name].rules {
			b.WriteString(name)
			b.WriteByte('.')
			b.WriteString(r.StatKey)
			b.WriteString(": unit=")
			b.WriteString(strings.ToUpper(r.Unit.String()))
			b.WriteString(" requests_per_unit=")
			b.WriteString(strconv.FormatInt(r.Limit, 10))
			b.WriteString(", shadow_mode: ")
			b.WriteString(strconv.FormatBool(r.ShadowMode))
			b.WriteString(", quota_mode: ")
			b.WriteString(strconv.FormatBool(r.QuotaMode))
			b.WriteByte('\n')
		}
	}
	return b.String()
}
