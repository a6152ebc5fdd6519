package node

import (
	"context"
	"fmt"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"
)

// joinTimeout bounds how long Start tries to reach the join list.
const joinTimeout = 2 * time.Minute

// startCluster joins gossip, starts the control plane (Raft, on the peer
// listener) and the router: forwarding, handoff, standby copies.
func (n *Node) startCluster() error {
	// Not ready while joining, for every service probes may name (New set
	// only the server as a whole).
	n.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	id, err := control.NodeID(n.cfg.DataDir)
	if err != nil {
		return err
	}
	settings := control.Settings{
		Replicas: max(n.cfg.Router.Replicas, 1),
		Policy:   n.cfg.Router.Policy.String(),
		Lease:    n.cfg.Control.Settings.Lease,
		// Partitions and MinInsync: 0 and 0 keep the ownership by
		// rendezvous hashing (see cluster/partitions.go).
		Partitions: n.cfg.Control.Settings.Partitions,
		MinInsync:  n.cfg.Control.Settings.MinInsync,
	}
	if settings.Lease <= 0 {
		settings.Lease = 2 * time.Second
	}
	if settings.Partitions > 0 && settings.MinInsync == 0 {
		settings.MinInsync = 1 // what the control plane takes it for: gossip says the same
	}
	ccfg := *n.cfg.Cluster
	ccfg.NodeName, ccfg.GRPCAddr = n.cfg.NodeName, n.GRPCAddr()
	ccfg.PeerAddr, ccfg.AdminAddr = n.PeerAddr(), n.AdminAddr()
	ccfg.ID, ccfg.Settings, ccfg.Zone = id, settings.String(), n.cfg.Control.Zone
	if ccfg.Logger == nil {
		ccfg.Logger = n.log.With("component", "cluster")
	}
	ccfg.Observer = n.metrics
	m, err := cluster.New(ccfg)
	if err != nil {
		return err
	}
	// Start joins before the node reports ready; a join list that never
	// answers fails start-up after joinTimeout instead of hanging.
	jctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	if err := m.Start(jctx); err != nil {
		return err
	}
	local := m.Local()
	ctl := n.cfg.Control
	ctl.NodeName, ctl.DataDir, ctl.Expect, ctl.Settings = n.cfg.NodeName, n.cfg.DataDir, ccfg.Expect, settings
	ctl.Addrs = control.Addrs{Gossip: local.GossipAddr, GRPC: local.GRPCAddr, Peer: local.PeerAddr, Admin: local.AdminAddr}
	ctl.Gossip = m
	ctl.Transport = control.TransportConfig{Listener: n.mux.Raft(), Advertise: local.PeerAddr, Secret: []byte(n.cfg.AdminToken)}
	if n.certs != nil {
		ctl.Transport.ServerTLS, ctl.Transport.ClientTLS = n.certs.serverConfig(false), n.certs.peerConfig()
	}
	ctl.DialOptions = n.peerDialOptions()
	ctl.Logger = n.log
	ctl.Observer = n.metrics
	ctl.MayHaveLost = n.store != nil && n.store.MayHaveLost()
	c, err := control.New(ctl)
	if err != nil {
		m.Shutdown()
		return err
	}
	if err := c.Start(); err != nil {
		c.Shutdown()
		m.Shutdown()
		return err
	}
	r := n.router
	if err := r.Join(m, c); err != nil {
		c.Shutdown()
		m.Shutdown()
		return err
	}
	n.metrics.registerControl(n.registry, c)
	n.membership.Store(m)
	n.control.Store(c)
	n.api.SyncOverrides(context.Background())
	ctx, stop := context.WithCancel(context.Background())
	n.stopRouter, n.routerDone = stop, make(chan struct{})
	n.wg.Add(3)
	go func() {
		defer n.wg.Done()
		defer close(n.routerDone)
		r.Run(ctx)
	}()
	go func() {
		defer n.wg.Done()
		n.watchReadiness(ctx)
	}()
	go func() {
		defer n.wg.Done()
		select {
		case err := <-c.Fatal():
			n.log.Error("this node cannot be a member of the cluster", "err", err)
			n.fail(err)
		case <-ctx.Done():
		}
	}()
	return nil
}

// watchReadiness keeps grpc health in step with the router's readiness
// until ctx ends.
func (n *Node) watchReadiness(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.updateHealth()
		}
	}
}

// leaveCluster stops this node's part in the cluster: it stops deciding,
// leaves its keys complete elsewhere if it can within ctx (see
// cluster.Router.Leave), ends its epoch, leaves gossip, and stops the
// router, the control plane and gossip. It stays a member of the map and
// of Raft: a restart takes a new epoch.
func (n *Node) leaveCluster(ctx context.Context) {
	m, c, r := n.membership.Load(), n.control.Load(), n.router
	if err := r.Leave(ctx); err != nil {
		n.log.Warn("leave: could not end this node's epoch; the leader ends it once its lease is over", "err", err)
	} else {
		n.log.Info("left: ended this node's epoch")
	}
	if err := m.Leave(2 * time.Second); err != nil {
		n.log.Warn("gossip leave may not have reached every peer", "err", err)
	}
	n.stopCluster(m, c, r)
}

// stopCluster stops the router, the control plane and gossip, in that
// order.
func (n *Node) stopCluster(m *cluster.Membership, c *control.Control, r *cluster.Router) {
	n.stopRouter()
	<-n.routerDone
	if err := c.Shutdown(); err != nil {
		n.log.Warn("stop the control plane", "err", err)
	}
	m.Shutdown()
	r.Close()
}

// fail stops the node for good with err: Fatal delivers it (sluice serve
// exits with it).
func (n *Node) fail(err error) {
	select {
	case n.fatal <- fmt.Errorf("node: %w", err):
	default:
	}
}

// Fatal delivers an error that makes the node unusable (its settings
// differ from the cluster's): the process should stop with it.
func (n *Node) Fatal() <-chan error { return n.fatal }
