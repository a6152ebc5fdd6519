package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Errors of the client.
var (
	// ErrClosed is the error of a check made after Close (or cut by it).
	ErrClosed = errors.New("client: closed")
)

// Defaults of Config.
const (
	// DefaultTimeout is the deadline of a decision: 20 ms, Envoy's default
	// for its rate-limit filter. A decision takes a fraction of a
	// millisecond on one node and a few in a loaded cluster, so 20 ms is
	// rarely reached by a healthy Sluice, and it costs little of a request
	// budget (hundreds of ms) when Sluice is sick. Past it the failure
	// policy decides.
	DefaultTimeout = 20 * time.Millisecond
	// DefaultMaxBatch is the most checks one coalesced call carries.
	DefaultMaxBatch = 100
	// DefaultMaxInFlight is the most coalesced calls in flight at once.
	DefaultMaxInFlight = 4
	// DefaultCacheSize is the most keys the local denial cache holds.
	DefaultCacheSize = 100_000
)

// Config configures a Client. Build it with DefaultConfig and set Addr
// (or Conn); it is not modified after New.
type Config struct {
	// Addr is the gRPC address of a Sluice node, host:port, or of several
	// separated by commas ("sluice-0:8081,sluice-1:8081,sluice-2:8081").
	// Any node of a cluster will do: it forwards checks to their owners.
	// With several, the client calls the first that answers (another when
	// that one fails) and, unless Routing says otherwise, sends each check
	// straight to the node that decides its key. Required unless Conn is
	// set.
	Addr string
	// Conn, if set, is used instead of dialing Addr: a connection the
	// caller built and closes (Close leaves it open). The client routes
	// over it only with Routing RoutingOn.
	Conn grpc.ClientConnInterface
	// DialOptions are passed to grpc.NewClient when dialing Addr, and the
	// members when routing. Without transport credentials among them, the
	// connections are plaintext; with TLS, each node's certificate must
	// name the address it announces (its --grpc-addr as the cluster
	// lists it).
	DialOptions []grpc.DialOption
	// Routing says whether the client sends each check straight to the
	// node that decides its key, learning the members and the ownership
	// from the nodes (see "Checks go to their owners" in the package
	// documentation). Default RoutingAuto: on when Addr lists several
	// addresses. RoutingOff sends every check to Addr.
	Routing Routing
	// RoutesRefresh is how often a routing client asks a node for the
	// members and the ownership when no answer told it they changed.
	// Default DefaultRoutesRefresh (10s).
	RoutesRefresh time.Duration
	// Token, if set, is sent with every call as "authorization: Bearer
	// <token>": the refund token (or admin token) a node with one requires
	// for refunds and quota leases. Without TLS it travels in clear.
	// Default: none.
	Token string
	// Timeout is the deadline of one decision, counted from the moment
	// Check (or CheckAll) is called, queueing and the retry included; a
	// context deadline that comes earlier wins. Default DefaultTimeout
	// (20 ms).
	Timeout time.Duration
	// OnFailure is the decision of a check that Sluice did not decide,
	// unless the check or the call sets one. Default FailOpen.
	OnFailure Policy
	// MaxBatch is the most checks one call to Sluice carries when Check
	// coalesces concurrent checks. Default DefaultMaxBatch (100); 1 sends
	// each check in a call of its own. Keep it at or under the server's
	// --max-batch (1000 by default).
	MaxBatch int
	// BatchWait is how long a call waits for more checks to join it once
	// the first is there, unless it is full. 0 (the default) waits for
	// nothing: a call takes the checks queued while the calls in flight
	// (MaxInFlight) were busy, so that batches grow with the load and an
	// idle client adds no delay.
	BatchWait time.Duration
	// MaxInFlight is the most coalesced calls in flight at once (over all
	// nodes, when routing); checks made while all of them are busy wait
	// for the next call. Default DefaultMaxInFlight (4).
	MaxInFlight int
	// CacheSize is the most keys the local denial cache holds (about;
	// when full, entries are evicted, expired ones first). Default
	// DefaultCacheSize; negative disables the cache.
	CacheSize int
	// LearnNode lets the client ask the node it calls for its name (one
	// AdminService.ListMembers per connection), so that decisions say
	// SourceOwner or SourceForwarded instead of SourceSluice. A node with
	// an admin token refuses the question unless Token is that token; the
	// client then stops asking. Default true.
	LearnNode bool
	// Now tells the time for the denial cache; nil is time.Now.
	Now func() time.Time
	// Logger receives the client's rare logs (a node name it could not
	// learn); nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults: a 20 ms deadline, fail open,
// coalesced calls of up to 100 checks, a denial cache of 100,000 keys.
func DefaultConfig() Config {
	return Config{
		Timeout:     DefaultTimeout,
		OnFailure:   FailOpen,
		MaxBatch:    DefaultMaxBatch,
		MaxInFlight: DefaultMaxInFlight,
		CacheSize:   DefaultCacheSize,
		LearnNode:   true,
	}
}

// Validate reports every field that cannot work, at once.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" && c.Conn == nil {
		errs = append(errs, errors.New("client: config: Addr is empty: give the gRPC address of a Sluice node"))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("client: config: Timeout %v is negative", c.Timeout))
	}
	if c.OnFailure > FailClosed {
		errs = append(errs, fmt.Errorf("client: config: OnFailure %v: want FailOpen or FailClosed", c.OnFailure))
	}
	if c.MaxBatch < 0 || c.MaxInFlight < 0 || c.BatchWait < 0 {
		errs = append(errs, errors.New("client: config: MaxBatch, MaxInFlight and BatchWait must not be negative"))
	}
	if c.Routing > RoutingOff {
		errs = append(errs, fmt.Errorf("client: config: Routing %v: want RoutingAuto, RoutingOn or RoutingOff", c.Routing))
	}
	if c.RoutesRefresh < 0 {
		errs = append(errs, fmt.Errorf("client: config: RoutesRefresh %v is negative", c.RoutesRefresh))
	}
	if c.Conn == nil && c.Addr != "" {
		for _, a := range strings.Split(c.Addr, ",") {
			if strings.TrimSpace(a) == "" {
				errs = append(errs, fmt.Errorf("client: config: Addr %q has an empty address in its list", c.Addr))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// Client asks Sluice for decisions over the native API (sluice.v1). It is
// safe for concurrent use; make one per process and share it.
type Client struct {
	cfg    Config
	conn   grpc.ClientConnInterface
	owned  *grpc.ClientConn // closed by Close; nil for Config.Conn
	rl     sluicepb.RateLimitServiceClient
	admin  sluicepb.AdminServiceClient
	callOp []grpc.CallOption
	cache  *denialCache
	now    func() time.Time
	log    *slog.Logger

	// seed is the lane to the address given (Addr or Conn).
	seed *lane
	// slots hold one token per coalesced call in flight, on any lane.
	slots chan struct{}

	ctx    context.Context // canceled by Close: cuts calls in flight
	cancel context.CancelFunc
	done   chan struct{} // closed by Close
	mu     sync.Mutex    // guards closed and wg.Add
	closed bool
	wg     sync.WaitGroup

	named    atomic.Pointer[namedConn]
	learning atomic.Bool
	learnOff atomic.Bool
	learnAt  atomic.Int64 // unix ns of the last attempt

	// routes is the view of the members when the client routes, else nil.
	routes *router

	stats stats
}

// stats are the counters behind Stats.
type stats struct {
	checks, calls, batched, retries, cacheDenials, failures atomic.Uint64
	routed, forwarded, routeViews                           atomic.Uint64
}

// Stats counts what a Client did since New.
type Stats struct {
	// Checks is the number of checks asked (Check and CheckAll).
	Checks uint64
	// Calls is the number of gRPC calls sent, retries included.
	Calls uint64
	// Batched is the number of checks those calls carried.
	Batched uint64
	// Retries is the number of calls sent again after "ownership moving".
	Retries uint64
	// CacheDenials is the number of checks the denial cache answered.
	CacheDenials uint64
	// Failures is the number of checks Sluice did not decide.
	Failures uint64
	// CacheKeys is the number of keys in the denial cache now.
	CacheKeys int
	// Routed is the number of checks sent straight to the member the
	// client's view says decides them (0 unless routing).
	Routed uint64
	// Forwarded is the number of checks the node called forwarded to
	// another, as their decisions said (Decision.Source
	// SourceForwarded). A routing client sees few: while its view is
	// stale, or a member's connection is not ready.
	Forwarded uint64
	// RouteViews is the number of views of the members and the ownership
	// the client installed (0 unless routing).
	RouteViews uint64
	// RoutesVersion is the version of the client's current view (the
	// cluster map version of the membership change it reflects); 0 when
	// it has none or does not route.
	RoutesVersion uint64
}

// New returns a Client of cfg. It does not connect: the first call does,
// and a lost connection is made again by the next calls.
func New(cfg Config) (*Client, error) {
	d := DefaultConfig()
	if cfg.Timeout == 0 {
		cfg.Timeout = d.Timeout
	}
	if cfg.OnFailure == PolicyDefault {
		cfg.OnFailure = d.OnFailure
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = d.MaxBatch
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = d.MaxInFlight
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = d.CacheSize
	}
	if cfg.RoutesRefresh == 0 {
		cfg.RoutesRefresh = DefaultRoutesRefresh
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, now: cfg.Now, log: cfg.Logger}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.conn = cfg.Conn
	var addrs []string
	if c.conn == nil {
		for _, a := range strings.Split(cfg.Addr, ",") {
			addrs = append(addrs, strings.TrimSpace(a))
		}
		cc, err := dialSeeds(addrs, cfg.DialOptions)
		if err != nil {
			return nil, fmt.Errorf("client: dial %s: %w", cfg.Addr, err)
		}
		c.conn, c.owned = cc, cc
	}
	c.rl = sluicepb.NewRateLimitServiceClient(c.conn)
	c.admin = sluicepb.NewAdminServiceClient(c.conn)
	if cfg.Token != "" {
		c.callOp = []grpc.CallOption{grpc.PerRPCCredentials(bearer(cfg.Token))}
	}
	if cfg.CacheSize > 0 {
		c.cache = newDenialCache(cfg.CacheSize, c.now)
	}
	c.slots = make(chan struct{}, cfg.MaxInFlight)
	c.seed = c.newLane(c.rl, false)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.done = make(chan struct{})
	c.wg.Add(1)
	go c.batchLoop(c.seed)
	if cfg.Routing == RoutingOn || cfg.Routing == RoutingAuto && len(addrs) > 1 {
		c.routes = newRouter(c)
		c.wg.Add(1)
		go c.routes.loop()
	}
	return c, nil
}

// dialSeeds returns a connection to the first of addrs that answers (gRPC's
// pick_first over them, in order).
func dialSeeds(addrs []string, dialOpts []grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dialOpts...)
	if len(addrs) == 1 {
		return grpc.NewClient(addrs[0], opts...)
	}
	rb := manual.NewBuilderWithScheme("sluice-seeds")
	state := resolver.State{}
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	rb.InitialState(state)
	return grpc.NewClient(rb.Scheme()+":///seeds", append(opts, grpc.WithResolvers(rb))...)
}

// Close stops the client: checks in flight and later ones fail with
// ErrClosed (and their failure policy), and the connection it dialed is
// closed. It is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.cancel()
	c.mu.Unlock()
	c.wg.Wait()
	if c.owned != nil {
		return c.owned.Close()
	}
	return nil
}

// Connect connects to Addr now and waits until the connection is ready,
// or ctx ends: call it at startup so that the first checks do not pay for
// the connection (and a wrong address shows at once). A routing client
// then waits for the first view of the members and for its connections
// to the members that are up to be ready (or to have failed once). It
// does not connect a Config.Conn, which the caller connects.
func (c *Client) Connect(ctx context.Context) error {
	if c.owned == nil {
		if c.routes != nil {
			return c.routes.waitReady(ctx)
		}
		return nil
	}
	for {
		s := c.owned.GetState()
		switch s {
		case connectivity.Ready:
			if c.routes != nil {
				return c.routes.waitReady(ctx)
			}
			return nil
		case connectivity.Idle:
			c.owned.Connect()
		case connectivity.Shutdown:
			return ErrClosed
		}
		if !c.owned.WaitForStateChange(ctx, s) {
			return fmt.Errorf("client: connect to %s: %w (last state %v)", c.cfg.Addr, ctx.Err(), s)
		}
	}
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := Stats{
		Checks:       c.stats.checks.Load(),
		Calls:        c.stats.calls.Load(),
		Batched:      c.stats.batched.Load(),
		Retries:      c.stats.retries.Load(),
		CacheDenials: c.stats.cacheDenials.Load(),
		Failures:     c.stats.failures.Load(),
		Routed:       c.stats.routed.Load(),
		Forwarded:    c.stats.forwarded.Load(),
		RouteViews:   c.stats.routeViews.Load(),
	}
	if c.routes != nil {
		if v := c.routes.view.Load(); v != nil {
			s.RoutesVersion = v.version
		}
	}
	if c.cache != nil {
		s.CacheKeys = c.cache.len()
	}
	return s
}

// Option changes one call.
type Option struct {
	timeout time.Duration
	policy  Policy
}

// WithTimeout sets the deadline of one call instead of Config.Timeout.
func WithTimeout(d time.Duration) Option { return Option{timeout: d} }

// WithPolicy sets the failure policy of the checks of one call that set
// none, instead of Config.OnFailure.
func WithPolicy(p Policy) Option { return Option{policy: p} }

// callSettings are a call's deadline and default policy.
type callSettings struct {
	deadline time.Time
	policy   Policy
}

func (c *Client) settings(ctx context.Context, opts []Option) callSettings {
	s := callSettings{policy: c.cfg.OnFailure}
	timeout := c.cfg.Timeout
	for _, o := range opts {
		if o.timeout > 0 {
			timeout = o.timeout
		}
		if o.policy != PolicyDefault {
			s.policy = o.policy
		}
	}
	s.deadline = time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(s.deadline) {
		s.deadline = d
	}
	return s
}

// Check decides one check. Checks made at the same time from many
// goroutines are coalesced into calls of up to Config.MaxBatch checks.
// A check that Sluice denied less than its retry_after ago is denied again
// from the local cache, without a call.
//
// The decision is always usable: when Sluice does not decide (unreachable,
// too slow, an error), it is the failure policy's (Decision.Source is
// SourceFailure) and err says what went wrong. Callers that only need
// to let a request through or not read Decision.Allowed and log err.
func (c *Client) Check(ctx context.Context, ch Check, opts ...Option) (Decision, error) {
	c.stats.checks.Add(1)
	s := c.settings(ctx, opts)
	if c.cache != nil {
		if ch.Refund {
			c.cache.forget(ch.Key)
		} else if d, ok := c.cache.lookup(&ch); ok {
			c.stats.cacheDenials.Add(1)
			return d, nil
		}
	}
	// Fast path: with a call slot free and nothing queued (and no
	// BatchWait asked for), send the check at once from this goroutine,
	// sparing the hand-offs to the batcher. Under load the slots are busy
	// and checks queue up into batches.
	l := c.seed
	if c.routes != nil {
		l = c.routes.lane(ch.Key)
	}
	select {
	case l.slots <- struct{}{}:
		if len(l.queue) == 0 && c.cfg.BatchWait == 0 {
			r := c.sendOne(ctx, l, &ch, s.deadline)
			<-l.slots
			if r.err == nil {
				return c.decided(&ch, r.dec, &r.info), nil
			}
			return c.failed(&ch, s.policy, r.err), fmt.Errorf("client: check %s: %w", quoteKey(ch.Key), r.err)
		}
		<-l.slots
	default:
	}
	r := c.enqueue(ctx, l, &call{checks: []Check{ch}, deadline: s.deadline, reply: make(chan []result, 1)})
	if r[0].err == nil {
		return c.decided(&ch, r[0].dec, &r[0].info), nil
	}
	return c.failed(&ch, s.policy, r[0].err), fmt.Errorf("client: check %s: %w", quoteKey(ch.Key), r[0].err)
}

// enqueue queues cl on l and waits for its results, until cl's deadline,
// ctx ends or the client closes (then every check of cl gets that error).
func (c *Client) enqueue(ctx context.Context, l *lane, cl *call) []result {
	timer := time.NewTimer(time.Until(cl.deadline))
	defer timer.Stop()
	timeout := timer.C
	var err error
	select {
	case l.queue <- cl:
		select {
		case r := <-cl.reply:
			return r
		case <-timeout:
			err = context.DeadlineExceeded
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.done:
			err = ErrClosed
		}
	case <-timeout:
		err = context.DeadlineExceeded
	case <-ctx.Done():
		err = ctx.Err()
	case <-c.done:
		err = ErrClosed
	}
	out := make([]result, len(cl.checks))
	for i := range out {
		out[i].err = err
	}
	return out
}

// CheckAll decides checks together, all or nothing: their hits are
// recorded only if every one of them is allowed. If any is denied, none is
// recorded and every decision has Allowed false; the checks that would
// have fitted on their own have RetryAfter 0. This is how a request
// limited by several rules (per client IP and per username on a login
// form) spends nothing on a rule when another refuses it.
//
// CheckAll makes one call of its own (it is not coalesced). If the cache
// holds a denial of one of the checks, every decision comes from the cache
// and no call is made; the other checks' Remaining is then -1 (unknown).
// When Sluice does not decide, each check gets its own failure policy, and
// err says what went wrong.
func (c *Client) CheckAll(ctx context.Context, checks []Check, opts ...Option) ([]Decision, error) {
	c.stats.checks.Add(uint64(len(checks)))
	out := make([]Decision, len(checks))
	if len(checks) == 0 {
		return out, nil
	}
	s := c.settings(ctx, opts)
	c.forgetRefunds(checks)
	if c.cache != nil {
		for i := range checks {
			if d, ok := c.cache.lookup(&checks[i]); ok {
				c.stats.cacheDenials.Add(uint64(len(checks)))
				for j := range checks {
					out[j] = Decision{Limit: checks[j].Limit, Remaining: -1, Source: SourceCache}
				}
				out[i] = d
				return out, nil
			}
		}
	}
	res, err := c.direct(ctx, checks, s.deadline, true)
	if err != nil {
		return c.failedAll(checks, out, s.policy, err)
	}
	for i := range checks {
		out[i] = c.decided(&checks[i], res[i].dec, &res[i].info)
	}
	return out, nil
}

// CheckEach decides checks each on its own, as Check would, and returns
// their decisions in the order of checks. They are coalesced with the
// checks of concurrent callers (Check's and CheckEach's) into calls of up
// to Config.MaxBatch checks; when the client routes, the checks of each
// node go to that node, in parallel. The checks of one node stay in one
// call, in order, so that a key checked twice in checks sees its first
// check in its second (a part larger than Config.MaxBatch goes alone).
// CheckEach does not use the local denial cache. A check whose call
// failed gets its failure policy; err then says what went wrong for the
// first of them, and the others' decisions stand.
func (c *Client) CheckEach(ctx context.Context, checks []Check, opts ...Option) ([]Decision, error) {
	c.stats.checks.Add(uint64(len(checks)))
	out := make([]Decision, len(checks))
	if len(checks) == 0 {
		return out, nil
	}
	s := c.settings(ctx, opts)
	c.forgetRefunds(checks)
	var parts []part
	if c.routes != nil {
		parts = c.routes.split(len(checks), func(i int) string { return checks[i].Key })
	} else {
		parts = []part{{l: c.seed}}
	}
	res := make([]result, len(checks))
	if len(parts) == 1 {
		copy(res, c.enqueue(ctx, parts[0].l, &call{checks: checks, deadline: s.deadline, reply: make(chan []result, 1)}))
	} else {
		var wg sync.WaitGroup
		for _, p := range parts {
			sub := make([]Check, len(p.idx))
			for j, i := range p.idx {
				sub[j] = checks[i]
			}
			wg.Go(func() {
				r := c.enqueue(ctx, p.l, &call{checks: sub, deadline: s.deadline, reply: make(chan []result, 1)})
				for j, i := range p.idx {
					res[i] = r[j]
				}
			})
		}
		wg.Wait()
	}
	var first error
	for i := range checks {
		if res[i].err != nil {
			out[i] = c.failed(&checks[i], s.policy, res[i].err)
			if first == nil {
				first = fmt.Errorf("client: check %s: %w", quoteKey(checks[i].Key), res[i].err)
			}
			continue
		}
		out[i] = c.decided(&checks[i], res[i].dec, &res[i].info)
	}
	return out, first
}

// direct sends checks in calls of their own, on the caller's goroutine,
// under deadline; Close cuts them. With allOrNothing they go in one call;
// else, when the client routes, in one call per node (see sendParts). It
// returns each check's result, and the first error among them.
func (c *Client) direct(ctx context.Context, checks []Check, deadline time.Time, allOrNothing bool) ([]result, error) {
	out := make([]result, len(checks))
	select {
	case <-c.done:
		for i := range out {
			out[i].err = ErrClosed
		}
		return out, ErrClosed
	default:
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel)
	defer stop()
	pcs := make([]*sluicepb.Check, len(checks))
	msgs := make([]sluicepb.Check, len(checks))
	for i := range checks {
		pcs[i] = toProto(&checks[i], &msgs[i])
	}
	c.sendParts(ctx, pcs, func(i int) string { return checks[i].Key }, allOrNothing, out)
	for i := range out {
		if out[i].err != nil {
			return out, out[i].err
		}
	}
	return out, nil
}

// sendOne sends one check to l's node in a call of its own, on the
// caller's goroutine, under deadline; Close cuts it.
func (c *Client) sendOne(ctx context.Context, l *lane, ch *Check, deadline time.Time) result {
	select {
	case <-c.done:
		return result{err: ErrClosed}
	default:
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel)
	defer stop()
	var msg sluicepb.Check
	out := make([]result, 1)
	c.sendPart(ctx, l, []*sluicepb.Check{toProto(ch, &msg)}, false, out)
	return out[0]
}

// sendParts decides the checks pcs, whose keys key gives, and writes each
// one's result into out. A client that does not route sends them in one
// call; one that routes sends each to the node that decides its key, one
// call per node, in parallel (the last on this goroutine), unless
// allOrNothing keeps them in one call (to the node most of them go to,
// which forwards the others).
func (c *Client) sendParts(ctx context.Context, pcs []*sluicepb.Check, key func(int) string, allOrNothing bool, out []result) {
	var parts []part
	switch {
	case c.routes == nil:
		parts = []part{{l: c.seed}}
	case allOrNothing:
		parts = []part{c.routes.majority(len(pcs), key)}
	default:
		parts = c.routes.split(len(pcs), key)
	}
	if len(parts) == 1 {
		c.sendPart(ctx, parts[0].l, pcs, allOrNothing, out)
		return
	}
	var wg sync.WaitGroup
	for pi, p := range parts {
		run := func() {
			sub := make([]*sluicepb.Check, len(p.idx))
			for j, i := range p.idx {
				sub[j] = pcs[i]
			}
			res := make([]result, len(p.idx))
			c.sendPart(ctx, p.l, sub, false, res)
			for j, i := range p.idx {
				out[i] = res[j]
			}
		}
		if pi == len(parts)-1 {
			run()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run()
		}()
	}
	wg.Wait()
}

// sendPart makes one call of the checks pcs to l's node and writes each
// check's result into out.
func (c *Client) sendPart(ctx context.Context, l *lane, pcs []*sluicepb.Check, allOrNothing bool, out []result) {
	req := &sluicepb.CheckRequest{Checks: pcs, AllOrNothing: allOrNothing}
	resp, info, err := c.invoke(ctx, l, req)
	if err != nil && l.routed && neverSent(err) && ctx.Err() == nil {
		// The member could not be dialed (it stopped, or moved): nothing
		// was sent, so the address given, whose node forwards, may have
		// the checks instead; and the view is stale.
		c.routes.stale()
		resp, info, err = c.invoke(ctx, c.seed, req)
	}
	if err == nil && len(resp.Decisions) != len(pcs) {
		err = fmt.Errorf("client: %d decisions for %d checks", len(resp.Decisions), len(pcs))
	}
	if err != nil && c.ctx.Err() != nil {
		err = ErrClosed
	}
	for i := range out {
		if err != nil {
			out[i] = result{err: err}
		} else {
			out[i] = result{dec: resp.Decisions[i], info: info, err: undecided(resp.Decisions[i])}
		}
	}
}

// undecided returns the status of a check the node could not decide while
// it decided the others of its call (a damaged record: DATA_LOSS), or nil.
func undecided(pd *sluicepb.Decision) error {
	if pd.ErrorCode == 0 {
		return nil
	}
	return status.Error(codes.Code(pd.ErrorCode), pd.ErrorMessage)
}

func (c *Client) failedAll(checks []Check, out []Decision, policy Policy, err error) ([]Decision, error) {
	for i := range checks {
		out[i] = c.failed(&checks[i], policy, err)
	}
	return out, fmt.Errorf("client: check %d keys, first %s: %w", len(checks), quoteKey(checks[0].Key), err)
}

// decided turns Sluice's decision on ch into a Decision and caches it if
// it is a denial.
func (c *Client) decided(ch *Check, pd *sluicepb.Decision, info *callInfo) Decision {
	d := Decision{
		Allowed:    pd.Allowed,
		Limit:      pd.Limit,
		Remaining:  pd.Remaining,
		RetryAfter: pd.RetryAfter.AsDuration(),
		ResetAfter: pd.ResetAfter.AsDuration(),
		Node:       pd.Node,
		Source:     c.source(info, pd),
	}
	if c.cache != nil {
		c.cache.store(ch, &d, info.sent)
	}
	return d
}

// failed is the decision of a check Sluice did not decide because of err.
func (c *Client) failed(ch *Check, policy Policy, err error) Decision {
	c.stats.failures.Add(1)
	if ch.OnFailure != PolicyDefault {
		policy = ch.OnFailure
	}
	return Decision{
		Allowed:   policy != FailClosed || ch.Refund,
		Remaining: -1,
		Source:    SourceFailure,
		Failure:   classify(err),
		Policy:    policy,
	}
}

// classify says which failure err is.
func classify(err error) Failure {
	switch {
	case errors.Is(err, ErrClosed):
		return FailureClosed
	case errors.Is(err, context.DeadlineExceeded):
		return FailureTimeout
	case errors.Is(err, context.Canceled):
		return FailureCanceled
	}
	st, ok := status.FromError(err)
	if !ok {
		return FailureRejected
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return FailureTimeout
	case codes.Canceled:
		return FailureCanceled
	case codes.ResourceExhausted:
		return FailureOverloaded
	case codes.DataLoss:
		return FailureDamaged
	case codes.Unavailable:
		if fromNode(st) {
			return FailureUnavailable
		}
		return FailureUnreachable
	}
	return FailureRejected
}

// The ErrorInfo a node puts on its UNAVAILABLE answers: its domain, and
// the reason of "ownership moving" (the server's cluster.ErrorDomain and
// cluster.ReasonMoving).
const (
	errorDomain  = "sluice.io"
	reasonMoving = "OWNERSHIP_MOVING"
	// metaRecorded and recordedMaybe: the ErrorInfo's metadata saying
	// that some of the call's hits may be recorded (the server's
	// cluster.MetaRecorded and cluster.RecordedMaybe).
	metaRecorded  = "recorded"
	recordedMaybe = "maybe"
)

// errorInfo returns the node's ErrorInfo on st, or nil.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == errorDomain {
			return ei
		}
	}
	return nil
}

