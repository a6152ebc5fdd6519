package node

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster"
)

// TestValidateReportsEveryProblem: Validate names every setting that
// cannot work in one error, each on its own line, and accepts the
// defaults.
func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	clustered := func(c *Config) {
		cc := cluster.DefaultConfig()
		c.Cluster = &cc
	}
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want []string // one line each, in any order
	}{
		{"defaults", func(*Config) {}, nil},
		{"several negatives", func(c *Config) {
			c.Engine.Actors, c.MaxConnections, c.ShutdownTimeout, c.KeepaliveTimeout = -1, -2, -time.Second, -time.Second
		}, []string{"--actors -1: must not be negative", "--max-connections -2: must not be negative", "--shutdown-timeout -1s: must not be negative", "--keepalive-timeout -1s: must not be negative"}},
		{"names, TLS and ratio", func(c *Config) {
			c.NodeName, c.TLSCert, c.NearLimitRatio, c.RateLimitHeadersFormat = "", "c.pem", 1.5, "draft99"
		}, []string{"node name is empty", "--tls-cert and --tls-key go together", "--near-limit-ratio 1.5", "--rate-limit-headers-format \"draft99\""}},
		{"durability and limits", func(c *Config) {
			c.Durability, c.LimitsFile, c.LimitsXDS.Server, c.UsageDomains = "sometimes", "l.yaml", "xds:1", []string{""}
		}, []string{"durability \"sometimes\"", "--limits-file and --limits-xds-server", "--usage-domain: an empty domain"}},
		{"open listeners, one error", func(c *Config) {
			c.GRPCAddr, c.HTTPAddr = "0.0.0.0:0", "0.0.0.0:0"
		}, []string{"--grpc-addr 0.0.0.0:0: the admin API (key reset, overrides) would be open to the network"}},
		{"open listeners with Insecure", func(c *Config) {
			c.GRPCAddr, c.HTTPAddr, c.Insecure = "0.0.0.0:0", "0.0.0.0:0", true
		}, nil},
		{"open peer port and bad replicas", func(c *Config) {
			clustered(c)
			c.GRPCAddr, c.Router.Replicas, c.DataDir = "0.0.0.0:0", 3, ""
		}, []string{"--grpc-addr 0.0.0.0:0: a cluster node serves its peer service", "--replicas 3: want 1 or 2", "data dir is empty; a cluster node keeps its Raft log"}},
		{"expect unset, replicas 3", func(c *Config) {
			clustered(c)
			c.Cluster.Expect, c.Router.Replicas = 0, 3
		}, []string{"--expect: set how many nodes bootstrap the cluster together", "--replicas 3: want 1 or 2"}},
		{"replicas 2 in memory", func(c *Config) {
			clustered(c)
			c.Durability, c.Router.Replicas = "memory", 2
		}, []string{"--replicas 2 with --durability memory"}},
		{"async takes the default replicas", func(c *Config) {
			clustered(c)
			c.Durability = "async"
		}, []string{"--durability async with --replicas 2"}},
		{"async with one replica", func(c *Config) {
			clustered(c)
			c.Durability, c.Router.Replicas = "async", 1
		}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v; want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil; want %d problems: %q", len(tt.want), tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Errorf("Validate() reported %d problems; want %d:\n%v", len(lines), len(tt.want), err)
			}
			for _, w := range tt.want {
				found := false
				for _, l := range lines {
					found = found || strings.Contains(l, w) && strings.HasPrefix(l, "node: config: ")
				}
				if !found {
					t.Errorf("Validate() lacks a line containing %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestNewResolvesServeDefaults: a node built in-process (as the tests and
// nodetest build them) runs with the defaults sluice serve gives: a
// cluster node with a data file keeps a standby per key, one in memory
// mode none; the transport's zero bounds take their defaults.
func TestNewResolvesServeDefaults(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		durability string
		replicas   int
	}{
		{"commit", 2},
		{"fsync", 2},
		{"memory", 1},
	} {
		t.Run(tt.durability, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.NodeName, cfg.GRPCAddr, cfg.HTTPAddr = "n", "127.0.0.1:0", ""
			cfg.DataDir, cfg.Durability, cfg.Engine.Actors = t.TempDir(), tt.durability, 2
			cc := cluster.DefaultConfig()
			cfg.Cluster = &cc
			cfg.MaxConnections, cfg.KeepaliveTime = 0, 0
			n, err := New(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer n.Crash()
			got := n.Config()
			if got.Router.Replicas != tt.replicas {
				t.Errorf("durability %s: Router.Replicas = %d; want %d, as sluice serve resolves --replicas 0", tt.durability, got.Router.Replicas, tt.replicas)
			}
			if got.MaxConnections != DefaultMaxConnections || got.KeepaliveTime != 30*time.Second {
				t.Errorf("MaxConnections %d, KeepaliveTime %v; want the defaults %d, 30s", got.MaxConnections, got.KeepaliveTime, DefaultMaxConnections)
			}
		})
	}
}
