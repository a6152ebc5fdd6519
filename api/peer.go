package api

import (
	"context"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// peerService serves sluice.v1.PeerService: checks forwarded by other
// nodes, releases of reserved hits, and handoffs of key state. It decides
// what it is sent on this node, whatever its own view of ownership says:
// a check is forwarded at most once.
type peerService struct {
	sluicepb.UnimplementedPeerServiceServer
	s *Server
}

// peerChecks converts forwarded checks, which arrive resolved.
func peerChecks(in []*sluicepb.Check) ([]actor.Check, error) {
	checks := make([]actor.Check, len(in))
	for i, pc := range in {
		algo, err := fromProtoAlgorithm(pc.Algorithm)
		if err != nil {
			return nil, badInput("forwarded check %d: %v", i, err)
		}
		checks[i] = actor.Check{
			Key: string(pc.Key), Limit: pc.Limit, Window: pc.Window.AsDuration(), Algorithm: algo,
			Cost: pc.GetCost(), Refund: pc.Refund, Penalty: pc.Penalty,
		}
	}
	return checks, nil
}

// Forward decides checks another node forwarded.
func (p *peerService) Forward(ctx context.Context, req *sluicepb.ForwardRequest) (*sluicepb.ForwardResponse, error) {
	s := p.s
	checks, err := peerChecks(req.Checks)
	if err != nil {
		return nil, toStatus(err)
	}
	if s.router != nil {
		for i := range checks {
			if !s.router.Owns(checks[i].Key) {
				return nil, status.Errorf(codes.Aborted, "%s does not own key %q in its view; the sender routes it again", s.cfg.NodeName, checks[i].Key)
			}
		}
	}
	if s.router != nil {
		s.router.AwaitHandoff(ctx, checks)
	}
	out := make([]actor.Decision, len(checks))
	resp := &sluicepb.ForwardResponse{Decisions: make([]*sluicepb.Decision, len(checks))}
	if req.Reserve {
		resp.Marks = make([]int64, len(checks))
		err = s.engine.CheckMarked(ctx, checks, out, resp.Marks)
	} else {
		err = s.engine.Check(ctx, checks, out)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	s.metrics.peerDecisions.Add(float64(len(checks)))
	for i := range out {
		d := &out[i]
		resp.Decisions[i] = &sluicepb.Decision{
			Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
			RetryAfter: durationpb.New(d.RetryAfter), ResetAfter: durationpb.New(d.ResetAfter),
			Node: s.cfg.NodeName,
		}
	}
	return resp, nil
}

// Release takes back hits a reserving Forward recorded.
func (p *peerService) Release(ctx context.Context, req *sluicepb.ReleaseRequest) (*sluicepb.ReleaseResponse, error) {
	checks, err := peerChecks(req.Checks)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := p.s.engine.Release(ctx, checks, req.Marks); err != nil {
		return nil, toStatus(err)
	}
	return &sluicepb.ReleaseResponse{}, nil
}

// Handoff merges the key states another node hands over.
func (p *peerService) Handoff(stream sluicepb.PeerService_HandoffServer) error {
	var merged int64
	from, owners := "", uint64(0)
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			p.s.handoffReceived(from, owners)
			return stream.SendAndClose(&sluicepb.HandoffResponse{Merged: merged})
		}
		if err != nil {
			return err
		}
		from, owners = req.FromNode, req.OwnersHash
		states := make([]actor.Exported, len(req.Keys))
		for i, k := range req.Keys {
			states[i] = actor.Exported{Key: string(k.Key), State: k.State}
		}
		if err := p.s.engine.Import(stream.Context(), states); err != nil {
			return toStatus(err)
		}
		merged += int64(len(states))
		p.s.metrics.handoffKeys.WithLabelValues("received").Add(float64(len(states)))
	}
}