// reason returns the reason of the node's ErrorInfo on st, or "".
func reason(st *status.Status) string {
	return errorInfo(st).GetReason()
}

// fromNode reports whether an UNAVAILABLE status is a node's answer (it
// may not decide now), not gRPC's own (no connection): it carries the
// node's ErrorInfo or, from a node too old for that, a message of one of
// its packages ("cluster: no quorum", "sluice: node shutting down", ...).
func fromNode(st *status.Status) bool {
	if reason(st) != "" {
		return true
	}
	msg := st.Message()
	return strings.HasPrefix(msg, "cluster: ") || strings.HasPrefix(msg, "sluice: ") || strings.HasPrefix(msg, "actor: ")
}

// moving reports whether err is a node's "ownership moving" refusal made
// before anything of the call was recorded, which a second try may get
// past.
func moving(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	if ei := errorInfo(st); ei != nil {
		// A call that moved after some of its checks were decided (a
		// batch over several owners) may have recorded their hits: sent
		// again, they would count twice.
		return ei.GetReason() == reasonMoving && ei.GetMetadata()[metaRecorded] != recordedMaybe
	}
	return strings.HasPrefix(st.Message(), "cluster: ownership moving")
}

// neverSent reports whether err is gRPC's failure to connect, before the
// call left: the node never saw it, so sending it elsewhere cannot count
// its hits twice. Other failures of the connection (reset, closed while
// the call was out) may come after the node decided, and are not retried.
func neverSent(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && !fromNode(st) && strings.Contains(st.Message(), "while dialing")
}

