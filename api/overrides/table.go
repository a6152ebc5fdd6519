package overrides

import (
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/persist"
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

// Apply changes c as the override says.
func (o *Override) Apply(c *actor.Check) {
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

// Config configures a Table.
type Config struct {
	// Store keeps the overrides (meta bucket "overrides", see store.go);
	// nil keeps them in memory only (durability "memory").
	Store *persist.Store
	// Peers reaches the other members of a cluster, to which Replicate
	// copies each change and from which Sync copies theirs; nil for a
	// single node.
	Peers Peers
	// Logger receives the table's logs; nil discards them.
	Logger *slog.Logger
}

// Table holds the overrides. Readers load the current snapshot without
// locks; writers (admin calls, rare) build a new one under mu, after
// saving the change to the data file (see store.go). With durability
// "memory" the table is the only copy and a restart forgets it.
type Table struct {
	store *persist.Store
	peers Peers
	log   *slog.Logger
	mu    sync.Mutex
	cur   atomic.Pointer[overrideSet]
}

// Open returns the table of the overrides kept in cfg.Store (none without
// one). A record it cannot decode is an error naming it: the node does not
// start rather than drop an override silently.
func Open(cfg Config) (*Table, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Table{store: cfg.Store, peers: cfg.Peers, log: cfg.Logger}
	var list []*Override
	if t.store != nil {
		var err error
		if list, err = load(t.store); err != nil {
			return nil, err
		}
	}
	t.cur.Store(buildOverrideSet(list))
	return t, nil
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

// Match returns the override that applies to key at now, or nil: an exact
// override beats any prefix override; the longest prefix wins.
func (t *Table) Match(key string, now time.Time) *Override {
	s := t.cur.Load()
	if len(s.exact) == 0 && len(s.prefixes) == 0 {
		return nil
	}
	if o := s.exact[key]; o != nil && o.Live(now) {
		return o
	}
	for _, o := range s.prefixes {
		if strings.HasPrefix(key, o.Key) && o.Live(now) {
			return o
		}
	}
	return nil
}

// Live reports whether o applies at now: it has not expired.
func (o *Override) Live(now time.Time) bool { return o.ExpiresAt.IsZero() || now.Before(o.ExpiresAt) }

// List returns every override, expired or not, in key order, exact before
// prefix (see Less).
func (t *Table) List() []*Override {
	s := t.cur.Load()
	out := make([]*Override, 0, len(s.exact)+len(s.prefixes))
	for _, o := range s.exact {
		out = append(out, o)
	}
	out = append(out, s.prefixes...)
	sort.Slice(out, func(i, j int) bool { return Less(out[i].Key, out[i].Prefix, out[j].Key, out[j].Prefix) })
	return out
}

// Less orders overrides by key, the exact-key override before the prefix
// override of the same key.
func Less(k1 string, p1 bool, k2 string, p2 bool) bool {
	if k1 != k2 {
		return k1 < k2
	}
	return !p1 && p2
}

// Set adds or replaces o (same key and prefix flag), and drops the
// overrides expired at now. It writes o to the data file (and syncs it)
// first, whatever the durability mode, deleting the expired ones from it,
// under the writers' lock so that saves and snapshots happen in the same
// order; if that fails the table is unchanged. Set does not copy o to
// the other members: see Replicate.
func (t *Table) Set(o *Override, now time.Time) error {
	var value []byte
	if t.store != nil {
		var err error
		if value, err = encode(o); err != nil {
			return err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.store != nil {
		// Expired ones first: the one replaced may be one of them.
		t.deleteExpired(now)
		if err := t.store.PutMeta(bucket, RecordKey(o.Key, o.Prefix), value); err != nil {
			return err
		}
	}
	kept := t.without(o.Key, o.Prefix, now)
	t.cur.Store(buildOverrideSet(append(kept, o)))
	return nil
}

// Delete deletes the override with key and prefix flag, drops the
// overrides expired at now, and reports whether that override existed and
// was still live. It deletes it from the data file first, as Set writes.
func (t *Table) Delete(key string, prefix bool, now time.Time) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.store != nil {
		t.deleteExpired(now)
		if _, err := t.store.DeleteMeta(bucket, RecordKey(key, prefix)); err != nil {
			return false, err
		}
	}
	existed := false
	for _, x := range t.List() {
		if x.Key == key && x.Prefix == prefix && x.Live(now) {
			existed = true
		}
	}
	t.cur.Store(buildOverrideSet(t.without(key, prefix, now)))
	return existed, nil
}

// without returns the live overrides other than the one with key and
// prefix flag. t.mu must be held.
func (t *Table) without(key string, prefix bool, now time.Time) []*Override {
	list := t.List()
	kept := list[:0]
	for _, x := range list {
		if (x.Key != key || x.Prefix != prefix) && x.Live(now) {
			kept = append(kept, x)
		}
	}
	return kept
}

// deleteExpired deletes from the data file the overrides that expired at
// now. It runs under t.mu, so that it cannot delete a record another call
// has just written. A failure is logged, not returned: the override is
// expired either way, and the next write tries again.
func (t *Table) deleteExpired(now time.Time) {
	for _, o := range t.List() {
		if o.Live(now) {
			continue
		}
		if _, err := t.store.DeleteMeta(bucket, RecordKey(o.Key, o.Prefix)); err != nil {
			t.log.Warn("admin: delete expired override from the data file", "key", actor.QuoteKey([]byte(o.Key)), "prefix", o.Prefix, "err", err)
			return
		}
	}
}
