package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/api/limits"
	"github.com/sluice-io/sluice/api/traffic"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/persist"
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
}

// Defaults of Config's request budget.
const (
	DefaultMaxInflightBytes     = 2 << 20
	DefaultMaxConnInflightBytes = 512 << 10
	DefaultBudgetWait           = time.Second
)

// Deps are the parts of the node the services adapt. The node (see
// cmd/sluice/node) builds and owns them; the services never close them.
type Deps struct {
	// Engine decides the checks. Required.
	Engine *actor.Engine
	// Store keeps the overrides (meta bucket "overrides"); nil keeps them
	// in memory only.
	Store *persist.Store
	// Limits is the limits file in force; nil when there is none.
	Limits *limits.Watcher
	// Clustered says the node is a member of a cluster: until Router
	// returns one, checks are refused (UNAVAILABLE), never decided by the
	// engine alone.
	Clustered bool
	// Router returns the node's cluster router: nil for a single node
	// (checks go to Engine), or before a clustered node joined.
	Router func() *cluster.Router
	// Membership returns the node's membership, nil for a single node or
	// before the node joined.
	Membership func() *cluster.Membership
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
// admin API, adapting calls to the engine (or, in a cluster, to the
// router), with errors mapped to statuses in one place (status.go).
type Server struct {
	budget     *requestBudget
	cfg        Config
	log        *slog.Logger
	clock      clock.Clock
	store      *persist.Store
	engine     *actor.Engine
	limits     *limits.Watcher
	overrides  *overrideTable
	metrics    *metrics
	router     func() *cluster.Router
	membership func() *cluster.Membership
	grpcAddr   func() string
	clustered  bool
	traffic    *traffic.Recorder // nil only in benchmarks that measure its cost
	started    time.Time
	// headerNames is cfg.HeaderNames with the defaults filled in.
	headerNames HeaderNames
	ruleStats   *ruleStats
	// usageDomains is cfg.UsageDomains as a set; usageAll is "*" in it.
	usageDomains map[string]bool
	usageAll     bool
}

// New builds the services and loads the overrides kept in d.Store.
func New(cfg Config, d Deps) (*Server, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("api: config: node name is empty")
	}
	if d.Engine == nil {
		return nil, errors.New("api: no engine")
	}
	if d.Clock == nil {
		d.Clock = clock.Real{}
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Router == nil {
		d.Router = func() *cluster.Router { return nil }
	}
	if d.Membership == nil {
		d.Membership = func() *cluster.Membership { return nil }
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
		cfg:    cfg, log: d.Logger, clock: d.Clock, store: d.Store, engine: d.Engine, limits: d.Limits,
		router: d.Router, membership: d.Membership, grpcAddr: d.GRPCAddr, clustered: d.Clustered,
		metrics: newMetrics(d.Registry), started: d.Clock.Now(), headerNames: cfg.HeaderNames.withDefaults(),
	}
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
	var overrides []*Override
	if s.store != nil {
		if overrides, err = loadOverrides(s.store); err != nil {
			return nil, err
		}
	}
	s.overrides = newOverrideTable(overrides)
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
		grpc.ChainUnaryInterceptor(c.checkDecoded, s.recoverPanics, s.authorize),
		grpc.ChainStreamInterceptor(c.checkDecodedStream, s.authorizeStream),
	}
}

// PeerCredentials returns what a node sends on its calls to its peers:
// the admin token, when one is set (nil otherwise). secure says the
// connection is TLS, without which the token is not sent.
func (s *Server) PeerCredentials(secure bool) credentials.PerRPCCredentials {
	if s.cfg.AdminToken == "" {
		return nil
	}
	return tokenCredentials{token: s.cfg.AdminToken, secure: secure}
}

// joining is the error of a call a clustered node cannot serve before it
// joined: nil once it has (or for a single node).
func (s *Server) joining() error {
	if s.clustered && s.router() == nil {
		return fmt.Errorf("%w: %s is still joining the cluster", cluster.ErrNoQuorum, s.cfg.NodeName)
	}
	return nil
}

// Membership is the node's cluster membership, nil for a single node.
func (s *Server) Membership() *cluster.Membership { return s.membership() }

// SyncOverrides copies the overrides of another member, so that a node
// that joins (or returns) applies the same overrides as the others. The
// node calls it once it joined.
func (s *Server) SyncOverrides(ctx context.Context) { s.syncOverrides(ctx) }