// callInfo is what a call's decisions share.
type callInfo struct {
	sent   time.Time // when the call (or its retry) left
	peer   peer.Peer // the connection it went over
	routes uint64    // the answer's routes_version: 0 from a single node
}

// invoke sends req to l's node, and sends it once more if the node
// answered that ownership of a key is moving and the deadline leaves time
// for it. A routing client looks at the answer for signs that its view
// is stale.
func (c *Client) invoke(ctx context.Context, l *lane, req *sluicepb.CheckRequest) (*sluicepb.CheckResponse, callInfo, error) {
	resp, info, err := c.invokeOnce(ctx, l.rl, req)
	if err == nil {
		info.routes = resp.RoutesVersion
		if l.routed {
			c.stats.routed.Add(uint64(len(req.Checks)))
		}
		if c.routes != nil {
			c.routes.seen(resp)
		} else {
			c.countForwarded(resp)
		}
	}
	return resp, info, err
}

// countForwarded counts the decisions of resp that were forwarded, and
// returns how many.
func (c *Client) countForwarded(resp *sluicepb.CheckResponse) int {
	n := 0
	for _, d := range resp.Decisions {
		if d.Forwarded {
			n++
		}
	}
	if n > 0 {
		c.stats.forwarded.Add(uint64(n))
	}
	return n
}

