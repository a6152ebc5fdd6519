package client

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/shard"
)

// Routing says whether the client sends each check straight to the node
// that decides its key.
type Routing uint8

const (
	// RoutingAuto routes when Config.Addr lists more than one address.
	RoutingAuto Routing = iota
	// RoutingOn routes, even from a single address (a Kubernetes Service
	// in front of the nodes, say): the client learns the members from
	// whichever node answers.
	RoutingOn
	// RoutingOff sends every check to Config.Addr (or Config.Conn), whose
	// node forwards it to the key's owner.
	RoutingOff
)

func (r Routing) String() string {
	switch r {
	case RoutingAuto:
		return "auto"
	case RoutingOn:
		return "on"
	case RoutingOff:
		return "off"
	}
	return fmt.Sprintf("Routing(%d)", uint8(r))
}

// ParseRouting parses "auto", "on" or "off" (as String writes them).
func ParseRouting(s string) (Routing, error) {
	switch s {
	case "auto":
		return RoutingAuto, nil
	case "on":
		return RoutingOn, nil
	case "off":
		return RoutingOff, nil
	}
	return RoutingAuto, fmt.Errorf("client: routing %q: want auto, on or off", s)
}

// DefaultRoutesRefresh is how often a routing client asks for the members
// and the ownership when no answer told it they changed.
const DefaultRoutesRefresh = 10 * time.Second

const (
	// routesTimeout bounds one Routes call.
	routesTimeout = time.Second
	// routesGap is the least time between two Routes calls that answers
	// asked for (a newer version, a forward).
	routesGap = 100 * time.Millisecond
	// forwardHintGap is the least time between two refreshes asked for by
	// forwarded decisions alone (the answer's version being no newer).
	forwardHintGap = time.Second
	// retireAfter is how long, at least, the connection to a member that
	// left the view stays open, for the calls still using it; it is
	// closed when a later view is installed (or the client closes).
	retireAfter = time.Minute
)

// router is a Client's view of the members and the ownership, and its
// connections to the members. The view is immutable and swapped whole;
// the hot path reads it without a lock.
type router struct {
	c    *Client
	view atomic.Pointer[routeView]
	// kick asks the refresh loop for a Routes call now.
	kick chan struct{}
	// first is closed after the first Routes answer (or the answer that
	// the node cannot route).
	first     chan struct{}
	firstOnce sync.Once
	// off is set when the node does not serve Routes (an older release):
	// the client then sends every check through the seed connection.
	off    atomic.Bool
	hintAt atomic.Int64 // unix ns of the last refresh a forward asked for

	mu      sync.Mutex             // guards conns and retired
	conns   map[string]*memberConn // by address
	retired []retiredConn
}

// memberConn is the connection to one member, and its lane.
type memberConn struct {
	name string
	addr string
	cc   *grpc.ClientConn
	lane *lane
	// warned is set once the client logged that it cannot connect.
	warned atomic.Bool
}

type retiredConn struct {
	mc *memberConn
	at time.Time
}

// routeView is one answer to Routes: the members a key's rendezvous order
// runs over, sorted by name, as the nodes order them (docs/cluster.md,
// "Ownership: rendezvous hashing").
type routeView struct {
	version   uint64
	clusterID string
	names     []string
	hashes    []uint64
	up        []bool
	conns     []*memberConn // nil for a member without an address
}

// acting returns the index of the member a key's checks go to: the first
// of its rendezvous order that is up; -1 when none is. Equal scores go to
// the smallest name, as on the nodes: names are sorted, and a later
// member replaces the best only with a strictly higher score.
func (v *routeView) acting(key string) int {
	h := shard.Hash(key)
	best, bestScore := -1, uint64(0)
	for i := range v.hashes {
		if !v.up[i] {
			continue
		}
		if s := shard.Score(h, v.hashes[i]); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

func newRouter(c *Client) *router {
	return &router{c: c, kick: make(chan struct{}, 1), first: make(chan struct{}), conns: make(map[string]*memberConn)}
}

// loop keeps the view current: a Routes call at once, then every
// RoutesRefresh, and when an answer asks for one (at most one per
// routesGap). It returns when the client closes, and closes the member
// connections.
func (r *router) loop() {
	c := r.c
	defer c.wg.Done()
	defer r.closeAll()
	t := time.NewTimer(0)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		case <-r.kick:
			if wait := routesGap - time.Since(last); wait > 0 {
				gap := time.NewTimer(wait)
				select {
				case <-gap.C:
				case <-c.done:
					gap.Stop()
					return
				}
			}
		}
		last = time.Now()
		r.refresh()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(c.cfg.RoutesRefresh)
	}
}

