package control

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
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

// leaderClient calls the leader's peer service, each call under a
// deadline of timeout at most.
type leaderClient struct {
	client  sluicepb.PeerServiceClient
	cluster string // this node's cluster ID, for ClusterHeader
	timeout time.Duration
}

// outgoing adds this node's cluster ID to ctx, once it has one, and the
// call's deadline.
func (l leaderClient) outgoing(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	if l.cluster == "" {
		return ctx, cancel
	}
	return metadata.AppendToOutgoingContext(ctx, ClusterHeader, l.cluster), cancel
}

// leaderConn is the connection to the Raft leader. It follows the leader
// whoever calls: a call made after the leader changed (or after an
// election started) dials the new one, and the connection to the one
// before is closed, which ends the calls still waiting on it (a leader
// that froze or vanished answers none). Safe for concurrent use.
type leaderConn struct {
	dial []grpc.DialOption

	mu   sync.Mutex
	addr string // "" while there is no connection
	id   string
	conn *grpc.ClientConn
}

// get returns the connection to the leader id at addr, dialled if it is
// not the one held.
func (l *leaderConn) get(addr, id string) (*grpc.ClientConn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil && l.addr == addr && l.id == id {
		return l.conn, nil
	}
	l.closeLocked()
	conn, err := grpc.NewClient(addr, l.dial...)
	if err != nil {
		return nil, fmt.Errorf("control: dial the leader at %s: %w", addr, err)
	}
	l.conn, l.addr, l.id = conn, addr, id
	return conn, nil
}

// follow closes the connection held unless it is to the leader id at addr
// ("" while none is known): its calls in flight fail at once.
func (l *leaderConn) follow(addr, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil && (l.addr != addr || l.id != id) {
		l.closeLocked()
	}
}

func (l *leaderConn) closeLocked() {
	if l.conn != nil {
		l.conn.Close()
	}
	l.conn, l.addr, l.id = nil, "", ""
}

func (l *leaderConn) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeLocked()
}

// leaderClient returns a client of the current leader, dialling it when
// the leader changed. Its calls take CallTimeout at most.
func (c *Control) leaderClient() (leaderClient, error) {
	addr, id := c.raft.LeaderWithID()
	switch {
	case addr == "":
		return leaderClient{}, fmt.Errorf("%w: no quorum of voters reachable, or an election under way", ErrNoLeader)
	case string(id) == c.ID():
		return leaderClient{}, fmt.Errorf("%w: this node was just elected and is not granting yet", ErrNoLeader)
	}
	conn, err := c.leader.get(string(addr), string(id))
	if err != nil {
		return leaderClient{}, err
	}
	return leaderClient{sluicepb.NewPeerServiceClient(conn), c.ClusterID(), c.cfg.CallTimeout}, nil
}

// followLeader closes the connection to a leader that lost its place as
// soon as Raft reports the change (a frozen leader's followers elect
// another after RaftTimeout), so that a call waiting on it, a proposal of
// this node's epoch say, is tried again against the new one without
// waiting out its deadline.
func (c *Control) followLeader(ctx context.Context) {
	ch := make(chan raft.Observation, 8)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	c.raft.RegisterObserver(obs)
	defer c.raft.DeregisterObserver(obs)
	t := time.NewTicker(time.Second) // an observation dropped (the channel full) is caught up here
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-t.C:
		}
		addr, id := c.raft.LeaderWithID()
		c.leader.follow(string(addr), string(id))
	}
}

func (l leaderClient) renew(ctx context.Context, name string, e uint64) (bool, string, error) {
	ctx, cancel := l.outgoing(ctx)
	defer cancel()
	resp, err := l.client.Renew(ctx, &sluicepb.RenewRequest{FromNode: name, Epoch: e})
	if err != nil {
		return false, "", err
	}
	return resp.Granted, resp.Reason, nil
}

func (l leaderClient) propose(ctx context.Context, from string, cmd command) (Result, error) {
	ctx, cancel := l.outgoing(ctx)
	defer cancel()
	resp, err := l.client.Propose(ctx, &sluicepb.ProposeRequest{FromNode: from, Command: cmd.encode()})
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
// own epoch or standbys, its graceful end (with where the partitions it
// led go), a leader's command on partitions it leads (transfer, reclaim,
// isr: the state machine checks it leads them), or an operator's forget.
// A member proposes for itself only. It returns the encoded Result.
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
	case cmd.Op == opStart || cmd.Op == opLeaving || cmd.Op == opSynced || cmd.Op == opEnd && cmd.Graceful,
		cmd.Op == opTransfer || cmd.Op == opReclaim || cmd.Op == opISR:
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
