package main

import (
	"cmp"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// envoyproxy/ratelimit reads its settings from environment variables. So
// that a Deployment of ratelimit carries over, serve reads those with a
// meaning in Sluice, below its own flags and SLUICE_* variables (which
// win), and lists in one log line the ones it found and ignores. The
// names and defaults are those of ratelimit's src/settings/settings.go.

// ratelimitIgnored are ratelimit's variables that have no meaning in
// Sluice: its storage backends, its statsd statistics (Sluice's are
// Prometheus counters on /metrics), its debug listener, and settings whose
// behaviour Sluice always has (RUNTIME_IGNOREDOTFILES,
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) or does not need.
var ratelimitIgnored = []string{
	"BACKEND_TYPE", "CACHE_KEY_PREFIX", "DEBUG_HOST", "DEBUG_PORT", "DISABLE_STATS",
	"EXPIRATION_JITTER_MAX_SECONDS", "EXTRA_TAGS", "FORCE_START_WITHOUT_INITIAL_CONFIG",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"GRPC_CLIENT_TLS_SAN", "GRPC_UDS", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"LOCAL_CACHE_SIZE_IN_BYTES", "MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV",
	"MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS", "PROMETHEUS_ADDR", "PROMETHEUS_MAPPER_YAML",
	"PROMETHEUS_PATH", "PROTO", "REDIS_AUTH", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
	"REDIS_PERSECOND", "REDIS_PERSECOND_URL", "REDIS_PIPELINE_LIMIT", "REDIS_PIPELINE_WINDOW",
	"REDIS_POOL_SIZE", "REDIS_SOCKET_TYPE", "REDIS_TLS", "REDIS_TYPE", "REDIS_URL",
	"RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT", "STATSD_HOST", "STATSD_PORT",
	"STATS_FLUSH_INTERVAL", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "USE_DOG_STATSD",
	"USE_DOG_STATSD_MOGRIFIERS", "USE_PROMETHEUS", "USE_STATSD",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_JITTER",
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
}

// ratelimitEnv is what serve took from envoyproxy/ratelimit's variables.
type ratelimitEnv struct {
	// used are the variables that set a flag (their names: values may
	// be secrets), in the order read.
	used []string
	// ignored are the variables set that have no meaning in Sluice.
	ignored []string
}

