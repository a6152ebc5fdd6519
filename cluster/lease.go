package cluster

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/actor/clock"
)

// lease is this node's lease, and the promises it made to refuse other
// nodes theirs. A node decides only while its lease runs: it renews it by
// asking every live peer, and the lease runs until L after the renewal was
// sent once a majority of the expected members (itself included) granted
// it. Times are on the monotonic clock, as offsets from base.
type lease struct {
	clk    clock.Clock
	base   time.Time
	length time.Duration // L
	drift  float64       // ρ, the bound on how much two clocks' rates differ
	quorum int           // ⌊expect/2⌋+1

	until atomic.Int64 // end of the lease, ns after base; 0: none

	mu       sync.Mutex
	promises map[string]uint64 // member → newest incarnation never to grant
	store    MetaStore
}

func newLease(clk clock.Clock, length time.Duration, drift float64, expect int, store MetaStore) (*lease, error) {
	l := &lease{clk: clk, base: clk.Now(), length: length, drift: drift, quorum: expect/2 + 1,
		promises: make(map[string]uint64), store: store}
	if store == nil {
		return l, nil
	}
	var bad error
	err := store.ScanMeta(rosterBucket, func(key string, value []byte) bool {
		name, ok := strings.CutPrefix(key, fencePrefix)
		if !ok {
			return true
		}
		inc, err := strconv.ParseUint(string(value), 10, 64)
		if err != nil {
			bad = fmt.Errorf("cluster: promise for %q: %w", name, err)
			return false
		}
		l.promises[name] = inc
		return true
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: read the fencing promises: %w", err)
	}
	return l, nil
}

// fencePrefix starts the meta keys of promises: "fence:<member>".
const fencePrefix = "fence:"

// now is the monotonic time since base.
func (l *lease) now() int64 { return int64(l.clk.Now().Sub(l.base)) }

// valid reports whether the lease runs now.
func (l *lease) valid() bool {
	u := l.until.Load()
	return u != 0 && l.now() < u
}

// remaining is how long the lease still runs (0 or less: none).
func (l *lease) remaining() time.Duration {
	u := l.until.Load()
	if u == 0 {
		return 0
	}
	return time.Duration(u - l.now())
}

// extend makes the lease run until L after sent, the time the renewal that
// a majority granted was sent.
func (l *lease) extend(sent int64) {
	end := sent + int64(l.length)
	for {
		u := l.until.Load()
		if end <= u || l.until.CompareAndSwap(u, end) {
			return
		}
	}
}

// drop ends the lease now.
func (l *lease) drop() { l.until.Store(0) }

// grant answers a peer's request for a lease: granted unless this node
// promised to refuse that incarnation (then fenced).
func (l *lease) grant(member string, inc uint64) (granted, fenced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.promises[member]; ok && inc <= p {
		return false, true
	}
	return true, false
}

// promise makes this node refuse leases to member's incarnations up to
// inc from now on, on disk first when there is a store.
func (l *lease) promise(member string, inc uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.promises[member]; ok && inc <= p {
		return nil
	}
	if l.store != nil {
		if err := l.store.PutMeta(rosterBucket, fencePrefix+member, []byte(strconv.FormatUint(inc, 10))); err != nil {
			return fmt.Errorf("cluster: store the promise to fence %s: %w", member, err)
		}
	}
	l.promises[member] = inc
	return nil
}

// fenceWait is how long after the last promise a fenced member's lease
// may still run, measured on this node's clock: L·(1+ρ).
func (l *lease) fenceWait() time.Duration {
	return time.Duration(float64(l.length) * (1 + l.drift))
}
