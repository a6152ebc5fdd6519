package api

import (
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/actor"
)

// Override replaces the limit, window or algorithm of the keys it matches,
// whatever their checks or the limits file say.
type Override struct {
	// Key is the key, or with Prefix the start of the keys, it applies to.
	Key string
	// Prefix makes the override apply to every key that starts with Key.
	Prefix bool
	// Limit replaces the check's limit; 0 keeps it.
	Limit int64
	// Window replaces the check's window; 0 keeps it.
	Window time.Duration
	// Algorithm replaces the check's algorithm when HasAlgorithm is set.
	Algorithm    actor.Algorithm
	HasAlgorithm bool
	// ExpiresAt is when the override stops applying; zero means never.
	ExpiresAt time.Time
	// Note is free text for people.
	Note string
	// SetAt is when the override was last set.
	SetAt time.Time
}

// apply changes c as the override says.
func (o *Override) apply(c *actor.Check) {
	if o.Limit > 0 {
		c.Limit = o.Limit
	}
	if o.Window > 0 {
		c.Window = o.Window
	}
	if o.HasAlgorithm {
		c.Algorithm = o.Algorithm
	}
}

// overrideSet is an immutable snapshot of the overrides.
type overrideSet struct {
	exact    map[string]*Override
	prefixes []*Override // longest first
}

// overrideTable holds the overrides. Readers load the current snapshot
// without locks; writers (admin calls, rare) build a new one under mu,
// after saving the change to the data file (see overrides_store.go). With
// durability "memory" the table is the only copy and a restart forgets it.
type overrideTable struct {
	mu  sync.Mutex
	cur atomic.Pointer[overrideSet]
}

func newOverrideTable(list []*Override) *overrideTable {
	t := &overrideTable{}
	t.cur.Store(buildOverrideSet(list))
	return t
}

func buildOverrideSet(list []*Override) *overrideSet {
	s := &overrideSet{exact: make(map[string]*Override)}
	for _, o := range list {
		if o.Prefix {
			s.prefixes = append(s.prefixes, o)
		} else {
			s.exact[o.Key] = o
		}
	}
	sort.SliceStable(s.prefixes, func(i, j int) bool { return len(s.prefixes[i].Key) > len(s.prefixes[j].Key) })
	return s
}

// match returns the override that applies to key at now, or nil: an exact
// override beats any prefix override; the longest prefix wins.
func (t *overrideTable) match(key string, now time.Time) *Override {
	s := t.cur.Load()
	if len(s.exact) == 0 && len(s.prefixes) == 0 {
		return nil
	}
	if o := s.exact[key]; o != nil && live(o, now) {
		return o
	}
	for _, o := range s.prefixes {
		if strings.HasPrefix(key, o.Key) && live(o, now) {
			return o
		}
	}
	return nil
}

func live(o *Override, now time.Time) bool { return o.ExpiresAt.IsZero() || now.Before(o.ExpiresAt) }

// list returns every override, expired or not, in key order, exact before
// prefix.
func (t *overrideTable) list() []*Override {
	s := t.cur.Load()
	out := make([]*Override, 0, len(s.exact)+len(s.prefixes))
	for _, o := range s.exact {
		out = append(out, o)
	}
	out = append(out, s.prefixes...)
	sort.Slice(out, func(i, j int) bool { return overrideLess(out[i].Key, out[i].Prefix, out[j].Key, out[j].Prefix) })
	return out
}

// overrideLess orders overrides by key, the exact-key override before the
// prefix override of the same key.
func overrideLess(k1 string, p1 bool, k2 string, p2 bool) bool {
	if k1 != k2 {
		return k1 < k2
	}
	return !p1 && p2
}

// set adds or replaces o (same key and prefix flag), and drops the
// overrides expired at now. save, when not nil, runs first, under the
// writers' lock so that saves and snapshots happen in the same order; if it
// fails the table is unchanged.
func (t *overrideTable) set(o *Override, now time.Time, save func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if save != nil {
		if err := save(); err != nil {
			return err
		}
	}
	kept := t.without(o.Key, o.Prefix, now)
	t.cur.Store(buildOverrideSet(append(kept, o)))
	return nil
}

// remove deletes the override with key and prefix flag, drops the overrides
// expired at now, and reports whether that override existed and was still
// live. save, when not nil, runs first, as in set.
func (t *overrideTable) remove(key string, prefix bool, now time.Time, save func() error) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if save != nil {
		if err := save(); err != nil {
			return false, err
		}
	}
	existed := false
	for _, x := range t.list() {
		if x.Key == key && x.Prefix == prefix && live(x, now) {
			existed = true
		}
	}
	t.cur.Store(buildOverrideSet(t.without(key, prefix, now)))
	return existed, nil
}

// without returns the live overrides other than the one with key and
// prefix flag. t.mu must be held.
func (t *overrideTable) without(key string, prefix bool, now time.Time) []*Override {
	list := t.list()
	kept := list[:0]
	for _, x := range list {
		if (x.Key != key || x.Prefix != prefix) && live(x, now) {
			kept = append(kept, x)
		}
	}
	return kept
}