// applyRatelimitEnv sets the flags of fs (serve's) that were given neither
// on the command line nor by SLUICE_* from envoyproxy/ratelimit's
// variables. A value that does not parse is an error naming the variable.
func applyRatelimitEnv(fs *pflag.FlagSet, getenv func(string) string) (ratelimitEnv, error) {
	var r ratelimitEnv
	var errs []string
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	set := func(flag, value, from string) {
		if value == "" || fs.Lookup(flag).Changed {
			return
		}
		if err := fs.Set(flag, value); err != nil {
			errs = append(errs, fmt.Sprintf("environment variable %s: invalid value %q for --%s: %v", from, value, flag, err))
			return
		}
		r.used = append(r.used, from)
	}
	boolean := func(name string) (bool, bool) {
		v := get(name)
		if v == "" {
			return false, false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("environment variable %s=%q: want true or false", name, v))
			return false, false
		}
		return b, true
	}
	setBool := func(flag, name string) {
		if b, ok := boolean(name); ok {
			set(flag, strconv.FormatBool(b), name)
		}
	}
	// Addresses: ratelimit listens on 0.0.0.0 by default. A port that is
	// not a number is not ratelimit's (Kubernetes sets GRPC_PORT to
	// tcp://IP:PORT in the pods of a namespace with a Service named
	// grpc): it is listed as ignored, and so is its host.
	addr := func(flag, hostVar, portVar, port string) {
		h, p := get(hostVar), get(portVar)
		if h == "" && p == "" {
			return
		}
		if _, err := strconv.ParseUint(cmp.Or(p, port), 10, 16); err != nil {
			r.ignored = append(r.ignored, portVar)
			return
		}
		set(flag, net.JoinHostPort(cmp.Or(h, "0.0.0.0"), cmp.Or(p, port)), hostVar+", "+portVar)
	}
	addr("grpc-addr", "GRPC_HOST", "GRPC_PORT", "8081")
	addr("http-addr", "HOST", "PORT", "8080")
	set("max-connection-age", get("GRPC_MAX_CONNECTION_AGE"), "GRPC_MAX_CONNECTION_AGE")
	set("max-connection-age-grace", get("GRPC_MAX_CONNECTION_AGE_GRACE"), "GRPC_MAX_CONNECTION_AGE_GRACE")
	if tls, ok := boolean("GRPC_SERVER_USE_TLS"); ok && tls {
		set("tls-cert", get("GRPC_SERVER_TLS_CERT"), "GRPC_SERVER_TLS_CERT")
		set("tls-key", get("GRPC_SERVER_TLS_KEY"), "GRPC_SERVER_TLS_KEY")
		set("tls-client-ca", get("GRPC_CLIENT_TLS_CACERT"), "GRPC_CLIENT_TLS_CACERT")
	}
	if lvl := strings.ToLower(get("LOG_LEVEL")); lvl != "" {
		switch lvl { // logrus's levels
		case "trace":
			lvl = "debug"
		case "warning":
			lvl = "warn"
		case "fatal", "panic":
			lvl = "error"
		}
		set("log-level", lvl, "LOG_LEVEL")
	}
	set("log-format", strings.ToLower(get("LOG_FORMAT")), "LOG_FORMAT")

	// Where the limits come from.
	switch typ := strings.ToUpper(get("CONFIG_TYPE")); typ {
	case "", "FILE":
		root, sub := get("RUNTIME_ROOT"), get("RUNTIME_SUBDIRECTORY")
		if root != "" || sub != "" {
			app := cmp.Or(get("RUNTIME_APPDIRECTORY"), "config")
			set("limits-file", filepath.Join(cmp.Or(root, "/srv/runtime_data/current"), sub, app), "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY")
		}
	case "GRPC_XDS_SOTW":
		set("limits-xds-server", cmp.Or(get("CONFIG_GRPC_XDS_SERVER_URL"), "localhost:18000"), "CONFIG_GRPC_XDS_SERVER_URL")
		set("limits-xds-node-id", get("CONFIG_GRPC_XDS_NODE_ID"), "CONFIG_GRPC_XDS_NODE_ID")
		set("limits-xds-node-metadata", ratelimitMap(get("CONFIG_GRPC_XDS_NODE_METADATA")), "CONFIG_GRPC_XDS_NODE_METADATA")
		set("limits-xds-header", ratelimitMap(get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")), "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
		if tls, ok := boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS"); ok && tls {
			set("limits-xds-ca", get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
			set("limits-xds-cert", get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), "CONFIG_GRPC_XDS_CLIENT_TLS_CERT")
			set("limits-xds-key", get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"), "CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
		}
	default:
		errs = append(errs, fmt.Sprintf("environment variable CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", typ))
	}
	setBool("merge-domain-config", "MERGE_DOMAIN_CONFIG")
	set("near-limit-ratio", get("NEAR_LIMIT_RATIO"), "NEAR_LIMIT_RATIO")
	setBool("shadow", "SHADOW_MODE")
	setBool("response-dynamic-metadata", "RESPONSE_DYNAMIC_METADATA")
	// ratelimit's headers are the draft's version 03 under its names.
	if on, ok := boolean("LIMIT_RESPONSE_HEADERS_ENABLED"); ok && on {
		set("rate-limit-headers", "true", "LIMIT_RESPONSE_HEADERS_ENABLED")
		set("rate-limit-headers-format", "draft03", "LIMIT_RESPONSE_HEADERS_ENABLED")
	}
	set("limit-limit-header", get("LIMIT_LIMIT_HEADER"), "LIMIT_LIMIT_HEADER")
	set("limit-remaining-header", get("LIMIT_REMAINING_HEADER"), "LIMIT_REMAINING_HEADER")
	set("limit-reset-header", get("LIMIT_RESET_HEADER"), "LIMIT_RESET_HEADER")

	// Tracing: OTLP to OTEL_EXPORTER_OTLP_ENDPOINT (OpenTelemetry's
	// variable, which ratelimit's exporter reads; its default is the
	// local collector's).
	if on, ok := boolean("TRACING_ENABLED"); ok && on {
		if proto := strings.ToLower(get("TRACING_EXPORTER_PROTOCOL")); proto != "" && proto != "http" {
			errs = append(errs, fmt.Sprintf("environment variable TRACING_EXPORTER_PROTOCOL=%q: Sluice exports OTLP over HTTP only; set it to http and OTEL_EXPORTER_OTLP_ENDPOINT to the collector's HTTP port (4318)", proto))
		}
		endpoint := cmp.Or(get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT"), "http://localhost:4318")
		set("otlp-endpoint", endpoint, "TRACING_ENABLED, OTEL_EXPORTER_OTLP_ENDPOINT")
		set("trace-sample-ratio", get("TRACING_SAMPLING_RATE"), "TRACING_SAMPLING_RATE")
		set("trace-service-name", get("TRACING_SERVICE_NAME"), "TRACING_SERVICE_NAME")
	}
	for _, name := range ratelimitIgnored {
		if getenv(name) != "" {
			r.ignored = append(r.ignored, name)
		}
	}
	// Variables of a family (REDIS_PERSECOND_TLS, MEMCACHE_TLS_CACERT...)
	// beyond the names above are not looked for: the line lists what
	// matters to a reader, that ratelimit's backends are not used.
	slices.Sort(r.ignored)
	if len(errs) > 0 {
		return r, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return r, nil
}

// ratelimitMap turns ratelimit's map syntax (envconfig's "k1:v1,k2:v2")
// into pflag's ("k1=v1,k2=v2"); entries already with = stay.
func ratelimitMap(v string) string {
	if v == "" {
		return ""
	}
	parts := strings.Split(v, ",")
	for i, p := range parts {
		if !strings.Contains(p, "=") {
			parts[i] = strings.Replace(p, ":", "=", 1)
		}
	}
	return strings.Join(parts, ",")
}