// refresh asks for the routes, through the seed connection first and
// then through the members it knows, and installs the answer if it is
// news.
func (r *router) refresh() {
	c := r.c
	clients := []sluicepb.RateLimitServiceClient{c.rl}
	if v := r.view.Load(); v != nil {
		for i, mc := range v.conns {
			if mc != nil && v.up[i] {
				clients = append(clients, mc.lane.rl)
			}
		}
	}
	var errs []string
	for _, rl := range clients {
		ctx, cancel := context.WithTimeout(c.ctx, max(routesTimeout, c.cfg.Timeout))
		resp, err := rl.Routes(ctx, &sluicepb.RoutesRequest{}, c.callOp...)
		cancel()
		if err == nil {
			r.install(resp)
			r.firstOnce.Do(func() { close(r.first) })
			return
		}
		if c.ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			// A release before Routes: forwards do the routing.
			r.off.Store(true)
			r.firstOnce.Do(func() { close(r.first) })
			c.log.Info("client: the node does not list routes (an older release); every check goes to the address given", "err", err)
			return
		}
		errs = append(errs, err.Error())
	}
	c.log.Debug("client: routes not refreshed", "errs", strings.Join(errs, "; "))
}

// install makes resp the view if it is newer than the current one (or of
// another cluster), dialing the members new to it and retiring the
// connections of those that left.
func (r *router) install(resp *sluicepb.RoutesResponse) {
	cur := r.view.Load()
	if resp.Version == 0 {
		// A single node, or one not yet in a cluster: nothing to route.
		return
	}
	if cur != nil && resp.ClusterId == cur.clusterID && resp.Version <= cur.version {
		return
	}
	v := &routeView{version: resp.Version, clusterID: resp.ClusterId}
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := make(map[string]bool, len(resp.Members))
	for _, m := range resp.Members {
		v.names = append(v.names, m.Name)
		v.hashes = append(v.hashes, shard.NodeHash(m.Name))
		v.up = append(v.up, m.Up)
		var mc *memberConn
		if m.Addr != "" {
			mc = r.conns[m.Addr]
			if mc != nil && mc.name != m.Name {
				// Another member took the address: a new connection.
				r.retired = append(r.retired, retiredConn{mc: mc, at: time.Now()})
				delete(r.conns, m.Addr)
				mc = nil
			}
			if mc == nil {
				mc = r.dial(m.Name, m.Addr)
			}
			if mc != nil {
				r.conns[m.Addr] = mc
				keep[m.Addr] = true
			}
		}
		v.conns = append(v.conns, mc)
	}
	now := time.Now()
	for addr, mc := range r.conns {
		if !keep[addr] {
			delete(r.conns, addr)
			r.retired = append(r.retired, retiredConn{mc: mc, at: now})
		}
	}
	live := r.retired[:0]
	for _, rc := range r.retired {
		if now.Sub(rc.at) > retireAfter {
			close(rc.mc.lane.stop)
			rc.mc.cc.Close()
		} else {
			live = append(live, rc)
		}
	}
	r.retired = live
	r.view.Store(v)
	r.c.stats.routeViews.Add(1)
}

// dial returns a connection to the member name at addr, connecting now;
// nil if addr cannot be dialed (it is logged). Under r.mu.
func (r *router) dial(name, addr string) *memberConn {
	c := r.c
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, c.cfg.DialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		c.log.Warn("client: cannot dial a member; its keys go through the address given", "member", name, "addr", addr, "err", err)
		return nil
	}
	cc.Connect()
	mc := &memberConn{name: name, addr: addr, cc: cc, lane: c.newLane(sluicepb.NewRateLimitServiceClient(cc), true)}
	c.wg.Add(1) // the refresh loop holds one: Close waits for both
	go c.batchLoop(mc.lane)
	return mc
}

// closeAll closes every member connection; the client is closing.
func (r *router) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, mc := range r.conns {
		mc.cc.Close()
		delete(r.conns, addr)
	}
	for _, rc := range r.retired {
		rc.mc.cc.Close()
	}
	r.retired = nil
}

// seen looks at an answer for signs that the view is stale: a newer
// version of the ownership, or checks the node had to forward. It asks
// the loop for a refresh; it never blocks.
func (r *router) seen(resp *sluicepb.CheckResponse) {
	forwarded := r.c.countForwarded(resp)
	v := r.view.Load()
	switch {
	case resp.RoutesVersion != 0 && (v == nil || resp.RoutesVersion > v.version):
	case forwarded > 0:
		now := time.Now().UnixNano()
		last := r.hintAt.Load()
		if now-last < int64(forwardHintGap) || !r.hintAt.CompareAndSwap(last, now) {
			return
		}
	default:
		return
	}
	r.stale()
}

