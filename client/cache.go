package client

import (
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// cacheShards is the number of independently locked parts of the denial
// cache, so that many goroutines looking up keys rarely share a lock.
const cacheShards = 16

// denialCache remembers the checks Sluice denied, until their retry_after,
// so that the same check (or one that costs more) is denied again without
// a call. It never denies what Sluice did not: an entry answers only a
// check with the same key, limit, window and algorithm, a cost at least
// the denied one, and only before the denial's retry_after ran out,
// counted from before the call was sent. Since denied hits are not
// recorded, nothing else the client sends can make that check fit sooner;
// only an operator can (a reset, an override, another client's refund),
// which the cache does not see.
type denialCache struct {
	now      func() time.Time
	perShard int
	shards   [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.Mutex
	m  map[string]denial
}

// denial is a cached denial of a check.
type denial struct {
	limit  int64         // the check's limit, as sent
	window time.Duration // the check's window, as sent
	algo   Algorithm     // the check's algorithm, as sent
	cost   int64         // the denied cost
	until  time.Time     // the check is denied before this
	reset  time.Time     // the limit is whole again at this
	dLimit int64         // the limit Sluice decided against
	node   string        // who decided
}

// newDenialCache returns a cache of at most about size keys.
func newDenialCache(size int, now func() time.Time) *denialCache {
	c := &denialCache{now: now, perShard: max(size/cacheShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]denial)
	}
	return c
}

func (c *denialCache) shard(key string) *cacheShard {
	return &c.shards[xxhash.Sum64String(key)%cacheShards]
}

// cacheable reports whether a check may be answered from, or stored in,
// the cache.
func cacheable(ch *Check) bool { return !ch.Peek && !ch.Refund && !ch.Penalty && !ch.Usage }

// lookup returns the cached denial of ch, if there is one in force.
func (c *denialCache) lookup(ch *Check) (Decision, bool) {
	if !cacheable(ch) {
		return Decision{}, false
	}
	s := c.shard(ch.Key)
	s.mu.Lock()
	e, ok := s.m[ch.Key]
	if !ok {
		s.mu.Unlock()
		return Decision{}, false
	}
	now := c.now()
	if !now.Before(e.until) {
		delete(s.m, ch.Key)
		s.mu.Unlock()
		return Decision{}, false
	}
	s.mu.Unlock()
	if e.limit != ch.Limit || e.window != ch.Window || e.algo != ch.Algorithm || ch.cost() < e.cost {
		return Decision{}, false
	}
	retry := e.until.Sub(now)
	return Decision{
		Allowed:    false,
		Limit:      e.dLimit,
		Remaining:  0,
		RetryAfter: retry,
		ResetAfter: max(e.reset.Sub(now), retry),
		Node:       e.node,
		Source:     SourceCache,
	}, true
}

// store remembers d, Sluice's decision on ch, if it is a denial that
// waiting can end. sent is when the call left: the owner decided after
// it, so retry_after counted from sent ends no later than Sluice's.
func (c *denialCache) store(ch *Check, d *Decision, sent time.Time) {
	if !cacheable(ch) {
		return
	}
	if d.Allowed || d.RetryAfter <= 0 {
		return
	}
	e := denial{
		limit: ch.Limit, window: ch.Window, algo: ch.Algorithm, cost: ch.cost(),
		until: sent.Add(d.RetryAfter), reset: sent.Add(d.ResetAfter),
		dLimit: d.Limit, node: d.Node,
	}
	s := c.shard(ch.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[ch.Key]; !ok && len(s.m) >= c.perShard {
		c.evict(s)
	}
	s.m[ch.Key] = e
}

// evict makes room in a full shard: expired entries go first (a few
// looked at), else an arbitrary one. The lock is held.
func (c *denialCache) evict(s *cacheShard) {
	now := c.now()
	looked := 0
	var any string
	for k, e := range s.m {
		if !now.Before(e.until) {
			delete(s.m, k)
			return
		}
		if looked == 0 {
			any = k
		}
		if looked++; looked == 8 {
			break
		}
	}
	delete(s.m, any)
}

// forget drops the key's entry (after a refund through this client).
func (c *denialCache) forget(key string) {
	s := c.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// len is the number of entries, expired ones included.
func (c *denialCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