// forgetRefunds takes the keys of the refunds among checks out of the
// denial cache.
func (c *Client) forgetRefunds(checks []Check) {
	if c.cache == nil {
		return
	}
	for i := range checks {
		if checks[i].Refund {
			c.cache.forget(checks[i].Key)
		}
	}
}

func (c *Client) invokeOnce(ctx context.Context, rl sluicepb.RateLimitServiceClient, req *sluicepb.CheckRequest) (*sluicepb.CheckResponse, callInfo, error) {
	var info callInfo
	opts := append(c.callOp[:len(c.callOp):len(c.callOp)], grpc.Peer(&info.peer))
	info.sent = c.now()
	c.stats.calls.Add(1)
	c.stats.batched.Add(uint64(len(req.Checks)))
	resp, err := rl.Check(ctx, req, opts...)
	if err != nil && moving(err) {
		// The new owner is waiting for the key's state: give it a moment,
		// within the deadline.
		pause := 2 * time.Millisecond
		if d, ok := ctx.Deadline(); ok {
			pause = min(pause, time.Until(d)/4)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, info, err
		}
		c.stats.retries.Add(1)
		c.stats.calls.Add(1)
		c.stats.batched.Add(uint64(len(req.Checks)))
		info.sent = c.now()
		resp, err = rl.Check(ctx, req, opts...)
	}
	return resp, info, err
}

