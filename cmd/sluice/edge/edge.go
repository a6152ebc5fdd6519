package edge

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/client/httplimit"
)

// Config configures an Edge. Build it with DefaultConfig; it is not
// modified after New.
type Config struct {
	// Listen is where the proxy listens. Default 127.0.0.1:8000.
	Listen string
	// Origin is the URL of the server the proxy forwards to, for example
	// http://127.0.0.1:3000. Required.
	Origin string
	// MetricsAddr is where /metrics and /healthz listen, apart from the
	// proxied paths. Default 127.0.0.1:9102; empty disables them.
	MetricsAddr string
	// Client configures the connection to Sluice: Addr (--sluice), the
	// deadline of a decision (20 ms), the denial cache, batching.
	Client client.Config
	// RulesFile is a YAML rules file (see RulesFile), reloaded when it
	// changes; a change that does not load is refused and the previous
	// rules stay in force. Empty: Rules.
	RulesFile string
	// RulesPollInterval is how often RulesFile is read to see whether it
	// changed. Default 2s.
	RulesPollInterval time.Duration
	// Rules are the rules when there is no RulesFile (sluice edge builds
	// one route from its --key, --limit, --window and --on-error flags).
	Rules *RulesFile
	// TrustedProxies are the proxies in front of the edge whose Forwarded
	// and X-Forwarded-For headers the ip key believes. Default none.
	TrustedProxies []netip.Prefix
	// KeyPrefix starts every Sluice key the edge counts under. Default
	// "edge|".
	KeyPrefix string
	// RetryAfterHeadroom and RetryAfterJitter shape Retry-After (see
	// httplimit.Config). Defaults 2s and 3s.
	RetryAfterHeadroom, RetryAfterJitter time.Duration
	// ShutdownTimeout bounds a graceful shutdown: requests in flight get
	// that long to finish. Default 10s.
	ShutdownTimeout time.Duration
	// Transport carries requests to the origin; nil is a copy of
	// http.DefaultTransport keeping up to 256 idle connections to it.
	Transport http.RoundTripper
	// Logger receives the edge's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults: the proxy on 127.0.0.1:8000, metrics
// on 127.0.0.1:9102, Sluice at 127.0.0.1:8081 with the client's defaults
// (20 ms, fail open).
func DefaultConfig() Config {
	cc := client.DefaultConfig()
	cc.Addr = "127.0.0.1:8081"
	return Config{
		Listen:            "127.0.0.1:8000",
		MetricsAddr:       "127.0.0.1:9102",
		Client:            cc,
		RulesPollInterval: 2 * time.Second,
		KeyPrefix:         "edge|",
		ShutdownTimeout:   10 * time.Second,
	}
}

// Validate reports every field that cannot work, at once.
func (c Config) Validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("edge: config: listen address is empty; set --listen"))
	}
	if c.Origin == "" {
		errs = append(errs, errors.New("edge: config: no origin; set --origin to the URL of the server to protect"))
	} else if u, err := url.Parse(c.Origin); err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("edge: config: origin %q: want an http:// or https:// URL with a host", c.Origin))
	}
	if c.RulesFile == "" && c.Rules == nil {
		errs = append(errs, errors.New("edge: config: no rules: give a rules file (--rules) or one rule (--key, --limit, --window)"))
	}
	if c.RulesFile != "" && c.Rules != nil {
		errs = append(errs, errors.New("edge: config: a rules file and rules from flags: give one of them"))
	}
	if c.Rules != nil {
		if err := c.Rules.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.RulesPollInterval < 0 || c.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("edge: config: durations must not be negative"))
	}
	if err := c.Client.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Edge is a rate-limiting reverse proxy: each request is matched to a
// route, decided by the route's rules (asking Sluice through package
// client), and forwarded to the origin or refused with a 429.
type Edge struct {
	cfg     Config
	log     *slog.Logger
	client  *client.Client
	proxy   *httputil.ReverseProxy
	reg     *prometheus.Registry
	metrics *metrics
	base    httplimit.Config // the limiters' shared configuration

	rules    atomic.Pointer[table]
	rulesSum [sha256.Size]byte // of the rules file in force; guarded by reloadMu
	reloadMu sync.Mutex

	srv, msrv     *http.Server
	lis, mlis     net.Listener
	serving       atomic.Bool
	stop          chan struct{}
	wg            sync.WaitGroup
	shutdownOnce  sync.Once
	shutdownError error
}

