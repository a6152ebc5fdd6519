package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
)

// DefaultGossipPort is the gossip port of DefaultConfig, memberlist's own
// default. Both UDP and TCP are used on it.
const DefaultGossipPort = 7946

// maxNameLen and maxAddrLen keep a node's metadata far below memberlist's
// 512-byte limit.
const (
	maxNameLen = 128
	maxAddrLen = 255
)

// Config configures a Membership. The zero value of a duration or count
// means its default; DefaultConfig returns every default filled in. A Config
// must not be changed after New.
//
// The failure-detection defaults are faster than memberlist's LAN profile
// (docs/cluster.md gives the reasoning and the measured detection times):
//
//	                      LAN     Sluice
//	ProbeInterval         1s      500ms
//	ProbeTimeout          500ms   250ms
//	SuspicionMult         4       3
//	SuspicionMaxTimeoutMult 6     4
//	GossipInterval        200ms   100ms
//	PushPullInterval      30s     15s
//	TCPTimeout            10s     3s
type Config struct {
	// NodeName identifies this node in the cluster and decides which keys it
	// owns. It must be unique and stable across restarts (a StatefulSet pod
	// name): a node that comes back under the same name, from any address,
	// owns the same keys. Default: the host name.
	NodeName string

	// GossipAddr is the host:port memberlist binds, for UDP and TCP. The host
	// must be an IP address (0.0.0.0 binds every interface); port 0 picks a
	// free port, which Local reports after Start. Default "127.0.0.1:7946".
	GossipAddr string

	// AdvertiseAddr is the IP:port other nodes use to reach this node's
	// gossip, when it differs from GossipAddr (NAT, or GossipAddr on
	// 0.0.0.0). Empty means memberlist's choice: the bind address, or a
	// private address of this host when binding 0.0.0.0. Default empty.
	AdvertiseAddr string

	// GRPCAddr is the host:port peers use to forward checks to this node; it
	// travels in the node's gossip metadata. An empty or unspecified host
	// (":8081", "0.0.0.0:8081") is replaced by this node's advertised gossip
	// IP. Required.
	GRPCAddr string

	// PeerAddr is the host:port of this node's peer service (forwarded
	// checks, handoffs, lease renewals, standby copies) and of Raft when
	// they have a listener of their own; it travels in the gossip
	// metadata, and peers dial it for every peer call and Raft connection.
	// An empty or unspecified host is replaced as for GRPCAddr. Default
	// empty: both are on GRPCAddr.
	PeerAddr string
	// AdminAddr is the host:port of this node's admin service when it has a
	// listener of its own: the other nodes dial it for the admin calls they
	// fan out (a key's state from its owner, key listings, overrides). An
	// empty or unspecified host is replaced as for GRPCAddr. Default empty:
	// the admin service is on GRPCAddr.
	AdminAddr string

	// Join lists members to contact at Start: "host:port", or "host" for
	// this node's gossip port. Hosts may be DNS names; every address a name
	// resolves to is tried, so a Kubernetes headless Service name joins
	// every pod behind it. Start retries with backoff (JoinBackoffMin up to
	// JoinBackoffMax, re-resolving names each time) until a member answers
	// or its context ends. Empty starts a new cluster. Default empty.
	Join []string

	// JoinBackoffMin is the wait after the first failed join attempt; it
	// doubles after each failure up to JoinBackoffMax. Defaults 200ms and 5s.
	JoinBackoffMin time.Duration
	// JoinBackoffMax bounds the wait between join attempts. Default 5s.
	JoinBackoffMax time.Duration

	// RejoinInterval is how often a started node contacts the Join
	// addresses that are not live members of its view (nodes that started
	// alone at the same time, or a partition that outlived memberlist's
	// memory of dead nodes), merging the clusters. Negative disables it.
	// Default 10s.
	RejoinInterval time.Duration

	// Expect is how many nodes bootstrap the cluster together (see
	// control.Config.Expect); it travels in the gossip metadata so that the
	// nodes can compare it. While fewer members are alive, the rejoin loop
	// runs every second instead of every RejoinInterval. Default 1.
	Expect int

	// ID is this node's Raft server ID, gossiped so that the leader can
	// add it. Set by the node from its control plane.
	ID string
	// Settings are this node's cluster-wide settings
	// (control.Settings.String), gossiped so that nodes compare them.
	Settings string
	// Zone is this node's failure domain (--zone), gossiped so that the
	// leader spreads voters across zones. Default empty.
	Zone string

	// GossipKey, when set, encrypts and authenticates all gossip with
	// AES-GCM (memberlist's keyring): 16, 24 or 32 bytes for AES-128, -192
	// or -256. Every node of a cluster must use the same key; a node with
	// another key, or none, cannot join. Default none (plain text).
	GossipKey []byte

	// ProbeInterval is how often this node probes one other member, picked
	// round-robin; a silent member is suspected after ProbeInterval. Default
	// 500ms (memberlist LAN: 1s).
	ProbeInterval time.Duration
	// ProbeTimeout is how long a direct probe waits for its ack before
	// asking IndirectChecks other members to probe. It must be below
	// ProbeInterval and above the round-trip time. Default 250ms (LAN:
	// 500ms).
	ProbeTimeout time.Duration
	// IndirectChecks is how many members probe a target that missed a
	// direct probe. Default 3 (LAN: 3).
	IndirectChecks int
	// SuspicionMult scales how long a suspected member has to refute before
	// it is declared dead: SuspicionMult × max(1, log10(N)) × ProbeInterval
	// once enough members confirm the suspicion. Default 3 (LAN: 4).
	SuspicionMult int
	// SuspicionMaxTimeoutMult bounds the suspicion time before confirmations
	// arrive, as a multiple of the above. Default 4 (LAN: 6).
	SuspicionMaxTimeoutMult int
	// GossipInterval is how often this node gossips queued messages (joins,
	// suspicions, deaths) to GossipNodes random members. Default 100ms
	// (LAN: 200ms).
	GossipInterval time.Duration
	// GossipNodes is how many members each gossip round reaches. Default 3
	// (LAN: 3).
	GossipNodes int
	// PushPullInterval is how often this node exchanges its full state with
	// one random member (anti-entropy). Default 15s (LAN: 30s).
	PushPullInterval time.Duration
	// TCPTimeout bounds the TCP connections of joins, push-pull and the TCP
	// fallback of probes. Default 3s (LAN: 10s).
	TCPTimeout time.Duration

	// Logger receives the membership's logs and memberlist's own, with
	// attribute component=cluster. Nil discards them.
	Logger *slog.Logger
	// Observer receives membership changes for metrics; nil discards them.
	Observer Observer
}

