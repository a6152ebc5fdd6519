package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	sluiceclient "github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/loadgen"
)

// benchFlags names the flag of each loadgen.Config field, for errors.
var benchFlags = map[string]string{
	"API":         "api",
	"Concurrency": "concurrency",
	"Connections": "connections",
	"Duration":    "duration",
	"Warmup":      "warmup",
	"Rate":        "rate",
	"Keys":        "keys",
	"Dist":        "dist",
	"ZipfS":       "zipf-s",
	"KeyPrefix":   "key-prefix",
	"Batch":       "batch",
	"Limit":       "limit",
	"Window":      "window",
	"Algorithm":   "algorithm",
	"Timeout":     "timeout",
	"Seed":        "seed",
}

func (c *cli) benchCommand() *cobra.Command {
	var (
		co        clientOptions
		cfg       = loadgen.DefaultConfig()
		api       string
		dist      string
		algorithm string
		routing   string
		quiet     bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive a node with checks and report decisions/s and latency",
		Long: `Drive the node at --addr with checks through the native API or Envoy's
RLS v3 API for --duration, after --warmup, and report the throughput, the
decisions and the latency of the calls. It talks to --addr only, except
with --api client given several addresses (--addr a:8081,b:8081,c:8081):
Sluice's Go client then learns the members and sends each check to the
node that decides its key (--routing off sends them all to the first
address that answers, as --api native does).

Closed loop (the default): --concurrency workers each send a call, wait for
the answer, and send the next: this measures capacity. Open loop (--rate):
calls are scheduled evenly at --rate calls/s whatever the server does, and
latency is measured from each call's scheduled time, so that queueing (in
the server or in the generator) shows up in the latency instead of lowering
the load. Only a free worker's own lateness is left out: one that waited
for a call's time and woke late (Go's timers fire up to a millisecond late
in an idle process) measures from when it woke, and the report gives that
delay apart. Calls that were due but that no worker was free to send before
the end are reported as unsent.

Each call carries --batch checks, on keys <key-prefix><n> picked among
--keys keys (--dist uniform or zipf) or always the same one (--dist hot),
each with --limit hits per --window. The default limit lets every check
through, to measure the decision path; a low limit measures denials (the
warmup's checks count on the node too: give --warmup 0 to see every hit of
a low limit in the report). Over Envoy's API, each check is a descriptor
key=<key-prefix><n> of the domain "bench", which Sluice counts under
"bench|key=<key-prefix><n>".

Only the connection flags (--addr, --admin-token, --timeout, --tls*,
--insecure, --output) read SLUICE_<FLAG>; the flags of the load do not.

A progress line goes to stderr every second (unless --quiet). The run stops
at the end of --duration (calls in flight then get --timeout to finish), or
at the first SIGINT, printing what it measured. It stops with an error if
the server refuses the checks (INVALID_ARGUMENT) or the API.

Latency is per call, failed calls included, recorded in an HDR histogram
with 3 significant digits (within 0.1%); the maximum is exact.

The fields of -o json are stable:
  calls, decisions, allowed, denied, errors   counts over the recorded time
                                (allowed + denied = decisions = batch ×
                                calls that did not fail)
  calls_per_s, decisions_per_s  per second of recorded time
  elapsed_s                     recorded time: --duration unless interrupted
  p50_us, p90_us, p99_us, p999_us, max_us, mean_us   latency, µs
  error_codes                   failed calls by gRPC code name
  first_error                   "Code: message" of the earliest failure
  unsent                        open loop: due calls never sent
  wake_late_mean_us, wake_late_max_us   open loop: how late free workers
                                woke for their calls, µs (left out of the
                                latency)
  unfinished                    calls cut by an interruption
  interrupted                   stopped by SIGINT before --duration
  settings                      addr, api, mode (closed|open), rate,
                                concurrency, connections, duration_s,
                                warmup_s, keys, dist, zipf_s, key_prefix,
                                batch, limit, window_ms, algorithm,
                                timeout_ms, seed`,
		Example: `  sluice bench
  sluice bench --api envoy --batch 10 --dist zipf -o json
  sluice bench --rate 20000 --duration 30s
  sluice bench --dist hot --limit 100 --window 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := cmd.Flags()
			if err := benchConfig(fs, &cfg, &co, api, dist, algorithm); err != nil {
				return err
			}
			if !quiet {
				cfg.Progress = func(p loadgen.Progress) { printProgress(cmd.ErrOrStderr(), p) }
			}
			if fs.Changed("routing") && cfg.API != loadgen.Client {
				return errors.New("--routing applies to --api client")
			}
			var rep *loadgen.Report
			var err error
			if cfg.API == loadgen.Client {
				rep, err = runClientBench(cmd.Context(), &co, cfg, routing, cmd.ErrOrStderr())
			} else {
				rep, err = runBench(cmd.Context(), &co, cfg)
			}
			if err != nil {
				return err
			}
			if co.json() {
				b, err := json.MarshalIndent(rep, "", "  ")
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(append(b, '\n'))
				return err
			}
			return printReport(cmd.OutOrStdout(), rep)
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.Var(newEnumValue(&api, string(cfg.API), string(loadgen.Native), string(loadgen.Envoy), string(loadgen.Client)), "api",
		"API of the calls: native (sluice.v1 Check), envoy (RLS v3 ShouldRateLimit) or client (the Go client, shared by the workers)")
	fs.Var(newEnumValue(&routing, "auto", "auto", "on", "off"), "routing",
		"--api client: send each check to its key's owner (auto: when --addr lists several addresses)")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "workers, each with one call in flight at most")
	fs.IntVar(&cfg.Connections, "connections", cfg.Connections, "gRPC connections the workers share (not with --api client, whose client holds one per node)")
	fs.Lookup("connections").DefValue = "min(--concurrency, 8)"
	fs.Var(newDurationValue(&cfg.Duration, cfg.Duration), "duration", "how long calls are recorded, after the warmup")
	fs.Var(newDurationValue(&cfg.Warmup, cfg.Warmup), "warmup", "how long calls are sent first without being recorded")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop: calls per second, evenly scheduled, latency measured from the schedule; 0: closed loop")
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "distinct keys, for --dist uniform and zipf")
	fs.Var(newEnumValue(&dist, string(cfg.Dist), string(loadgen.Uniform), string(loadgen.Zipf), string(loadgen.Hot)), "dist",
		"how keys are picked: uniform, zipf (key n with probability ∝ (1+n)^-s) or hot (always one key)")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", cfg.ZipfS, "exponent s of --dist zipf, above 1: the higher, the more skewed")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", cfg.KeyPrefix, "start of every key; key n is the prefix and n")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "checks per call")
	fs.Int64Var(&cfg.Limit, "limit", cfg.Limit, "limit of every check, in hits per --window (the default lets everything through)")
	fs.Var(newDurationValue(&cfg.Window, cfg.Window), "window", "window of every check (whole seconds with --api envoy)")
	fs.Var(newEnumValue(&algorithm, "", algorithmNames...), "algorithm", "algorithm of every check (default: the server's choice); native API only")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the key picks, to repeat a run's keys")
	fs.BoolVarP(&quiet, "quiet", "q", false, "no progress line on stderr")
	// The connection flags read the environment; the flags above do not.
	conn := pflag.NewFlagSet("connection", pflag.ContinueOnError)
	conn.SortFlags = false
	co.register(conn)
	conn.Lookup("output").Usage = "output format: table for people, json for scripts (the fields above) [$" + envName("output") + "]"
	fs.AddFlagSet(conn)
	return cmd
}

// benchConfig fills cfg from the flags of bench and validates it; errors
// name the flags.
func benchConfig(fs *pflag.FlagSet, cfg *loadgen.Config, co *clientOptions, api, dist, algorithm string) error {
	cfg.Addr = co.addr
	cfg.API = loadgen.API(api)
	cfg.Dist = loadgen.Dist(dist)
	cfg.Algorithm = protoAlgorithm(algorithm)
	cfg.Timeout = co.timeout
	if !fs.Changed("connections") {
		cfg.Connections = min(cfg.Concurrency, 8)
	}
	switch {
	case co.addr == "":
		return errors.New("--addr is empty: give the gRPC address of a Sluice node")
	case fs.Changed("zipf-s") && cfg.Dist != loadgen.Zipf:
		return fmt.Errorf("--zipf-s applies to --dist zipf, not %s", cfg.Dist)
	case fs.Changed("keys") && cfg.Dist == loadgen.Hot:
		return errors.New("--keys: --dist hot uses one key; give --dist uniform or zipf")
	}
	if err := cfg.Validate(); err != nil {
		var ce *loadgen.ConfigError
		if errors.As(err, &ce) {
			if name, ok := benchFlags[ce.Field]; ok {
				return fmt.Errorf("--%s %s: %s", name, fs.Lookup(name).Value, ce.Reason)
			}
		}
		return err
	}
	return nil
}

// runBench dials cfg.Connections connections to --addr, checks that each
// answers, and runs the load.
func runBench(ctx context.Context, co *clientOptions, cfg loadgen.Config) (*loadgen.Report, error) {
	if err := checkAddr(co.addr); err != nil {
		return nil, err
	}
	creds, err := co.transportCredentials()
	if err != nil {
		return nil, err
	}
	errs := &client{opts: co} // for callError
	conns := make([]grpc.ClientConnInterface, 0, cfg.Connections)
	for range cfg.Connections {
		cc, err := grpc.NewClient(co.addr,
			grpc.WithTransportCredentials(creds),
			grpc.WithUserAgent("sluice-bench/"+buildVersion().Version))
		if err != nil {
			return nil, fmt.Errorf("--addr %s: %w", co.addr, err)
		}
		defer cc.Close()
		conns = append(conns, cc)
	}
	if co.adminToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+co.adminToken)
	}
	for _, cc := range conns {
		pctx, cancel := context.WithTimeout(ctx, co.timeout)
		err := loadgen.Probe(pctx, cfg.API, cc)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			return nil, errs.callError(err)
		}
	}
	rep, err := loadgen.Run(ctx, cfg, conns)
	if err != nil {
		var ce *loadgen.ConfigError
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, fmt.Errorf("stopped: %w", errs.callError(err))
	}
	return rep, nil
}

// runClientBench runs the load through one client.Client of --addr (one
// address or several, comma-separated), connected first.
// It writes what the client did to stderr.
func runClientBench(ctx context.Context, co *clientOptions, cfg loadgen.Config, routing string, stderr io.Writer) (*loadgen.Report, error) {
	for _, a := range strings.Split(co.addr, ",") {
		if err := checkAddr(strings.TrimSpace(a)); err != nil {
			return nil, err
		}
	}
	creds, err := co.transportCredentials()
	if err != nil {
		return nil, err
	}
	ccfg := sluiceclient.DefaultConfig()
	ccfg.Addr = co.addr
	ccfg.Timeout = co.timeout
	ccfg.Token = co.adminToken
	ccfg.CacheSize = -1 // measure Sluice, not the client's denial cache
	ccfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithUserAgent("sluice-bench/" + buildVersion().Version)}
	if ccfg.Routing, err = sluiceclient.ParseRouting(routing); err != nil {
		return nil, err
	}
	c, err := sluiceclient.New(ccfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, max(co.timeout, 5*time.Second))
	err = c.Connect(cctx)
	cancel()
	if err != nil {
		return nil, err
	}
	rep, err := loadgen.RunClient(ctx, cfg, c)
	if err != nil {
		var ce *loadgen.ConfigError
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, fmt.Errorf("stopped: %w", err)
	}
	if s := c.Stats(); s.Calls > 0 {
		fmt.Fprintf(stderr, "client: %d calls, %.1f checks/call, %d checks routed to their owner, %d forwarded by the node called, %d views of the members\n",
			s.Calls, float64(s.Batched)/float64(s.Calls), s.Routed, s.Forwarded, s.RouteViews)
	}
	return rep, nil
}

// printProgress writes one line of live progress.
func printProgress(w io.Writer, p loadgen.Progress) {
	phase := "running"
	if p.Warmup {
		phase = "warmup"
	}
	p99 := "-"
	if p.Calls > 0 {
		p99 = fmtLatency(p.P99)
	}
	fmt.Fprintf(w, "%6s %-7s %10.0f calls/s %10.0f decisions/s  p99 %-8s  errors %d\n",
		p.Elapsed.Round(time.Second), phase, p.CallsPerS, p.DecisionsPerS, p99, p.Errors)
}

// printReport writes r as a two-column table: the settings, then the
// results.
func printReport(w io.Writer, r *loadgen.Report) error {
	s := &r.Settings
	tw := newTable(w)
	row := func(name, format string, args ...any) { fmt.Fprintf(tw, name+"\t"+format+"\n", args...) }

	row("addr", "%s", s.Addr)
	row("api", "%s", s.API)
	if s.Mode == "open" {
		row("mode", "open loop at %g calls/s, %d workers on %d connections", s.Rate, s.Concurrency, s.Connections)
	} else {
		row("mode", "closed loop, %d workers on %d connections", s.Concurrency, s.Connections)
	}
	row("duration", "%v after %v of warmup", secs(s.DurationS), secs(s.WarmupS))
	keys := fmt.Sprintf("%d, %s", s.Keys, s.Dist)
	if s.Dist == loadgen.Zipf {
		keys += fmt.Sprintf(" s=%g", s.ZipfS)
	}
	row("keys", "%s, prefix %q", keys, s.KeyPrefix)
	algo := s.Algorithm
	if algo == "" {
		algo = "server's algorithm"
	}
	row("checks", "%d per call, limit %d per %v, %s", s.Batch, s.Limit, time.Duration(s.WindowMs*float64(time.Millisecond)), algo)
	fmt.Fprintln(tw)

	if r.Interrupted {
		row("elapsed", "%v (interrupted)", secs(r.ElapsedS))
	} else {
		row("elapsed", "%v", secs(r.ElapsedS))
	}
	row("calls", "%d (%.0f/s)", r.Calls, r.CallsPerS)
	row("decisions", "%d (%.0f/s)", r.Decisions, r.DecisionsPerS)
	row("allowed", "%d", r.Allowed)
	row("denied", "%d", r.Denied)
	row("errors", "%d", r.Errors)
	if r.Errors > 0 {
		var codes []string
		for _, name := range r.ErrorCodeNames() {
			codes = append(codes, fmt.Sprintf("%s %d", name, r.ErrorCodes[name]))
		}
		row("errors by code", "%s", strings.Join(codes, ", "))
		row("first error", "%s", fmtText(r.FirstError))
	}
	if r.Unsent > 0 {
		row("unsent", "%d (due but not sent: the generator fell behind; raise --concurrency or lower --rate)", r.Unsent)
	}
	if r.Unfinished > 0 {
		row("unfinished", "%d (cut by the interruption)", r.Unfinished)
	}
	if r.WakeLateMaxUs > 0 {
		row("generator late", "%s mean, %s max (workers that woke late for a call's time; left out of its latency)",
			fmtLatency(time.Duration(r.WakeLateMeanUs*float64(time.Microsecond))), fmtLatency(time.Duration(r.WakeLateMaxUs*float64(time.Microsecond))))
	}
	for _, q := range []struct {
		name string
		us   float64
	}{{"p50", r.P50us}, {"p90", r.P90us}, {"p99", r.P99us}, {"p99.9", r.P999us}, {"max", r.MaxUs}, {"mean", r.MeanUs}} {
		row("latency "+q.name, "%s", fmtLatency(time.Duration(q.us*float64(time.Microsecond))))
	}
	return tw.Flush()
}

// fmtLatency shows a latency to the microsecond.
func fmtLatency(d time.Duration) string {
	return d.Round(time.Microsecond).String()
}

// secs turns seconds into a duration, to the millisecond.
func secs(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
}