// New builds an Edge: its Sluice client, its proxy and its rules (the
// rules file read once: an error there is New's). Nothing listens until
// Start.
func New(cfg Config) (*Edge, error) {
	d := DefaultConfig()
	if cfg.RulesPollInterval == 0 {
		cfg.RulesPollInterval = d.RulesPollInterval
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = d.KeyPrefix
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = d.ShutdownTimeout
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	origin, _ := url.Parse(cfg.Origin)
	e := &Edge{cfg: cfg, log: cfg.Logger, reg: prometheus.NewRegistry(), stop: make(chan struct{})}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.log = e.log.With("component", "edge")
	if e.cfg.Client.Logger == nil {
		e.cfg.Client.Logger = e.log
	}
	var err error
	if e.client, err = client.New(e.cfg.Client); err != nil {
		return nil, err
	}
	e.metrics = newMetrics(e.reg, e.client)
	e.base = httplimit.Config{
		Client:             e.client,
		KeyPrefix:          cfg.KeyPrefix,
		TrustedProxies:     cfg.TrustedProxies,
		RetryAfterHeadroom: cfg.RetryAfterHeadroom,
		RetryAfterJitter:   cfg.RetryAfterJitter,
		Logger:             e.log,
	}
	if cfg.RulesFile != "" {
		if err := e.loadRules(); err != nil {
			e.client.Close()
			return nil, err
		}
	} else {
		t, err := build(cfg.Rules, e.base, e.metrics)
		if err != nil {
			e.client.Close()
			return nil, err
		}
		e.rules.Store(t)
	}
	transport := cfg.Transport
	if transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 256, 256
		transport = t
	}
	e.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(origin)
			// The chain of a trusted proxy goes on; anyone else's is
			// dropped, so the origin can believe what the edge sends.
			if xff := pr.In.Header.Values("X-Forwarded-For"); len(xff) > 0 && e.trustedPeer(pr.In) {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			pr.SetXForwarded()
			// X-Real-IP follows the same rule: the client as the edge
			// counts it (httplimit.ClientAddr), never what an untrusted
			// peer wrote.
			pr.Out.Header.Del("X-Real-Ip")
			if a := httplimit.ClientAddr(pr.In, e.cfg.TrustedProxies); a.IsValid() {
				pr.Out.Header.Set("X-Real-Ip", a.String())
			}
		},
		Transport:    transport,
		ErrorHandler: e.originError,
	}
	e.srv = &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(e.log.Handler(), slog.LevelWarn)}
	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{Registry: e.reg}))
		mux.HandleFunc("/healthz", e.healthz)
		e.msrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}
	return e, nil
}

