package limits

import (
	"strings"
	"time"
)

// Unit is the time unit of a rule's rate_limit. Its numbers are those of
// Envoy's envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit enum,
// so converting between the two is a plain cast in either direction.
type Unit int32

// The units a limits file may name, case-insensitively, in rate_limit.unit.
// They are the units envoyproxy/ratelimit accepts (its README documents only
// second to day, but its parser takes every name of the Envoy enum).
const (
	// UnitUnknown is the unit of an unlimited rule, which has none.
	UnitUnknown Unit = 0
	// UnitSecond is one second.
	UnitSecond Unit = 1
	// UnitMinute is 60 seconds.
	UnitMinute Unit = 2
	// UnitHour is 3600 seconds.
	UnitHour Unit = 3
	// UnitDay is 24 hours.
	UnitDay Unit = 4
	// UnitMonth is 30 days, as envoyproxy/ratelimit counts it.
	UnitMonth Unit = 5
	// UnitYear is 365 days, as envoyproxy/ratelimit counts it (leap days are
	// ignored).
	UnitYear Unit = 6
	// UnitWeek is 7 days.
	UnitWeek Unit = 7
)

// unitNames lists the units in the order messages name them.
var unitNames = []struct {
	name string
	unit Unit
}{
	{"second", UnitSecond},
	{"minute", UnitMinute},
	{"hour", UnitHour},
	{"day", UnitDay},
	{"week", UnitWeek},
	{"month", UnitMonth},
	{"year", UnitYear},
}

// unitChoices is the list of valid names for error messages.
const unitChoices = "second, minute, hour, day, week, month or year"

// parseUnit returns the unit named s, ignoring case, as envoyproxy/ratelimit
// does. "unknown" is not a unit a file may name.
func parseUnit(s string) (Unit, bool) {
	for _, u := range unitNames {
		if strings.EqualFold(s, u.name) {
			return u.unit, true
		}
	}
	return UnitUnknown, false
}

// String returns the unit's lowercase name as a limits file spells it, or
// "unknown".
func (u Unit) String() string {
	for _, n := range unitNames {
		if n.unit == u {
			return n.name
		}
	}
	return "unknown"
}

// Duration returns the unit's length: a second, minute, hour, day, week, 30
// days for a month and 365 days for a year, the same fixed lengths
// envoyproxy/ratelimit uses. It returns 0 for UnitUnknown and any number
// that is not a unit.
func (u Unit) Duration() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case UnitSecond:
		return time.Second
	case UnitMinute:
		return time.Minute
	case UnitHour:
		return time.Hour
	case UnitDay:
		return day
	case UnitWeek:
		return 7 * day
	case UnitMonth:
		return 30 * day
	case UnitYear:
		return 365 * day
	}
	return 0
}
