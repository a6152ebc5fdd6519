package node

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/persist"
)

// Config configures a node. Build it with DefaultConfig and change what you
// need; it is not modified after New.
type Config struct {
	// NodeName names the node in decisions, logs and the cluster. Default:
	// the host name.
	NodeName string
	// GRPCAddr is where the gRPC API listens (native, Envoy RLS v3, admin,
	// health, reflection). Default 127.0.0.1:8081.
	GRPCAddr string
	// HTTPAddr is where /metrics, /healthz, /readyz and the web UI (/ui/)
	// listen. Default 127.0.0.1:8080. Empty disables the HTTP listener.
	HTTPAddr string
	// DataDir holds the data file, sluice.db. Default "sluice-data".
	DataDir string
	// Durability is "commit" (default: a decision is acknowledged once its
	// hits are written to the data file; survives kill -9), "fsync" (also
	// synced to the disk; survives power loss), "async" (acknowledged at
	// once, written continuously; kill -9 loses the last few milliseconds)
	// or "memory" (no data file; a restart forgets everything).
	Durability string
	// LimitsFile is an envoyproxy/ratelimit YAML file, or a directory of
	// them, giving limits to descriptors and keys that carry none. Reloaded
	// when it changes. Empty: no limits file.
	LimitsFile string
	// LimitsPollInterval is how often the limits file is checked for
	// changes. Default 2s.
	LimitsPollInterval time.Duration
	// AcceptWALLoss opens a data file whose WAL ends with a damaged frame,
	// dropping it (see persist.Options.AcceptWALLoss).
	AcceptWALLoss bool
	// AdminToken, when set, is the bearer token the admin API requires.
	AdminToken string
	// RefundToken, when set, is a bearer token that allows refunds and
	// nothing else (see api.Config.RefundToken).
	RefundToken string
	// TLSCert and TLSKey, when set, serve gRPC and HTTP over TLS.
	TLSCert, TLSKey string
	// TLSClientCA, when set, requires client certificates signed by it.
	TLSClientCA string
	// RateLimitHeaders makes Envoy responses carry the IETF RateLimit-Policy
	// and RateLimit header fields and Retry-After for the client.
	RateLimitHeaders bool
	// Pprof serves Go's profiles on the HTTP listener under /debug/pprof/.
	// Off by default: profiles reveal internals and cost CPU while taken.
	Pprof bool
	// MaxMessageBytes bounds a gRPC request. Default 4 MiB.
	MaxMessageBytes int
	// ShutdownTimeout bounds a graceful shutdown before in-flight calls are
	// cut. Default 10s.
	ShutdownTimeout time.Duration
	// Engine configures the actors; its Store, Clock and Logger are set by
	// New.
	Engine actor.Config
	// Cluster, when not nil, makes the node a member of a cluster: its
	// NodeName and GRPCAddr are set by Start. Nil runs a single node.
	Cluster *cluster.Config
	// Router tunes forwarding, handoff and leases in a cluster; its
	// Membership, Engine, Self, Store and DialOptions are set by Start.
	Router cluster.RouterConfig
	// Clock tells the time; nil is the wall clock.
	Clock clock.Clock
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration of a single node on an embedded
// data file in ./sluice-data.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "sluice"
	}
	return Config{
		NodeName:           host,
		GRPCAddr:           "127.0.0.1:8081",
		HTTPAddr:           "127.0.0.1:8080",
		DataDir:            "sluice-data",
		Durability:         "commit",
		LimitsPollInterval: 2 * time.Second,
		MaxMessageBytes:    4 << 20,
		ShutdownTimeout:    10 * time.Second,
	}
}

// Validate reports a configuration that cannot work, saying what to change.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("node: config: node name is empty; set --node-name")
	case c.GRPCAddr == "":
		return errors.New("node: config: gRPC address is empty; set --grpc-addr")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("node: config: --tls-cert and --tls-key go together")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return errors.New("node: config: --tls-client-ca needs --tls-cert and --tls-key")
	case c.MaxMessageBytes < 0 || c.ShutdownTimeout < 0 || c.LimitsPollInterval < 0:
		return errors.New("node: config: sizes and durations must not be negative")
	}
	if c.Durability != "memory" {
		if _, err := persist.ParseMode(c.Durability); err != nil {
			return fmt.Errorf("node: config: durability %q: want commit, fsync, async or memory", c.Durability)
		}
		if c.DataDir == "" {
			return errors.New("node: config: data dir is empty; set --data-dir or --durability memory")
		}
	}
	return c.Engine.Validate()
}
