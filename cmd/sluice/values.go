package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// enumValue is a string flag that takes one of a few words.
type enumValue struct {
	p       *string
	allowed []string
}

func newEnumValue(p *string, def string, allowed ...string) *enumValue {
	*p = def
	return &enumValue{p: p, allowed: allowed}
}

func (e *enumValue) Set(s string) error {
	if !slices.Contains(e.allowed, s) {
		return fmt.Errorf("want %s", orList(e.allowed))
	}
	*e.p = s
	return nil
}

func (e *enumValue) String() string { return *e.p }
func (e *enumValue) Type() string   { return strings.Join(e.allowed, "|") }

// orList joins words as "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// durationValue is a duration flag that also takes whole days: "7d",
// "1d12h", besides everything time.ParseDuration takes.
type durationValue struct{ p *time.Duration }

func newDurationValue(p *time.Duration, def time.Duration) *durationValue {
	*p = def
	return &durationValue{p: p}
}

func (d *durationValue) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d.p = v
	return nil
}

func (d *durationValue) String() string { return d.p.String() }
func (d *durationValue) Type() string   { return "duration" }

// maxDays is the most whole days a time.Duration holds.
const maxDays = int64(1<<63-1) / int64(24*time.Hour)

// parseDuration parses a Go duration ("90s", "1h30m") optionally led by a
// number of days ("7d", "1d12h").
func parseDuration(s string) (time.Duration, error) {
	if days, rest, ok := strings.Cut(s, "d"); ok {
		if n, err := strconv.ParseInt(days, 10, 64); err == nil {
			if n > maxDays || n < -maxDays {
				return 0, fmt.Errorf("duration %q is out of range", s)
			}
			d := time.Duration(n) * 24 * time.Hour
			if rest == "" {
				return d, nil
			}
			if strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
				return 0, fmt.Errorf("invalid duration %q", s)
			}
			r, err := time.ParseDuration(rest)
			if err != nil {
				return 0, fmt.Errorf("invalid duration %q: want for example 90s, 15m, 1h30m or 7d", s)
			}
			if n < 0 {
				r = -r
			}
			sum := d + r
			if (r > 0 && sum < d) || (r < 0 && sum > d) {
				return 0, fmt.Errorf("duration %q is out of range", s)
			}
			return sum, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want for example 90s, 15m, 1h30m or 7d", s)
	}
	return d, nil
}
