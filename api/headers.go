package api

import (
	"fmt"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// HeaderFormat is a set of rate limit header fields that Envoy responses
// ask Envoy to add to the client's response (Config.RateLimitHeaders).
type HeaderFormat string

const (
	// HeadersIETF is the current draft of the IETF's RateLimit header
	// fields for HTTP (draft 09 and later): RateLimit-Policy and RateLimit,
	// and Retry-After when waiting helps.
	HeadersIETF HeaderFormat = "ietf"
	// HeadersDraft03 is the three fields of the draft's version 03, as
	// envoyproxy/ratelimit writes them with LIMIT_RESPONSE_HEADERS_ENABLED:
	// the limit, the hits remaining and the seconds until reset, under the
	// names of HeaderNames.
	HeadersDraft03 HeaderFormat = "draft03"
)

// ParseHeaderFormat returns the format named s ("" is HeadersIETF).
func ParseHeaderFormat(s string) (HeaderFormat, error) {
	switch f := HeaderFormat(s); f {
	case "", HeadersIETF:
		return HeadersIETF, nil
	case HeadersDraft03:
		return f, nil
	}
	return "", fmt.Errorf("api: header format %q: want ietf or draft03", s)
}

// HeaderNames names the fields of HeadersDraft03, as envoyproxy/ratelimit's
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER do.
type HeaderNames struct {
	// Limit carries the limit. Default "RateLimit-Limit".
	Limit string
	// Remaining carries the hits of cost 1 still allowed. Default
	// "RateLimit-Remaining".
	Remaining string
	// Reset carries the seconds until the limit is whole again, or, over
	// the limit, until a retry can succeed. Default "RateLimit-Reset".
	Reset string
}

// Default names of the HeadersDraft03 fields, envoyproxy/ratelimit's.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// withDefaults fills in the empty names.
func (n HeaderNames) withDefaults() HeaderNames {
	if n.Limit == "" {
		n.Limit = DefaultLimitHeader
	}
	if n.Remaining == "" {
		n.Remaining = DefaultRemainingHeader
	}
	if n.Reset == "" {
		n.Reset = DefaultResetHeader
	}
	return n
}

// draft03Headers returns the three fields of HeadersDraft03 for the
// outcome o, the most restrictive descriptor (see rateLimitHeaders).
func draft03Headers(names HeaderNames, o *envoyOutcome) []*corev3.HeaderValue {
	return []*corev3.HeaderValue{
		{Key: names.Limit, Value: strconv.FormatInt(o.d.limit, 10)},
		{Key: names.Remaining, Value: strconv.FormatInt(max(o.remaining, 0), 10)},
		{Key: names.Reset, Value: strconv.FormatInt(ceilSeconds(o.wait()), 10)},
	}
}