// toProto fills pc from ch and returns it.
func toProto(ch *Check, pc *sluicepb.Check) *sluicepb.Check {
	pc.Key = []byte(ch.Key)
	pc.Limit = ch.Limit
	if ch.Window != 0 {
		pc.Window = durationpb.New(ch.Window)
	}
	pc.Algorithm = sluicepb.Algorithm(ch.Algorithm)
	cost := ch.cost()
	pc.Cost = &cost
	pc.Refund = ch.Refund
	pc.Penalty = ch.Penalty
	pc.Usage = ch.Usage
	return pc
}

// quoteKey quotes at most 64 bytes of a key for an error message.
func quoteKey(key string) string {
	if len(key) > 64 {
		return fmt.Sprintf("%q...", key[:64])
	}
	return fmt.Sprintf("%q", key)
}

// bearer sends a token as "authorization: Bearer <token>".
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: the operator chooses whether the
// connection is TLS (Config.DialOptions).
func (b bearer) RequireTransportSecurity() bool { return false }

var _ credentials.PerRPCCredentials = bearer("")

// namedConn is the name of the node at the other end of one connection.
type namedConn struct {
	remote, local net.Addr
	name          string
}

// Node returns the name of the node the client calls (its --node-name),
// once it learned it (Config.LearnNode), else "".
func (c *Client) Node() string {
	if n := c.named.Load(); n != nil {
		return n.name
	}
	return ""
}