// Observer receives measurements for metrics. Changed is called from
// memberlist's goroutines while memberlist holds its node lock: it must
// return quickly without blocking (a Prometheus counter's Inc is fine) and
// must not call Start, Join, Leave or Shutdown.
type Observer interface {
	// Changed is called once per membership change, after the new view is
	// published: its kind, the view's epoch and its number of live members.
	Changed(kind ChangeKind, epoch uint64, members int)
	// JoinAttempt is called after each attempt of Start or Join to contact
	// the join list; err is nil for the attempt that succeeded.
	JoinAttempt(err error)
}

type nopObserver struct{}

func (nopObserver) Changed(ChangeKind, uint64, int) {}
func (nopObserver) JoinAttempt(error)               {}

// DefaultConfig returns the default configuration, with NodeName set to the
// host name. GRPCAddr is left empty: the caller must set it.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

func (c Config) withDefaults() Config {
	if c.NodeName == "" {
		c.NodeName, _ = os.Hostname()
	}
	if c.GossipAddr == "" {
		c.GossipAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(DefaultGossipPort))
	}
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	setInt := func(n *int, def int) {
		if *n == 0 {
			*n = def
		}
	}
	setDur(&c.JoinBackoffMin, 200*time.Millisecond)
	setDur(&c.JoinBackoffMax, 5*time.Second)
	setDur(&c.RejoinInterval, 10*time.Second)
	setDur(&c.ProbeInterval, 500*time.Millisecond)
	setDur(&c.ProbeTimeout, 250*time.Millisecond)
	setInt(&c.Expect, 1)
	setInt(&c.IndirectChecks, 3)
	setInt(&c.SuspicionMult, 3)
	setInt(&c.SuspicionMaxTimeoutMult, 4)
	setDur(&c.GossipInterval, 100*time.Millisecond)
	setInt(&c.GossipNodes, 3)
	setDur(&c.PushPullInterval, 15*time.Second)
	setDur(&c.TCPTimeout, 3*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.NodeName == "" {
		return fmt.Errorf("cluster: config: node name is empty and the host name is unknown")
	}
	if len(c.NodeName) > maxNameLen {
		return fmt.Errorf("cluster: config: node name is %d bytes; at most %d", len(c.NodeName), maxNameLen)
	}
	if _, _, err := splitIPPort(c.GossipAddr, true); err != nil {
		return fmt.Errorf("cluster: config: gossip addr %q: %v", c.GossipAddr, err)
	}
	if c.AdvertiseAddr != "" {
		ip, port, err := splitIPPort(c.AdvertiseAddr, false)
		if err != nil {
			return fmt.Errorf("cluster: config: advertise addr %q: %v", c.AdvertiseAddr, err)
		}
		if ip.IsUnspecified() || port == 0 {
			return fmt.Errorf("cluster: config: advertise addr %q: need a reachable IP and a port", c.AdvertiseAddr)
		}
	}
	if c.GRPCAddr == "" {
		return fmt.Errorf("cluster: config: gRPC addr is required")
	}
	for _, a := range []struct{ name, addr string }{{"gRPC", c.GRPCAddr}, {"peer", c.PeerAddr}, {"admin", c.AdminAddr}} {
		if a.addr == "" {
			continue
		}
		if len(a.addr) > maxAddrLen {
			return fmt.Errorf("cluster: config: %s addr is %d bytes; at most %d", a.name, len(a.addr), maxAddrLen)
		}
		if _, port, err := net.SplitHostPort(a.addr); err != nil {
			return fmt.Errorf("cluster: config: %s addr %q: %v", a.name, a.addr, err)
		} else if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return fmt.Errorf("cluster: config: %s addr %q: need a port in 1-65535", a.name, a.addr)
		}
	}
	if n := len(c.largestMeta().encode()); n > memberlist.MetaMaxSize {
		return fmt.Errorf("cluster: config: the gRPC, peer and admin addresses make %d bytes of gossip metadata; at most %d fit: use shorter names", n, memberlist.MetaMaxSize)
	}
	_, gossipPort, _ := splitIPPort(c.GossipAddr, true)
	for _, j := range c.Join {
		if _, _, err := joinHostPort(j, gossipPort); err != nil {
			return fmt.Errorf("cluster: config: join %q: %v", j, err)
		}
	}
	if len(c.GossipKey) > 0 {
		if err := memberlist.ValidateKey(c.GossipKey); err != nil {
			return fmt.Errorf("cluster: config: gossip key: %d bytes; want 16, 24 or 32", len(c.GossipKey))
		}
	}
	switch {
	case c.JoinBackoffMin < 0 || c.JoinBackoffMax < c.JoinBackoffMin:
		return fmt.Errorf("cluster: config: join backoff %v to %v is not a range", c.JoinBackoffMin, c.JoinBackoffMax)
	case c.ProbeInterval < 0 || c.ProbeTimeout < 0 || c.ProbeTimeout >= c.ProbeInterval:
		return fmt.Errorf("cluster: config: probe timeout %v must be positive and below the probe interval %v", c.ProbeTimeout, c.ProbeInterval)
	case c.Expect < 1:
		return fmt.Errorf("cluster: config: expect %d members: need at least 1", c.Expect)
	case c.IndirectChecks < 0:
		return fmt.Errorf("cluster: config: indirect checks %d is negative", c.IndirectChecks)
	case c.SuspicionMult < 1 || c.SuspicionMaxTimeoutMult < 1:
		return fmt.Errorf("cluster: config: suspicion multipliers %d and %d must be at least 1", c.SuspicionMult, c.SuspicionMaxTimeoutMult)
	case c.GossipInterval < 0 || c.GossipNodes < 1:
		return fmt.Errorf("cluster: config: gossip every %v to %d nodes: need a positive interval and at least 1 node", c.GossipInterval, c.GossipNodes)
	case c.PushPullInterval < 0 || c.TCPTimeout < 0:
		return fmt.Errorf("cluster: config: push-pull interval %v and TCP timeout %v must be positive", c.PushPullInterval, c.TCPTimeout)
	}
	return nil
}

