package control

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Nodes reach the leader through its peer service: PeerService.Renew for
// leases and PeerService.Propose for changes of the map. The peer service
// (package cluster) passes those calls to HandleRenew and HandlePropose.

// ClusterHeader is the gRPC metadata that carries the sender's cluster ID
// on every peer call; a node refuses a call that names another cluster,
// or none once it has one.
const ClusterHeader = "sluice-cluster"

// leaderClient calls the leader's peer service.
type leaderClient struct {
	client  sluicepb.PeerServiceClient
	cluster string // this node's cluster ID, for ClusterHeader
}

// outgoing adds this node's cluster ID to ctx, once it has one.
func (l leaderClient) outgoing(ctx context.Context) context.Context {
	if l.cluster == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, ClusterHeader, l.cluster)
}

// leaderClient returns a client of the current leader, dialling it when
// the leader changed.
func (c *Control) leaderClient() (leaderClient, error) {
	addr, id := c.raft.LeaderWithID()
	switch {
	case addr == "":
		return leaderClient{}, fmt.Errorf("%w: no quorum of voters reachable, or an election under way", ErrNoLeader)
	case string(id) == c.ID():
		return leaderClient{}, fmt.Errorf("%w: this node was just elected and is not granting yet", ErrNoLeader)
	}
	c.leaderMu.Lock()
	defer c.leaderMu.Unlock()
	if c.leaderConn == nil || c.leaderAddr != string(addr) {
		if c.leaderConn != nil {
			c.leaderConn.Close()
		}
		conn, err := grpc.NewClient(string(addr), c.cfg.DialOptions...)
		if err != nil {
			return leaderClient{}, fmt.Errorf("control: dial the leader at %s: %w", addr, err)
		}
		c.leaderConn, c.leaderAddr = conn, string(addr)
	}
	return leaderClient{sluicepb.NewPeerServiceClient(c.leaderConn), c.ClusterID()}, nil
}

func (l leaderClient) renew(ctx context.Context, name string, e uint64) (bool, string, error) {
	resp, err := l.client.Renew(l.outgoing(ctx), &sluicepb.RenewRequest{FromNode: name, Epoch: e})
	if err != nil {
		return false, "", err
	}
	return resp.Granted, resp.Reason, nil
}

func (l leaderClient) propose(ctx context.Context, from string, cmd command) (Result, error) {
	resp, err := l.client.Propose(l.outgoing(ctx), &sluicepb.ProposeRequest{FromNode: from, Command: cmd.encode()})
	if err != nil {
		return Result{}, err
	}
	var res Result
	if err := json.Unmarshal(resp.Result, &res); err != nil {
		return Result{}, fmt.Errorf("control: the leader's answer: %w", err)
	}
	return res, res.err()
}

// HandleRenew answers a member's PeerService.Renew: granted if this node
// leads and the epoch is live and not ending.
func (c *Control) HandleRenew(ctx context.Context, from string, epoch uint64) (bool, string) {
	g := c.granter.Load()
	if g == nil {
		return false, fmt.Sprintf("%s is not the leader (the leader is %q)", c.cfg.NodeName, c.Leader())
	}
	granted, reason, err := g.ask(ctx, from, epoch)
	if err != nil {
		return false, err.Error()
	}
	return granted, reason
}

// HandlePropose applies a member's PeerService.Propose: a change of its
// own epoch or standbys, or an operator's forget. It returns the encoded
// Result.
func (c *Control) HandlePropose(ctx context.Context, from string, raw []byte) ([]byte, error) {
	g := c.granter.Load()
	if g == nil {
		return nil, fmt.Errorf("%w: %s is not the leader", ErrNoLeader, c.cfg.NodeName)
	}
	var cmd command
	if err := json.Unmarshal(raw, &cmd); err != nil {
		return nil, fmt.Errorf("control: propose: undecodable command: %v", err)
	}
	var res Result
	switch {
	case cmd.Op == opForget:
		if err := c.forget(ctx, g, cmd.Name); err != nil {
			return nil, err
		}
	case cmd.Name != from:
		return nil, fmt.Errorf("control: propose: %s may not change %s", from, cmd.Name)
	case cmd.Op == opStart || cmd.Op == opLeaving || cmd.Op == opSynced || cmd.Op == opEnd && cmd.Graceful:
		var err error
		res, err = c.apply(cmd, defaultApplyTimeout)
		if err != nil && res.Err == "" {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("control: propose: %s may not propose %q", from, cmd.Op)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("control: encode result: %w", err)
	}
	return b, nil
}