// stale asks the loop for a refresh, as an answer that says the view is
// stale does (at most one per routesGap).
func (r *router) stale() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// part is the checks of a call that go to one node, by its lane.
type part struct {
	l   *lane
	idx []int // indexes into the call's checks; nil means all of them
}

// split groups n checks, whose keys key(i) gives, by the node each goes
// to: the member acting for its key, when the view names one and the
// connection to it is ready; else the seed connection, whose node
// forwards. A call whose checks all go to one node is one part with idx
// nil, without allocating per check.
func (r *router) split(n int, key func(int) string) []part {
	v := r.view.Load()
	if v == nil || r.off.Load() {
		return []part{{l: r.c.seed}}
	}
	m0 := v.acting(key(0))
	if n == 1 {
		return []part{r.target(v, m0)}
	}
	members := make([]int, n)
	members[0] = m0
	same := true
	for i := 1; i < n; i++ {
		members[i] = v.acting(key(i))
		same = same && members[i] == m0
	}
	if same {
		return []part{r.target(v, m0)}
	}
	// byMember[m+1] is 1 + the index in parts of member m's part (0: not
	// yet known); members whose connection is not ready share the seed's.
	byMember := make([]int, len(v.names)+1)
	var parts []part
	for i, m := range members {
		k := byMember[m+1]
		if k == 0 {
			p := r.target(v, m)
			k = slices.IndexFunc(parts, func(q part) bool { return q.l == p.l }) + 1
			if k == 0 {
				parts = append(parts, p)
				k = len(parts)
			}
			byMember[m+1] = k
		}
		parts[k-1].idx = append(parts[k-1].idx, i)
	}
	return parts
}

// target returns the part of member m: to its node if its connection is
// ready, else to the seed's (a connection that is still connecting, or
// failing, would only delay the checks; the seed's node forwards them).
func (r *router) target(v *routeView, m int) part {
	return part{l: r.laneOf(v, m)}
}

// laneOf returns member m's lane if its connection is ready, else the
// seed lane.
func (r *router) laneOf(v *routeView, m int) *lane {
	if m < 0 || v.conns[m] == nil {
		return r.c.seed
	}
	mc := v.conns[m]
	switch mc.cc.GetState() {
	case connectivity.Ready:
		return mc.lane
	case connectivity.Idle:
		mc.cc.Connect()
	case connectivity.TransientFailure:
		if !mc.warned.Swap(true) {
			r.c.log.Warn("client: cannot connect to a member; its keys go through the address given, which forwards them (is its address reachable from here, and does its certificate name it?)",
				"member", mc.name, "addr", mc.addr)
		}
	}
	return r.c.seed
}

// lane returns the lane of the member acting for key (see laneOf); the
// seed lane without a view.
func (r *router) lane(key string) *lane {
	v := r.view.Load()
	if v == nil || r.off.Load() {
		return r.c.seed
	}
	return r.laneOf(v, v.acting(key))
}

// majority returns the connection the most of n checks go to, for a call
// that must stay whole (all or nothing, a reservation): its other checks
// are forwarded by that node.
func (r *router) majority(n int, key func(int) string) part {
	parts := r.split(n, key)
	best := 0
	for i := range parts {
		if len(parts[i].idx) > len(parts[best].idx) {
			best = i
		}
	}
	p := parts[best]
	p.idx = nil
	return p
}

// waitReady waits, within ctx, for the first Routes answer and then for
// the connection to every member that is up to be ready or to have
// failed once.
func (r *router) waitReady(ctx context.Context) error {
	select {
	case <-r.first:
	case <-ctx.Done():
		return fmt.Errorf("client: routes: no answer from %s: %w", r.c.cfg.Addr, ctx.Err())
	case <-r.c.done:
		return ErrClosed
	}
	v := r.view.Load()
	if v == nil {
		return nil
	}
	for i, mc := range v.conns {
		if mc == nil || !v.up[i] {
			continue
		}
		for {
			s := mc.cc.GetState()
			if s == connectivity.Ready || s == connectivity.TransientFailure || s == connectivity.Shutdown {
				break
			}
			if s == connectivity.Idle {
				mc.cc.Connect()
			}
			if !mc.cc.WaitForStateChange(ctx, s) {
				return fmt.Errorf("client: connect to member %s at %s: %w", mc.name, mc.addr, ctx.Err())
			}
		}
	}
	return nil
}
