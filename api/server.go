package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/api/limits"
	"github.com/sluice-io/sluice/api/overrides"
	"github.com/sluice-io/sluice/api/traffic"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Config configures the services. It is not modified after New.
type Config struct {
	// NodeName names the node in decisions and admin answers. Required.
	NodeName string
	// AdminToken, when set, is the bearer token the admin API (and the
	// peer service) requires.
	AdminToken string
	// RefundToken, when set, is a bearer token that allows refunds (native
	// checks with refund, Envoy descriptors with is_negative_hits) and
	// nothing else. Refunds need it or the admin token; with neither set,
	// refunds are open like every decision.
	RefundToken string
	// RateLimitHeaders makes Envoy responses carry rate limit header
	// fields for the client, in HeaderFormat.
	RateLimitHeaders bool
	// HeaderFormat chooses the fields RateLimitHeaders adds: HeadersIETF
	// (the default, also for "") or HeadersDraft03.
	HeaderFormat HeaderFormat
	// HeaderNames names the fields of HeadersDraft03; an empty name takes
	// envoyproxy/ratelimit's default (RateLimit-Limit, RateLimit-Remaining,
	// RateLimit-Reset).
	HeaderNames HeaderNames
	// ShadowMode puts every limit of Envoy requests in shadow mode, as
	// envoyproxy/ratelimit's SHADOW_MODE does: counted and reported, never
	// OVER_LIMIT.
	ShadowMode bool
	// UsageDomains lists the Envoy domains whose every descriptor is a
	// usage descriptor, as if its limits file rule said usage: true (and
	// also when the descriptor carries its limit inline): its hits are
	// usage already spent, recorded even when they do not fit (see
	// docs/envoy.md, "Token budgets"). "*" marks every domain. Default:
	// none.
	UsageDomains []string
	// ResponseDynamicMetadata makes Envoy responses carry dynamic metadata
	// (the request, and the metadata of the limits file's rules that
	// allowed it), as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA
	// does. See dynamicMetadata.
	ResponseDynamicMetadata bool
	// RuleMetricsMaxKeys bounds the per-rule statistics keys that hold
	// request values (detailed_metric, value_to_metric, inline limits):
	// past it they are counted under key "other" (see rulestats.go).
	// Default 1000 (DefaultRuleMetricsMaxKeys).
	RuleMetricsMaxKeys int
	// NearLimitRatio is the share of a limit above which allowed hits
	// count as near the limit in the per-rule statistics, in (0, 1].
	// Default 0.8 (envoyproxy/ratelimit's NEAR_LIMIT_RATIO).
	NearLimitRatio float64
	// MaxMessageBytes bounds the body of a decision over HTTP (/json).
	// Default 4 MiB.
	MaxMessageBytes int
	// MaxInflightBytes bounds the bytes of the decision requests (native and Envoy)
	// (as received, before decoding) the node works on at once; a call
	// past it waits, then is refused with RESOURCE_EXHAUSTED (see
	// requestBudget). Default 2 MiB (DefaultMaxInflightBytes).
	MaxInflightBytes int64
	// MaxConnInflightBytes is MaxInflightBytes for the calls of one
	// connection. Default 512 KiB (DefaultMaxConnInflightBytes).
	MaxConnInflightBytes int64
	// BudgetWait is the longest a call waits for MaxInflightBytes or
	// MaxConnInflightBytes before it is refused (its deadline, if sooner,
	// ends the wait too). Default 1s (DefaultBudgetWait).
	BudgetWait time.Duration
	// Limits bounds what a check may ask for: the engine's
	// (actor.Config.Limits), so that the APIs refuse what the engine would.
	Limits actor.Limits
	// Traffic sizes the counts of the operator's view (TrafficService, the
	// web UI); zero fields are traffic.DefaultConfig's.
	Traffic traffic.Config
	// LeaseHotKeys, if positive, decides from quota leases, as a lease
	// rule's, the Envoy keys this node does not own that it received at
	// least this many checks a second of over the last minute (its top
	// keys, refreshed every second). 0: only lease rules lease.
	LeaseHotKeys float64
}

// Defaults of Config's request budget.
const (
	DefaultMaxInflightBytes     = 2 << 20
	DefaultMaxConnInflightBytes = 512 << 10
	DefaultBudgetWait           = time.Second
)

// Decider decides checks on the members that act for their keys: this
// node's engine for a single node, the cluster's members in a cluster
// (cluster.Router is one). It is the one way a check reaches the engine.
type Decider interface {
	// Check decides checks as one call, writing one decision per check
	// into out and the name of the node that decided it into nodes (both
	// as long as checks). With allOrNothing, the hits are recorded only if
	// every check is allowed. A node that joins a cluster refuses every
	// check (cluster.ErrNoQuorum) until it has joined.
	Check(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, allOrNothing bool) error
}

