package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	sluiceclient "github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/edge"
)

// edgeOptions holds the flags of sluice edge.
type edgeOptions struct {
	cfg            edge.Config
	trustedProxies string
	sluiceTLSCA    string
	// routing is --sluice-routing.
	routing string
	// One rule from flags, when there is no rules file.
	key string
	// responseCost is --response-cost.
	responseCost string
	name         string
	limit        int64
	window       time.Duration
	onError      string
	shadow       bool

	logFormat string
	logLevel  string
	readyFile string
}

func (c *cli) edgeCommand() *cobra.Command {
	o := &edgeOptions{cfg: edge.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "edge",
		Short: "Run a rate-limiting reverse proxy in front of an origin",
		Long: `Run a reverse proxy on --listen in front of --origin that limits requests
with Sluice (--sluice): each request goes through the rules of its route,
in one call to Sluice, and is forwarded to the origin or refused with 429.

Rules come from a YAML rules file (--rules: routes by path prefix and
method, a failure policy per route, shadow rules; reloaded when it changes,
the rules in force kept if a change does not load; docs/edge.md is the
reference), or, for one rule over every path, from --key, --limit,
--window and --on-error.

Keys: ip (the client IP; X-Forwarded-For and Forwarded are believed only
from --trusted-proxies), header:NAME, form:FIELD (a form or JSON body
field, e.g. a submitted username), query:NAME, method, path, route, or
several joined by + (ip+header:User-Agent).

A decision waits --decision-timeout (20 ms) at most; when Sluice is slow,
down or refuses, the rule's failure policy decides: open (the default)
forwards the request, closed refuses it. A denial Sluice made is repeated
from a local cache, without a call, until its retry_after.

Every answer carries RateLimit-Policy and RateLimit (IETF draft); a 429
carries Retry-After (retry_after + 2 s + 0 to 3 s of jitter), Cache-Control:
no-store and an RFC 9457 problem body. /metrics and /healthz are on
--metrics-addr. SIGHUP reloads the rules file now; SIGINT or SIGTERM stop
gracefully (requests in flight get --shutdown-timeout).

Every flag also reads SLUICE_<FLAG>; the command line wins.`,
		Example: `  sluice edge --origin http://127.0.0.1:3000 --key ip --limit 100 --window 1m
  sluice edge --origin http://127.0.0.1:3000 --key header:X-API-Key --limit 1000 --window 1h --on-error closed
  sluice edge --origin http://app:3000 --sluice sluice:8081 --rules /etc/sluice/edge.yaml --trusted-proxies 10.0.0.0/8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.edge(cmd.Context(), cmd, o)
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	cfg := &o.cfg
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "address the proxy listens on; port 0 picks a free port")
	fs.StringVar(&cfg.Origin, "origin", "", "URL of the server to protect, e.g. http://127.0.0.1:3000 (required)")
	fs.StringVar(&cfg.Client.Addr, "sluice", cfg.Client.Addr, "gRPC address of a Sluice node (any node of a cluster), or of several, comma-separated: each check then goes straight to the node that decides its key")
	fs.Var(newEnumValue(&o.routing, "auto", "auto", "on", "off"), "sluice-routing", "send each check to the node that decides its key: auto (when --sluice lists several addresses), on (learn the members from one address, e.g. a Kubernetes Service), off (every check to --sluice, which forwards)")
	fs.StringVar(&cfg.Client.Token, "sluice-token", "", "bearer token sent with every call to Sluice: the refund token (or admin token) that a node with one requires for quota leases (rules with lease); prefer SLUICE_SLUICE_TOKEN to the command line")
	fs.StringVar(&o.sluiceTLSCA, "sluice-tls-ca", "", "connect to Sluice with TLS, verifying it against this CA file (PEM)")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "address of /metrics and /healthz; empty disables them")
	fs.StringVar(&cfg.RulesFile, "rules", "", "YAML rules file (routes → rules), reloaded when it changes")
	fs.Var(newDurationValue(&cfg.RulesPollInterval, cfg.RulesPollInterval), "rules-poll-interval", "how often the rules file is checked for changes")
	fs.StringVar(&o.key, "key", "", "one rule without --rules: what to count requests by (ip, header:NAME, form:FIELD, query:NAME, method, path, route, or several joined by +)")
	fs.StringVar(&o.name, "name", "default", "one rule: its name (in keys, RateLimit-Policy and metrics)")
	fs.Int64Var(&o.limit, "limit", 0, "one rule: requests allowed per --window for each key")
	fs.Var(newDurationValue(&o.window, 0), "window", "one rule: the sliding window (90s, 15m, 1h, 7d)")
	fs.Var(newEnumValue(&o.onError, "open", "open", "closed"), "on-error", "one rule: when Sluice does not decide, open forwards the request, closed refuses it")
	fs.BoolVar(&o.shadow, "shadow", false, "one rule: count and log the requests it would deny, deny nothing")
	fs.StringVar(&o.responseCost, "response-cost", "", "one rule: a budget spent after the fact (LLM tokens): response-header:NAME or response-trailer:NAME, recorded when the response is done, even over the limit; a request goes through while the budget is below its limit")
	fs.StringVar(&o.trustedProxies, "trusted-proxies", "", "comma-separated addresses or CIDR prefixes of the proxies in front of the edge whose X-Forwarded-For and Forwarded headers the ip key believes (default none: the headers are ignored)")
	fs.Var(newDurationValue(&cfg.Client.Timeout, cfg.Client.Timeout), "decision-timeout", "longest wait for Sluice's decision; past it the failure policy decides")
	fs.IntVar(&cfg.Client.CacheSize, "cache-size", cfg.Client.CacheSize, "keys in the local denial cache (negative disables it)")
	fs.IntVar(&cfg.Client.MaxBatch, "max-batch", cfg.Client.MaxBatch, "most checks in one call to Sluice")
	fs.Var(newDurationValue(&cfg.Client.BatchWait, 0), "batch-wait", "how long a call to Sluice waits for more checks to join it (0: only those queued meanwhile)")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", cfg.KeyPrefix, "start of every Sluice key the edge counts under")
	fs.Var(newDurationValue(&cfg.RetryAfterHeadroom, 2*time.Second), "retry-after-headroom", "added to retry_after in Retry-After")
	fs.Var(newDurationValue(&cfg.RetryAfterJitter, 3*time.Second), "retry-after-jitter", "most random time added to Retry-After")
	fs.Var(newDurationValue(&cfg.ShutdownTimeout, cfg.ShutdownTimeout), "shutdown-timeout", "how long a graceful stop lets requests in flight finish")
	fs.Var(newEnumValue(&o.logFormat, "text", "text", "json"), "log-format", "log format")
	fs.Var(newEnumValue(&o.logLevel, "info", "debug", "info", "warn", "error"), "log-level", "least severe level logged")
	fs.StringVar(&o.readyFile, "ready-file", "", `once serving, write the bound addresses to this file as JSON {"listen":...,"metrics_addr":...,"pid":...}; removed at stop`)
	bindAllEnv(fs)
	return cmd
}

// config turns the flags into the edge's configuration.
func (o *edgeOptions) config(cmd *cobra.Command) (edge.Config, error) {
	cfg := o.cfg
	fs := cmd.Flags()
	ruleFlags := fs.Changed("key") || fs.Changed("limit") || fs.Changed("window") || fs.Changed("shadow") || fs.Changed("name") || fs.Changed("response-cost")
	switch {
	case cfg.RulesFile != "" && ruleFlags:
		return cfg, errors.New("--rules and --key, --limit, --window: give a rules file or one rule, not both")
	case cfg.RulesFile == "":
		if o.key == "" || o.limit <= 0 || o.window <= 0 {
			return cfg, errors.New("no rules: give --rules FILE, or --key, --limit and --window for one rule")
		}
		cfg.Rules = &edge.RulesFile{Routes: []edge.RouteSpec{{
			Name:       "default",
			PathPrefix: "/",
			OnError:    o.onError,
			Rules: []edge.RuleSpec{{
				Name: o.name, Key: o.key, Limit: o.limit, Window: o.window.String(), Shadow: o.shadow, ResponseCost: o.responseCost,
			}},
		}}}
	case fs.Changed("on-error"):
		return cfg, errors.New("--on-error goes with one rule from flags; in a rules file, set on_error per route or rule")
	}
	for _, p := range strings.Split(o.trustedProxies, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			a, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return cfg, fmt.Errorf("--trusted-proxies: %q is neither an address nor a CIDR prefix", p)
			}
			prefix = netip.PrefixFrom(a, a.BitLen())
		}
		cfg.TrustedProxies = append(cfg.TrustedProxies, prefix.Masked())
	}
	if o.sluiceTLSCA != "" {
		pem, err := os.ReadFile(o.sluiceTLSCA)
		if err != nil {
			return cfg, fmt.Errorf("--sluice-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, fmt.Errorf("--sluice-tls-ca %s holds no PEM certificate", o.sluiceTLSCA)
		}
		creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool})
		cfg.Client.DialOptions = append(cfg.Client.DialOptions, grpc.WithTransportCredentials(creds))
	}
	routing, err := sluiceclient.ParseRouting(o.routing)
	if err != nil {
		return cfg, fmt.Errorf("--sluice-routing: %w", err)
	}
	cfg.Client.Routing = routing
	if cfg.Client.Timeout <= 0 {
		return cfg, fmt.Errorf("--decision-timeout %v: want a positive duration", cfg.Client.Timeout)
	}
	if cfg.RetryAfterHeadroom == 0 {
		cfg.RetryAfterHeadroom = -1 // zero means the default in httplimit
	}
	if cfg.RetryAfterJitter == 0 {
		cfg.RetryAfterJitter = -1
	}
	return cfg, nil
}

// edge runs the proxy until ctx ends, then shuts it down gracefully.
func (c *cli) edge(ctx context.Context, cmd *cobra.Command, o *edgeOptions) error {
	cfg, err := o.config(cmd)
	if err != nil {
		return err
	}
	log := newLogger(c.stderr, o.logFormat, o.logLevel)
	cfg.Logger = log
	if o.readyFile != "" {
		if err := os.Remove(o.readyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale ready file: %w", err)
		}
	}
	e, err := edge.New(cfg)
	if err != nil {
		return err
	}
	stopCtx := context.WithoutCancel(ctx)
	if err := e.Start(); err != nil {
		e.Shutdown(stopCtx)
		return err
	}
	log.Info("sluice edge", "version", buildVersion().Version, "listen", e.Addr(), "metrics_addr", e.MetricsAddr(),
		"origin", cfg.Origin, "sluice", cfg.Client.Addr, "rules", cfg.RulesFile, "decision_timeout", cfg.Client.Timeout,
		"trusted_proxies", o.trustedProxies)
	if o.readyFile != "" {
		if err := writeEdgeReadyFile(o.readyFile, e.Addr(), e.MetricsAddr()); err != nil {
			e.Shutdown(stopCtx)
			return err
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for ctx.Err() == nil {
		select {
		case <-hup:
			if err := e.ReloadRules(); err == nil {
				log.Info("rules file checked", "file", cfg.RulesFile)
			}
		case <-ctx.Done():
		}
	}
	if o.readyFile != "" {
		os.Remove(o.readyFile)
	}
	log.Info("shutting down", "reason", context.Cause(ctx).Error(), "timeout", cfg.ShutdownTimeout)
	if err := e.Shutdown(stopCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// edgeReady is the content of sluice edge's --ready-file.
type edgeReady struct {
	Listen      string `json:"listen"`
	MetricsAddr string `json:"metrics_addr"`
	PID         int    `json:"pid"`
}

// writeEdgeReadyFile writes the addresses to path atomically.
func writeEdgeReadyFile(path, listen, metrics string) error {
	b, err := json.Marshal(edgeReady{Listen: listen, MetricsAddr: metrics, PID: os.Getpid()})
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}
