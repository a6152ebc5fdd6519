package node

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-io/sluice/cluster"
)

// joinTimeout bounds how long Start tries to join the cluster.
const joinTimeout = 2 * time.Minute

// startCluster joins the cluster and starts the router: forwarding,
// leases, handoff.
func (n *Node) startCluster() error {
	// Not ready while joining, for every service probes may name (New set
	// only the server as a whole).
	n.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	ccfg := *n.cfg.Cluster
	ccfg.NodeName, ccfg.GRPCAddr = n.cfg.NodeName, n.GRPCAddr()
	ccfg.PeerAddr, ccfg.AdminAddr = n.PeerAddr(), n.AdminAddr()
	if ccfg.Logger == nil {
		ccfg.Logger = n.log.With("component", "cluster")
	}
	ccfg.Observer = n.metrics
	if n.store != nil {
		ccfg.Store = n.store
	}
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
	rcfg := n.cfg.Router
	rcfg.Membership, rcfg.Engine, rcfg.Self = m, n.engine, n.cfg.NodeName
	rcfg.Logger, rcfg.Observer = n.log, n.metrics
	if n.store != nil {
		rcfg.Store = n.store
	}
	rcfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if n.certs != nil {
		rcfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(n.certs.peerConfig()))}
	}
	if creds := n.api.PeerCredentials(n.certs != nil); creds != nil {
		rcfg.DialOptions = append(rcfg.DialOptions, grpc.WithPerRPCCredentials(creds))
	}
	r, err := cluster.NewRouter(rcfg)
	if err != nil {
		m.Shutdown()
		return err
	}
	n.membership.Store(m)
	n.router.Store(r)
	n.api.SyncOverrides(context.Background())
	ctx, stop := context.WithCancel(context.Background())
	n.stopRouter, n.routerDone = stop, make(chan struct{})
	n.wg.Add(2)
	go func() {
		defer n.wg.Done()
		defer close(n.routerDone)
		r.Run(ctx)
	}()
	go func() {
		defer n.wg.Done()
		n.watchReadiness(ctx)
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

// leaveCluster hands every key over to the members that act for it and
// leaves: announce leaving (this node then acts for nothing, and its
// clients' checks are forwarded), hand over, and only once everything was
// delivered mark the handoff done and leave. If ctx ends first, the node
// stops without leaving: its peers see it down, and its keys wait for it.
func (n *Node) leaveCluster(ctx context.Context) {
	m, r := n.membership.Load(), n.router.Load()
	if r.OnlyOwner() {
		n.log.Info("the only member that owns keys: stopping without leaving, keeping them")
	} else {
		if err := m.SetLeaving(2 * time.Second); err != nil {
			n.log.Warn("announce leaving", "err", err)
		}
		// Keep a third of the time left for the calls in flight.
		hctx, cancel := ctx, context.CancelFunc(func() {})
		if d, ok := ctx.Deadline(); ok {
			hctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(d)*2/3))
		}
		err := r.HandOver(hctx)
		cancel()
		switch {
		case err != nil:
			n.log.Warn("could not hand every key over; stopping without leaving, so that its keys wait for this node", "err", err)
		case m.Leave(2*time.Second) != nil:
			n.log.Warn("handed every key over, but the departure may not have reached every peer")
		default:
			n.log.Info("handed every key over and left the cluster")
		}
	}
	n.stopRouter()
	<-n.routerDone
	m.Shutdown()
	r.Close()
}