// Cluster is what the admin API, the clients' routes and the operator's
// view ask of the node's place in a cluster (cluster.Router is one). A
// single node answers for itself: it owns every key, has no peers, no
// standbys and no map.
type Cluster interface {
	// Joining is the error of a call a node that joins a cluster cannot
	// serve before it joined; nil once it has, and for a single node.
	Joining() error
	// Joined reports whether the node is a member of a cluster it joined.
	Joined() bool
	// Owner names the member that decides key now and whether it is
	// another node.
	Owner(key string) (name string, remote bool)
	// Standby names the member that holds a copy of key's state, "" if
	// none.
	Standby(key string) string
	// Routes and RoutesVersion are the ownership clients route by (see
	// cluster.Router.Routes).
	Routes() (uint64, []cluster.Route)
	RoutesVersion() uint64
	// Map is the cluster map the node applied, nil for a single node.
	Map() *control.Map
	// Shares, Voters and Leader describe the members (see
	// cluster.Router).
	Shares(samples int) map[string]float64
	Voters() map[string]bool
	Leader() string
	// Forget removes a member that is down for good from the map.
	Forget(ctx context.Context, name string) (bool, error)
	// Gossip lists every node gossip knows; ViewEpoch and Changes are the
	// epoch and the last changes of gossip's view of the live members.
	Gossip() []cluster.Member
	ViewEpoch() uint64
	Changes() []cluster.Change
}

// AdminPeers reaches the admin services of the other members, for the
// admin calls a node answers for the whole cluster (cluster.AdminPeers is
// one). A single node has none.
type AdminPeers interface {
	// KeyOwner returns an admin client for key's owner when that is
	// another member and the call (ctx) came from none; nil: answer here.
	KeyOwner(ctx context.Context, key []byte) (sluicepb.AdminServiceClient, error)
	// Others names the other live members to fan a call out to: none for
	// a call that came from one of them.
	Others(ctx context.Context) []string
	// Client and Conn reach the member name's admin services.
	Client(name string) (sluicepb.AdminServiceClient, error)
	Conn(name string) (*grpc.ClientConn, error)
	// Context is ctx for a call to another member.
	Context(ctx context.Context) context.Context
}

// Deps are the parts of the node the services adapt. The node (see
// cmd/sluice/node) builds and owns them; the services never close them.
type Deps struct {
	// Engine holds the keys this node decides: the admin API reads,
	// lists and resets them there. Required.
	Engine *actor.Engine
	// Decider decides the checks. Required.
	Decider Decider
	// Cluster answers for the node's cluster. Required.
	Cluster Cluster
	// Peers reaches the other members for admin calls. Required.
	Peers AdminPeers
	// Overrides holds the overrides (see package overrides); nil keeps
	// them in memory only, on this node.
	Overrides *overrides.Table
	// Limits is the limits file in force; nil when there is none.
	Limits *limits.Watcher
	// GRPCAddr returns the address the node's gRPC listener is bound to,
	// which a single node lists for itself (ListMembers).
	GRPCAddr func() string
	// Registry receives the decision metrics.
	Registry prometheus.Registerer
	// Clock tells the time; nil is the wall clock.
	Clock clock.Clock
	// Logger receives the services' logs; nil discards them.
	Logger *slog.Logger
}

// Server is the gRPC side of a node: the native API, Envoy's RLS v3 and the
// admin API, adapting calls to the decider (and admin calls to the
// engine and the cluster), with errors mapped to statuses in one place
// (status.go).
type Server struct {
	budget    *requestBudget
	cfg       Config
	log       *slog.Logger
	clock     clock.Clock
	engine    *actor.Engine
	limits    *limits.Watcher
	overrides *overrides.Table
	metrics   *metrics
	decider   Decider
	cluster   Cluster
	peers     AdminPeers
	grpcAddr  func() string
	traffic   *traffic.Recorder // nil only in benchmarks that measure its cost
	started   time.Time
	// headerNames is cfg.HeaderNames with the defaults filled in.
	headerNames HeaderNames
	ruleStats   *ruleStats
	// usageDomains is cfg.UsageDomains as a set; usageAll is "*" in it.
	usageDomains map[string]bool
	usageAll     bool
	// leases are the quota lease slices this node holds (lease.go).
	leases *nodeLeases
	hot    hotKeys
	// rlqs serves Envoy's Rate Limit Quota Service (rlqs.go).
	rlqs *rlqsService
}

