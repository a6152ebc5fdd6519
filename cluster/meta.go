package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/sluice-io/sluice/cluster/control"
)

// meta is what a node gossips about itself in memberlist's node metadata
// (at most 512 bytes). It is JSON so that later versions can add fields
// that earlier ones ignore.
type meta struct {
	// GRPC is the node's gRPC address: decisions, and the peer and admin
	// services unless Peer or Admin name listeners of their own.
	GRPC string `json:"grpc"`
	// Peer is the address of the node's peer service (and Raft) when it
	// is not GRPC. Empty means GRPC.
	Peer string `json:"peer,omitempty"`
	// Admin is the address of the node's admin service when it is not
	// GRPC. Empty means GRPC.
	Admin string `json:"admin,omitempty"`
	// Started is the Unix time in nanoseconds at which the process started
	// its membership.
	Started int64 `json:"started"`
	// ID is the node's Raft server ID, drawn with its data directory.
	ID string `json:"id,omitempty"`
	// Cluster is the ID of the cluster the node belongs to, empty until it
	// joined one (or bootstrapped it).
	Cluster string `json:"cluster,omitempty"`
	// Raft is set once the node has Raft state (a log entry or a vote):
	// it bootstrapped a cluster, or one reached it.
	Raft bool `json:"raft,omitempty"`
	// Boot is the digest of the node's bootstrap set (control.Peer.Boot),
	// empty before it computed one.
	Boot string `json:"boot,omitempty"`
	// Expect is the node's --expect: how many nodes bootstrap a cluster.
	Expect int `json:"expect,omitempty"`
	// Settings are its cluster-wide settings (control.Settings.String).
	Settings string `json:"settings,omitempty"`
	// Zone is its failure domain, for placing Raft voters.
	Zone string `json:"zone,omitempty"`
	// Left is set just before the node leaves gossip gracefully, so that
	// its peers record a departure rather than a failure.
	Left bool `json:"left,omitempty"`
}

var errNoGRPC = errors.New("no gRPC address")

// newMeta returns the metadata a node with configuration c starts with:
// the peer and admin addresses only where they differ from the gRPC one.
func newMeta(c Config, started int64) meta {
	m := meta{GRPC: c.GRPCAddr, Started: started, ID: c.ID, Expect: c.Expect, Settings: c.Settings, Zone: c.Zone}
	if c.PeerAddr != c.GRPCAddr {
		m.Peer = c.PeerAddr
	}
	if c.AdminAddr != c.GRPCAddr {
		m.Admin = c.AdminAddr
	}
	return m
}

// peerAddr is the address the node's peers dial for peer calls.
func (m meta) peerAddr() string {
	if m.Peer != "" {
		return m.Peer
	}
	return m.GRPC
}

// adminAddr is the address the other nodes dial for admin calls.
func (m meta) adminAddr() string {
	if m.Admin != "" {
		return m.Admin
	}
	return m.GRPC
}

// advertised returns m with every address whose host is empty or
// unspecified (":8081", "0.0.0.0:8081"), which peers cannot dial, given
// host ip instead.
func (m meta) advertised(ip string) meta {
	for _, a := range []*string{&m.GRPC, &m.Peer, &m.Admin} {
		host, port, err := net.SplitHostPort(*a)
		if err != nil {
			continue
		}
		if addr := net.ParseIP(host); host == "" || addr != nil && addr.IsUnspecified() {
			*a = net.JoinHostPort(ip, port)
		}
	}
	return m
}

// largestMeta is the largest metadata c's node may gossip: its addresses
// as advertised with the longest IP, every flag and number at its widest.
// Config.Validate bounds it by memberlist's limit.
func (c Config) largestMeta() meta {
	m := newMeta(c, math.MaxInt64)
	m.Cluster = "00000000-0000-0000-0000-000000000000"
	m.Raft = true
	m.Boot = strings.Repeat("0", control.BootDigestLen)
	m.Left = true
	return m.advertised("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255")
}

func (m meta) encode() []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("cluster: encode node meta: %v", err)) // strings, numbers and booleans
	}
	return b
}

func decodeMeta(b []byte) (meta, error) {
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return meta{}, err
	}
	if m.GRPC == "" {
		return meta{}, errNoGRPC
	}
	return m, nil
}

func (m meta) started() time.Time { return time.Unix(0, m.Started) }