// source says whether a decision that went over the connection of info
// was made by the node called or forwarded: from the decision itself when
// a node of a cluster answered, else if the client knows the called
// node's name; else it starts learning it.
func (c *Client) source(info *callInfo, pd *sluicepb.Decision) Source {
	if info.routes != 0 {
		if pd.Forwarded {
			return SourceForwarded
		}
		return SourceOwner
	}
	owner := pd.Node
	n := c.named.Load()
	if n != nil && sameAddr(n.remote, info.peer.Addr) && sameAddr(n.local, info.peer.LocalAddr) {
		if owner == n.name {
			return SourceOwner
		}
		return SourceForwarded
	}
	c.learn(info.peer)
	return SourceSluice
}

// sameAddr reports whether a and b are the same end of a connection.
// gRPC gives every call of one connection the same address values, so a
// pointer comparison tells connections apart; a new connection, even to
// the same node, has new ones.
func sameAddr(a, b net.Addr) bool {
	if a == nil || b == nil {
		return false
	}
	ta, ok1 := a.(*net.TCPAddr)
	tb, ok2 := b.(*net.TCPAddr)
	if ok1 && ok2 {
		return ta == tb
	}
	return a.Network() == b.Network() && a.String() == b.String()
}

// learn asks, in the background, the node at the other end of p for its
// name: at most one question at a time and one a second.
func (c *Client) learn(p peer.Peer) {
	if !c.cfg.LearnNode || c.learnOff.Load() || p.Addr == nil {
		return
	}
	now := time.Now().UnixNano()
	if now-c.learnAt.Load() < int64(time.Second) || !c.learning.CompareAndSwap(false, true) {
		return
	}
	c.learnAt.Store(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.learning.Store(false)
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.learning.Store(false)
		ctx, cancel := context.WithTimeout(c.ctx, time.Second)
		defer cancel()
		var got peer.Peer
		opts := append(c.callOp[:len(c.callOp):len(c.callOp)], grpc.Peer(&got))
		resp, err := c.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{}, opts...)
		if err != nil {
			switch status.Code(err) {
			case codes.Unauthenticated, codes.PermissionDenied, codes.Unimplemented:
				c.learnOff.Store(true)
				c.log.Info("client: cannot learn the name of the node it calls; decisions say SourceSluice instead of owner or forwarded", "err", err)
			}
			return
		}
		if resp.Node != "" && sameAddr(got.Addr, p.Addr) && sameAddr(got.LocalAddr, p.LocalAddr) {
			c.named.Store(&namedConn{remote: p.Addr, local: p.LocalAddr, name: resp.Node})
		}
	}()
}