// New builds the services.
func New(cfg Config, d Deps) (*Server, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("api: config: node name is empty")
	}
	switch {
	case d.Engine == nil:
		return nil, errors.New("api: no engine")
	case d.Decider == nil:
		return nil, errors.New("api: no decider")
	case d.Cluster == nil:
		return nil, errors.New("api: no cluster")
	case d.Peers == nil:
		return nil, errors.New("api: no admin peers")
	}
	if d.Clock == nil {
		d.Clock = clock.Real{}
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.GRPCAddr == nil {
		d.GRPCAddr = func() string { return "" }
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	if cfg.MaxInflightBytes <= 0 {
		cfg.MaxInflightBytes = DefaultMaxInflightBytes
	}
	if cfg.MaxConnInflightBytes <= 0 {
		cfg.MaxConnInflightBytes = DefaultMaxConnInflightBytes
	}
	if cfg.BudgetWait <= 0 {
		cfg.BudgetWait = DefaultBudgetWait
	}
	s := &Server{
		budget: newRequestBudget(cfg.MaxInflightBytes, cfg.MaxConnInflightBytes, cfg.BudgetWait, d.Registry),
		cfg:    cfg, log: d.Logger, clock: d.Clock, engine: d.Engine, limits: d.Limits,
		decider: d.Decider, cluster: d.Cluster, peers: d.Peers, overrides: d.Overrides, grpcAddr: d.GRPCAddr,
		metrics: newMetrics(d.Registry), started: d.Clock.Now(), headerNames: cfg.HeaderNames.withDefaults(),
	}
	s.leases, s.rlqs = newNodeLeases(s, d.Registry), newRLQSService(s, d.Registry)
	var err error
	if s.traffic, err = traffic.New(cfg.Traffic); err != nil {
		return nil, err
	}
	if _, err := ParseHeaderFormat(string(cfg.HeaderFormat)); err != nil {
		return nil, err
	}
	if cfg.RuleMetricsMaxKeys < 0 {
		return nil, fmt.Errorf("api: config: rule metrics max keys %d: must not be negative", cfg.RuleMetricsMaxKeys)
	}
	if r := cfg.NearLimitRatio; r < 0 || r > 1 || math.IsNaN(r) {
		return nil, fmt.Errorf("api: config: near limit ratio %v: want a share of the limit in (0, 1]", r)
	}
	s.ruleStats = newRuleStats(d.Registry, cfg.RuleMetricsMaxKeys, cfg.NearLimitRatio)
	for _, dom := range cfg.UsageDomains {
		if dom == "" {
			return nil, errors.New("api: config: usage domains: an empty domain; name a domain, or \"*\" for every domain")
		}
		if s.usageDomains == nil {
			s.usageDomains = make(map[string]bool)
		}
		s.usageDomains[dom] = true
		s.usageAll = s.usageAll || dom == "*"
	}
	if s.overrides == nil {
		if s.overrides, err = overrides.Open(overrides.Config{Logger: d.Logger}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Register registers the native, Envoy, admin and traffic services on g.
// Build g with Interceptors, so that the admin token is checked.
func (s *Server) Register(g *grpc.Server) {
	s.RegisterDecisions(g)
	s.RegisterAdmin(g)
}

// RegisterDecisions registers the decision services, native and Envoy, on
// g, built with Interceptors.
func (s *Server) RegisterDecisions(g *grpc.Server) {
	g.RegisterService(s.budget.wrap(&sluicepb.RateLimitService_ServiceDesc), &nativeService{s: s})
	g.RegisterService(s.budget.wrap(&rlsv3.RateLimitService_ServiceDesc), &envoyService{s: s})
	rlqsv3.RegisterRateLimitQuotaServiceServer(g, s.rlqs)
}

// RegisterAdmin registers the admin and traffic services on g, built with
// Interceptors so that the admin token is checked.
func (s *Server) RegisterAdmin(g *grpc.Server) {
	// Not budgeted (see requestBudget): an operator's calls go through
	// while decisions wait.
	sluicepb.RegisterAdminServiceServer(g, &adminService{s: s})
	sluicepb.RegisterTrafficServiceServer(g, &trafficService{s: s})
}

// Interceptors returns the options that recover handlers' panics, require
// the admin token on admin and peer calls, and answer INVALID_ARGUMENT to a
// request that is not valid protobuf (see requestCodec).
func (s *Server) Interceptors() []grpc.ServerOption {
	c := newRequestCodec()
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(s.intercept(c)),
		grpc.ChainStreamInterceptor(c.checkDecodedStream, s.authorizeStream),
	}
}

// PeerCredentials returns what a node sends on its calls to its peers:
// adminToken, when one is set (nil otherwise), as the admin API checks
// it. secure says the connection is TLS, without which the token is not
// sent.
func PeerCredentials(adminToken string, secure bool) credentials.PerRPCCredentials {
	if adminToken == "" {
		return nil
	}
	return tokenCredentials{token: adminToken, secure: secure}
}

// joining is the error of a call a clustered node cannot serve before it
// joined: nil once it has (or for a single node).
func (s *Server) joining() error { return s.cluster.Joining() }

// SyncOverrides copies the overrides of another member, so that a node
// that joins (or returns) applies the same overrides as the others. The
// node calls it once it joined.
func (s *Server) SyncOverrides(ctx context.Context) {
	a := &adminService{s: s}
	s.overrides.Sync(ctx, func(ctx context.Context, o *sluicepb.Override) error {
		_, err := a.SetOverride(ctx, &sluicepb.SetOverrideRequest{Override: o})
		return err
	})
}
