package cluster

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// NewPeerService returns the server of sluice.v1.PeerService: the calls
// other members make to this node, passed to the router that router
// returns. While it returns nil (the node is still joining), calls are
// UNAVAILABLE. Register it on the node's gRPC server, behind the peers'
// credentials.
func NewPeerService(router func() *Router) sluicepb.PeerServiceServer {
	return peerServer{router: router}
}

// peerServer serves sluice.v1.PeerService. Its answers follow the status
// codes listed in the service's comment (proto/sluice/v1/sluice.proto),
// through Status.
type peerServer struct {
	sluicepb.UnimplementedPeerServiceServer
	router func() *Router
}

// errStarting answers peers while the node is still joining.
var errStarting = status.Error(codes.Unavailable, "sluice: node starting; not in the cluster yet")

// Forward decides checks another node forwarded, if this node acts for
// them; it never forwards them again.
func (p peerServer) Forward(ctx context.Context, req *sluicepb.ForwardRequest) (*sluicepb.ForwardResponse, error) {
	r := p.router()
	if r == nil {
		return nil, errStarting
	}
	checks, err := FromProtoChecks(req.Checks)
	if err != nil {
		return nil, Status(err)
	}
	out := make([]actor.Decision, len(checks))
	resp := &sluicepb.ForwardResponse{Decisions: make([]*sluicepb.Decision, len(checks))}
	if req.Reserve {
		resp.Marks = make([]int64, len(checks))
	}
	if err := r.DecideForwarded(ctx, checks, out, resp.Marks); err != nil {
		return nil, Status(err)
	}
	r.cfg.Observer.Served(len(checks))
	for i := range out {
		d := &out[i]
		resp.Decisions[i] = &sluicepb.Decision{
			Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
			RetryAfter: durationpb.New(d.RetryAfter), ResetAfter: durationpb.New(d.ResetAfter),
			Node: r.cfg.Self,
		}
	}
	return resp, nil
}

// Release takes back hits a reserving Forward recorded.
func (p peerServer) Release(ctx context.Context, req *sluicepb.ReleaseRequest) (*sluicepb.ReleaseResponse, error) {
	r := p.router()
	if r == nil {
		return nil, errStarting
	}
	checks, err := FromProtoChecks(req.Checks)
	if err != nil {
		return nil, Status(err)
	}
	if err := r.cfg.Engine.Release(ctx, checks, req.Marks); err != nil {
		return nil, Status(err)
	}
	return &sluicepb.ReleaseResponse{}, nil
}

// Handoff merges the key states another node hands over, commits them,
// and records its complete.
func (p peerServer) Handoff(ctx context.Context, req *sluicepb.HandoffRequest) (*sluicepb.HandoffResponse, error) {
	r := p.router()
	if r == nil {
		return nil, errStarting
	}
	n, err := r.receiveHandoff(ctx, req)
	if err != nil {
		return nil, Status(err)
	}
	return &sluicepb.HandoffResponse{Merged: int64(n)}, nil
}

// Lease grants the sender's incarnation a lease unless it was fenced.
func (p peerServer) Lease(_ context.Context, req *sluicepb.LeaseRequest) (*sluicepb.LeaseResponse, error) {
	r := p.router()
	if r == nil {
		return nil, errStarting
	}
	if r.lease == nil {
		return nil, status.Error(codes.FailedPrecondition, "sluice: this node is not in a cluster")
	}
	granted, fenced := r.lease.grant(req.FromNode, req.Incarnation)
	return &sluicepb.LeaseResponse{Granted: granted, Fenced: fenced, Node: r.cfg.Self}, nil
}

// Fence promises never to grant a lease to the member's incarnations up to
// the one named.
func (p peerServer) Fence(_ context.Context, req *sluicepb.FenceRequest) (*sluicepb.FenceResponse, error) {
	r := p.router()
	if r == nil {
		return nil, errStarting
	}
	if r.lease == nil {
		return nil, status.Error(codes.FailedPrecondition, "sluice: this node is not in a cluster")
	}
	if req.Member == "" {
		return nil, status.Error(codes.InvalidArgument, "fence: member is empty")
	}
	if err := r.promise(req.Member, req.Incarnation); err != nil {
		return nil, Status(err)
	}
	return &sluicepb.FenceResponse{}, nil
}

// Replicate stores the sender's writes of keys this node is the standby of.
func (p peerServer) Replicate(ctx context.Context, req *sluicepb.ReplicateRequest) (*sluicepb.ReplicateResponse, error) {
	r := p.router()
	if r == nil {
		return nil, errStarting
	}
	resp, err := r.receiveReplicas(ctx, req)
	if err != nil {
		return nil, Status(err)
	}
	return resp, nil
}