// splitIPPort parses an IP:port. A port of 0 is allowed only when zeroOK.
func splitIPPort(addr string, zeroOK bool) (net.IP, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, err
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, 0, fmt.Errorf("host %q is not an IP address", host)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || (p == 0 && !zeroOK) {
		return nil, 0, fmt.Errorf("port %q is not in 1-65535", port)
	}
	return ip, int(p), nil
}

// joinHostPort splits a join entry into host and port; an entry without a
// port gets defaultPort.
func joinHostPort(entry string, defaultPort int) (string, int, error) {
	host, port, err := net.SplitHostPort(entry)
	if err != nil {
		// No port (or a bare IPv6 address): use this node's gossip port.
		host = entry
		if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
			host = host[1 : len(host)-1]
		}
		if defaultPort == 0 {
			return "", 0, fmt.Errorf("no port, and the gossip port is chosen at random")
		}
		port = strconv.Itoa(defaultPort)
	}
	if host == "" {
		return "", 0, fmt.Errorf("empty host")
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", 0, fmt.Errorf("port %q is not in 1-65535", port)
	}
	return host, int(p), nil
}

// memberlistConfig translates c (with defaults) into memberlist's config,
// starting from its LAN profile.
func (c Config) memberlistConfig() *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.NodeName
	ip, port, _ := splitIPPort(c.GossipAddr, true)
	mc.BindAddr, mc.BindPort = ip.String(), port
	mc.AdvertiseAddr, mc.AdvertisePort = "", port
	if c.AdvertiseAddr != "" {
		aip, aport, _ := splitIPPort(c.AdvertiseAddr, false)
		mc.AdvertiseAddr, mc.AdvertisePort = aip.String(), aport
	}
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.IndirectChecks = c.IndirectChecks
	mc.SuspicionMult = c.SuspicionMult
	mc.SuspicionMaxTimeoutMult = c.SuspicionMaxTimeoutMult
	mc.GossipInterval = c.GossipInterval
	mc.GossipNodes = c.GossipNodes
	mc.PushPullInterval = c.PushPullInterval
	mc.TCPTimeout = c.TCPTimeout
	// Stop gossiping to a dead node after as long as the anti-entropy period:
	// the rejoin loop takes over merging partitions after that.
	mc.GossipToTheDeadTime = c.PushPullInterval
	// A node that died may come back under its name from another address
	// (a pod rescheduled with a new IP) as soon as it is known dead. Names
	// decide ownership, so the name must be reclaimable.
	mc.DeadNodeReclaimTime = time.Nanosecond
	if len(c.GossipKey) > 0 {
		mc.SecretKey = append([]byte(nil), c.GossipKey...)
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	mc.Logger = newMemberlistLogger(c.Logger)
	return mc
}