// trustedPeer reports whether r came from one of the trusted proxies.
func (e *Edge) trustedPeer(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range e.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ServeHTTP limits and proxies one request.
func (e *Edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Match and forward one form of the path: "//login" and "/x/../login"
	// are "/login" for the rules and for the origin.
	r, err := httplimit.CleanRequest(r)
	if err != nil {
		e.metrics.badPath.Inc()
		httplimit.BadPath(w, err)
		return
	}
	rt := e.rules.Load().match(r)
	if rt == nil {
		e.metrics.unlimited.Inc()
		e.proxy.ServeHTTP(w, r)
		return
	}
	rt.limiter.ServeNext(w, r, e.proxy)
}

// originError answers 502 when the origin cannot be reached.
func (e *Edge) originError(w http.ResponseWriter, r *http.Request, err error) {
	e.metrics.originError.Inc()
	if !errors.Is(err, context.Canceled) {
		e.log.Warn("origin error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintln(w, `{"type":"about:blank","title":"Bad Gateway","status":502}`)
}

// healthz answers 200 while the edge serves, 503 before and once it
// stops. It does not depend on Sluice: the failure policies cover it.
func (e *Edge) healthz(w http.ResponseWriter, _ *http.Request) {
	if !e.serving.Load() {
		http.Error(w, "not serving", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// Start listens on Listen and MetricsAddr (an error there is Start's),
// then serves in the background, and polls the rules file.
func (e *Edge) Start() error {
	var err error
	if e.lis, err = net.Listen("tcp", e.cfg.Listen); err != nil {
		return fmt.Errorf("edge: listen on %s: %w", e.cfg.Listen, err)
	}
	if e.msrv != nil {
		if e.mlis, err = net.Listen("tcp", e.cfg.MetricsAddr); err != nil {
			e.lis.Close()
			return fmt.Errorf("edge: listen for metrics on %s: %w", e.cfg.MetricsAddr, err)
		}
	}
	e.serving.Store(true)
	serve := func(srv *http.Server, lis net.Listener) {
		defer e.wg.Done()
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error("HTTP server stopped", "addr", lis.Addr().String(), "err", err)
		}
	}
	e.wg.Add(1)
	go serve(e.srv, e.lis)
	if e.msrv != nil {
		e.wg.Add(1)
		go serve(e.msrv, e.mlis)
	}
	if e.cfg.RulesFile != "" {
		e.wg.Add(1)
		go e.pollRules()
	}
	e.log.Info("serving", "listen", e.Addr(), "metrics", e.MetricsAddr(), "origin", e.cfg.Origin, "sluice", e.cfg.Client.Addr)
	return nil
}

// Addr is the address the proxy is bound to.
func (e *Edge) Addr() string {
	if e.lis == nil {
		return ""
	}
	return e.lis.Addr().String()
}

// MetricsAddr is the address /metrics is bound to, "" if none.
func (e *Edge) MetricsAddr() string {
	if e.mlis == nil {
		return ""
	}
	return e.mlis.Addr().String()
}

// Registry is the edge's metrics registry.
func (e *Edge) Registry() *prometheus.Registry { return e.reg }

// Client is the edge's Sluice client.
func (e *Edge) Client() *client.Client { return e.client }

// Shutdown stops the edge gracefully: /healthz turns 503, the listeners
// close, requests in flight get until ctx or ShutdownTimeout ends to
// finish (then they are cut), and the Sluice client closes. Idempotent.
func (e *Edge) Shutdown(ctx context.Context) error {
	e.shutdownOnce.Do(func() {
		e.serving.Store(false)
		close(e.stop)
		ctx, cancel := context.WithTimeout(ctx, e.cfg.ShutdownTimeout)
		defer cancel()
		var errs []error
		if e.lis != nil {
			if err := e.srv.Shutdown(ctx); err != nil {
				e.log.Warn("graceful stop timed out; cutting requests in flight", "err", err)
				e.srv.Close()
			}
		}
		if e.mlis != nil {
			if err := e.msrv.Shutdown(ctx); err != nil {
				e.msrv.Close()
			}
		}
		e.wg.Wait()
		if t := e.rules.Load(); t != nil {
			if err := t.close(ctx); err != nil {
				errs = append(errs, fmt.Errorf("edge: settling quota leases: %w", err))
			}
		}
		if err := e.client.Close(); err != nil {
			errs = append(errs, err)
		}
		e.shutdownError = errors.Join(errs...)
		e.log.Info("stopped")
	})
	return e.shutdownError
}

// pollRules reloads the rules file when it changes, until Shutdown.
func (e *Edge) pollRules() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.RulesPollInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.ReloadRules()
		}
	}
}

// ReloadRules reads the rules file and puts it in force if it changed and
// loads; a change that does not load is logged and counted, and the rules
// in force stay. It is safe to call at any time (SIGHUP does).
func (e *Edge) ReloadRules() error {
	if e.cfg.RulesFile == "" {
		return nil
	}
	err := e.loadRules()
	if err != nil {
		e.log.Error("rules file refused; the previous rules stay in force", "file", e.cfg.RulesFile, "err", err)
	}
	return err
}

// loadRules reads, parses and builds the rules file and swaps it in if it
// changed.
func (e *Edge) loadRules() error {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	data, err := os.ReadFile(e.cfg.RulesFile)
	if err != nil {
		e.metrics.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("edge: rules: %w", err)
	}
	sum := sha256.Sum256(data)
	if e.rules.Load() != nil && sum == e.rulesSum {
		return nil
	}
	f, err := ParseRules(data)
	var t *table
	if err == nil {
		t, err = build(f, e.base, e.metrics)
	}
	if err != nil {
		e.rulesSum = sum // report a bad file once, not at every poll
		e.metrics.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("%s: %w", e.cfg.RulesFile, err)
	}
	old := e.rules.Swap(t)
	first := old == nil
	if !first {
		// The old rules' slices go back to their keys; a request still
		// deciding under them is checked with a call.
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.ShutdownTimeout)
		defer cancel()
		if err := old.close(ctx); err != nil {
			e.log.Warn("the replaced rules' quota leases were not all settled; their slices count until they expire", "err", err)
		}
	}
	e.rulesSum = sum
	e.metrics.reloads.WithLabelValues("ok").Inc()
	if !first {
		e.log.Info("rules file reloaded", "file", e.cfg.RulesFile, "routes", len(t.routes))
	}
	return nil
}