// FromProtoChecks converts forwarded checks, which arrive resolved.
func FromProtoChecks(in []*sluicepb.Check) ([]actor.Check, error) {
	checks := make([]actor.Check, len(in))
	for i, pc := range in {
		var algo actor.Algorithm
		switch pc.Algorithm {
		case sluicepb.Algorithm_ALGORITHM_UNSPECIFIED, sluicepb.Algorithm_ALGORITHM_SLIDING_LOG:
			algo = actor.SlidingLog
		case sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW:
			algo = actor.SlidingWindow
		case sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET:
			algo = actor.TokenBucket
		default:
			return nil, &actor.InvalidCheckError{Index: i, Field: "algorithm", Reason: "unknown value"}
		}
		checks[i] = actor.Check{
			Key: string(pc.Key), Limit: pc.Limit, Window: pc.Window.AsDuration(), Algorithm: algo,
			Cost: pc.GetCost(), Refund: pc.Refund, Penalty: pc.Penalty, Usage: pc.Usage,
		}
		if len(pc.ReservationId) > 0 {
			r := &actor.Reservation{TTL: pc.ReserveFor.AsDuration(), Settle: pc.Settle}
			if copy(r.ID[:], pc.ReservationId) != len(pc.ReservationId) {
				return nil, &actor.InvalidCheckError{Index: i, Field: "reservation", Reason: "the reservation ID is longer than 16 bytes"}
			}
			checks[i].Reservation = r
		}
	}
	return checks, nil
}

// errWrongIncarnation is a handoff meant for another incarnation of this
// node: the sender drops it and starts again for the current one.
var errWrongIncarnation = errors.New("cluster: handoff for another incarnation")

// ErrorDomain is the domain of the errdetails.ErrorInfo that Status adds
// to the UNAVAILABLE statuses it returns; its Reason is one of the
// Reason constants, so that a client can tell why without reading the
// message.
const ErrorDomain = "sluice.io"

// The reasons of an UNAVAILABLE status (see ErrorDomain).
// ReasonNoQuorum, ReasonMoving and ReasonOwnerDown are refusals: nothing
// was decided. After ReasonStandby or ReasonOwnerUnreachable, the hits may
// have been recorded without being acknowledged, so a retry may count them
// twice (never fewer).
const (
	// ReasonNoQuorum: the node holds no lease from a majority (ErrNoQuorum).
	ReasonNoQuorum = "NO_QUORUM"
	// ReasonMoving: the key's ownership is moving (ErrMoving); a retry a
	// moment later usually succeeds.
	ReasonMoving = "OWNERSHIP_MOVING"
	// ReasonOwnerDown: the key's owner is down and the policy keeps its keys
	// for it (ErrOwnerDown).
	ReasonOwnerDown = "OWNER_DOWN"
	// ReasonOwnerUnreachable: the member that acts for the key could not be
	// asked (ErrUnreachable); the metadata's "member" names it when known.
	ReasonOwnerUnreachable = "OWNER_UNREACHABLE"
	// ReasonStandby: the key's standby did not confirm the write.
	ReasonStandby = "STANDBY_UNCONFIRMED"
	// ReasonShuttingDown: the node is shutting down.
	ReasonShuttingDown = "SHUTTING_DOWN"
)

// unavailable is an UNAVAILABLE status with msg, carrying an ErrorInfo
// with reason and meta.
func unavailable(reason, msg string, meta map[string]string) error {
	st, err := status.New(codes.Unavailable, msg).WithDetails(&errdetails.ErrorInfo{
		Reason: reason, Domain: ErrorDomain, Metadata: meta,
	})
	if err != nil {
		return status.Error(codes.Unavailable, msg)
	}
	return st.Err()
}

// Status returns the gRPC status of an error of the engine or of this
// package: the one mapping the peer service and the client APIs share.
// Refusals (no quorum, ownership moving, owner down, an unreachable owner)
// are UNAVAILABLE with the reason, so that the edge applies its failure
// policy, with an errdetails.ErrorInfo saying why (see ErrorDomain); a
// forwarded check this node does not act for is ABORTED.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ice *actor.InvalidCheckError
	switch {
	case errors.As(err, &ice):
		return status.Errorf(codes.InvalidArgument, "check %d: %s: %s", ice.Index, ice.Field, ice.Reason)
	case errors.Is(err, actor.ErrBatchTooLarge):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, actor.ErrOverloaded), errors.Is(err, actor.ErrTooManyKeys):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, actor.ErrClosed), errors.Is(err, persist.ErrClosed):
		return unavailable(ReasonShuttingDown, "sluice: node shutting down; retry on another node", nil)
	case errors.Is(err, errMisrouted):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, errWrongIncarnation), errors.Is(err, ErrAlive):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrNoMember):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrNoQuorum):
		return unavailable(ReasonNoQuorum, err.Error(), nil)
	case errors.Is(err, ErrMoving):
		return unavailable(ReasonMoving, err.Error(), nil)
	case errors.Is(err, ErrOwnerDown):
		return unavailable(ReasonOwnerDown, err.Error(), nil)
	case errors.Is(err, actor.ErrReplication), errors.Is(err, errStandby):
		return unavailable(ReasonStandby, err.Error(), nil)
	case errors.Is(err, actor.ErrStale):
		return unavailable(ReasonMoving, ErrMoving.Error()+": "+err.Error(), nil)
	case errors.Is(err, ErrUnreachable):
		var meta map[string]string
		if ue := (*UnreachableError)(nil); errors.As(err, &ue) {
			meta = map[string]string{"member": ue.Member}
		}
		return unavailable(ReasonOwnerUnreachable, err.Error()+"; the edge decides whether to fail open or closed", meta)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
