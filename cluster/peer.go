package cluster

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// NewPeerService returns the server of sluice.v1.PeerService: the calls
// other members make to this node, passed to r (and the leader's calls to
// r's control plane). Until r joined the cluster (the node is still
// starting), calls are UNAVAILABLE. Register it on the node's gRPC server,
// behind the peers' credentials.
func NewPeerService(r *Router) sluicepb.PeerServiceServer {
	return peerServer{r: r}
}

// peerServer serves sluice.v1.PeerService. Its answers follow the status
// codes listed in the service's comment (proto/sluice/v1/sluice.proto),
// through Status.
type peerServer struct {
	sluicepb.UnimplementedPeerServiceServer
	r *Router
}

// started returns the router, once it joined the cluster, after checking
// that the caller belongs to this node's cluster.
func (p peerServer) started(ctx context.Context) (*Router, error) {
	r := p.r
	if !r.joined() {
		return nil, errStarting
	}
	if err := checkClusterID(ctx, r.ctl().ClusterID()); err != nil {
		return nil, Status(err)
	}
	return r, nil
}

// ctl returns the control plane once the router joined the cluster, nil
// before.
func (p peerServer) ctl() *control.Control {
	if !p.r.joined() {
		return nil
	}
	return p.r.ctl()
}

// errStarting answers peers while the node is still joining.
var errStarting = status.Error(codes.Unavailable, "sluice: node starting; not in the cluster yet")

// Forward decides checks another node forwarded, if this node acts for
// them; it never forwards them again.
func (p peerServer) Forward(ctx context.Context, req *sluicepb.ForwardRequest) (*sluicepb.ForwardResponse, error) {
	r, err := p.started(ctx)
	if err != nil {
		return nil, err
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
	if err := r.DecideForwarded(ctx, req.MapVersion, checks, out, resp.Marks); err != nil {
		return nil, Status(err)
	}
	r.cfg.Observer.Served(len(checks))
	for i := range out {
		d := &out[i]
		resp.Decisions[i] = &sluicepb.Decision{
			Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining, Granted: d.Granted, Share: d.Share,
			RetryAfter: durationpb.New(d.RetryAfter), ResetAfter: durationpb.New(d.ResetAfter),
			Node: r.cfg.Self,
		}
		if d.Err != nil {
			st := status.Convert(Status(d.Err))
			resp.Decisions[i].ErrorCode, resp.Decisions[i].ErrorMessage = uint32(st.Code()), st.Message()
		}
	}
	return resp, nil
}

// Release takes back hits a reserving Forward recorded.
func (p peerServer) Release(ctx context.Context, req *sluicepb.ReleaseRequest) (*sluicepb.ReleaseResponse, error) {
	r, err := p.started(ctx)
	if err != nil {
		return nil, err
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
	r, err := p.started(ctx)
	if err != nil {
		return nil, err
	}
	n, err := r.receiveHandoff(ctx, req)
	if err != nil {
		return nil, Status(err)
	}
	return &sluicepb.HandoffResponse{Merged: int64(n)}, nil
}

// Renew renews the sender's lease, if this node leads and the sender's
// epoch is live and not ending.
func (p peerServer) Renew(ctx context.Context, req *sluicepb.RenewRequest) (*sluicepb.RenewResponse, error) {
	c := p.ctl()
	if c == nil {
		return nil, errStarting
	}
	if err := checkClusterID(ctx, c.ClusterID()); err != nil {
		return nil, Status(err)
	}
	granted, why := c.HandleRenew(ctx, req.FromNode, req.Epoch)
	return &sluicepb.RenewResponse{Granted: granted, Reason: why, Node: req.FromNode}, nil
}

// Propose applies a change of the cluster map, if this node leads.
func (p peerServer) Propose(ctx context.Context, req *sluicepb.ProposeRequest) (*sluicepb.ProposeResponse, error) {
	c := p.ctl()
	if c == nil {
		return nil, errStarting
	}
	if err := checkClusterID(ctx, c.ClusterID()); err != nil {
		return nil, Status(err)
	}
	res, err := c.HandlePropose(ctx, req.FromNode, req.Command)
	if err != nil {
		return nil, Status(err)
	}
	return &sluicepb.ProposeResponse{Result: res}, nil
}

// Replicate stores the sender's writes of keys this node is the standby of.
func (p peerServer) Replicate(stream sluicepb.PeerService_ReplicateServer) error {
	r, err := p.started(stream.Context())
	if err != nil {
		return err
	}
	if err := r.receiveReplicas(stream); err != nil {
		return Status(err)
	}
	return nil
}

// AlgorithmFromProto maps the wire's algorithm to the engine's (unset:
// the sliding log); false for a value it does not know.
func AlgorithmFromProto(a sluicepb.Algorithm) (actor.Algorithm, bool) {
	switch a {
	case sluicepb.Algorithm_ALGORITHM_UNSPECIFIED, sluicepb.Algorithm_ALGORITHM_SLIDING_LOG:
		return actor.SlidingLog, true
	case sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW:
		return actor.SlidingWindow, true
	case sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET:
		return actor.TokenBucket, true
	}
	return 0, false
}

// AlgorithmToProto maps the engine's algorithm to the wire's.
func AlgorithmToProto(a actor.Algorithm) sluicepb.Algorithm {
	switch a {
	case actor.SlidingWindow:
		return sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW
	case actor.TokenBucket:
		return sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET
	}
	return sluicepb.Algorithm_ALGORITHM_SLIDING_LOG
}

// FromProtoChecks converts forwarded checks, which arrive resolved.
func FromProtoChecks(in []*sluicepb.Check) ([]actor.Check, error) {
	checks := make([]actor.Check, len(in))
	for i, pc := range in {
		algo, ok := AlgorithmFromProto(pc.Algorithm)
		if !ok {
			return nil, &actor.InvalidCheckError{Index: i, Field: "algorithm", Reason: "unknown value"}
		}
		checks[i] = actor.Check{
			Key: string(pc.Key), Limit: pc.Limit, Window: pc.Window.AsDuration(), Algorithm: algo,
			Cost: pc.GetCost(), Refund: pc.Refund, Penalty: pc.Penalty, Usage: pc.Usage,
		}
		if len(pc.ReservationId) > 0 {
			r := &actor.Reservation{TTL: pc.ReserveFor.AsDuration(), Settle: pc.Settle, Lease: pc.Lease, Holder: pc.Holder, Demand: pc.Demand}
			if copy(r.ID[:], pc.ReservationId) != len(pc.ReservationId) {
				return nil, &actor.InvalidCheckError{Index: i, Field: "reservation", Reason: "the reservation ID is longer than 16 bytes"}
			}
			checks[i].Reservation = r
		}
	}
	return checks, nil
}

// errWrongEpoch is a handoff or copy meant for another epoch of this
// node, sent by an epoch this node's map has ended, or from another
// cluster: the sender drops it and starts again under its current map.
var errWrongEpoch = errors.New("cluster: wrong epoch")

// checkClusterID refuses a call whose sender names another cluster than
// own, or none once this node has one (see control.ClusterHeader): every peer
// call of a member comes from a node that holds the map, and so the ID.
func checkClusterID(ctx context.Context, own string) error {
	if own == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	switch ids := md.Get(control.ClusterHeader); {
	case len(ids) == 0:
		return fmt.Errorf("%w: the caller names no cluster; this node belongs to %s", errWrongEpoch, own)
	case ids[0] != own:
		return fmt.Errorf("%w: the caller belongs to cluster %s; this node to %s", errWrongEpoch, ids[0], own)
	}
	return nil
}

// ErrorDomain is the domain of the errdetails.ErrorInfo that Status adds
// to the UNAVAILABLE statuses it returns; its Reason is one of the
// Reason constants, so that a client can tell why without reading the
// message.
const ErrorDomain = "sluice.io"

// The reasons of an UNAVAILABLE status (see ErrorDomain).
// ReasonNoQuorum, ReasonMoving and ReasonOwnerDown are mostly refusals:
// nothing was decided. After ReasonStandby or ReasonOwnerUnreachable, the
// hits may have been recorded without being acknowledged, so a retry may
// count them twice (never fewer). Which is the case is in the ErrorInfo's
// metadata, under MetaRecorded, whatever the reason.
const (
	// ReasonNoQuorum: the node holds no lease (ErrNoQuorum): it has no epoch
	// yet, or cannot reach the Raft leader, or the leader no quorum.
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

// MetaMember names, in the metadata of an OWNER_UNREACHABLE status, the
// member that could not be reached.
const MetaMember = "member"

// MetaRecorded is the key, in the metadata of the ErrorInfo of an
// UNAVAILABLE status, that says whether the failed call may have recorded
// hits: RecordedNo (a refusal: nothing of the call was recorded) or
// RecordedMaybe (some of its hits may be recorded, though none was
// acknowledged: they count against the key, and a retry may count them
// twice, never fewer). A client that keeps a ledger of its hits, as the
// fault suite does, counts a RecordedMaybe failure as possibly counted.
const MetaRecorded = "recorded"

// The values of MetaRecorded.
const (
	RecordedNo    = "no"
	RecordedMaybe = "maybe"
)

// ErrRecorded marks a failure that came after some of the call's hits may
// have been recorded: none was acknowledged, but they may count against
// their keys. Status says so (MetaRecorded: RecordedMaybe) for errors that
// match it, and for the standby's, an unreachable member's, a partly
// stale call's and a shutdown's, which may all come after a record.
var ErrRecorded = errors.New("cluster: hits may be recorded, none acknowledged")

// recordedError is err marked as ErrRecorded: it reads as err, and
// matches both.
type recordedError struct{ err error }

func (e *recordedError) Error() string   { return e.err.Error() }
func (e *recordedError) Unwrap() []error { return []error{e.err, ErrRecorded} }

// maybeRecorded marks err as ErrRecorded (nil stays nil).
func maybeRecorded(err error) error {
	if err == nil || errors.Is(err, ErrRecorded) {
		return err
	}
	return &recordedError{err}
}

// recorded is the MetaRecorded value of a failure: RecordedNo only for the
// refusals that are made before anything is recorded.
func recorded(err error) string {
	switch {
	case errors.Is(err, ErrRecorded),
		errors.Is(err, actor.ErrStalePartial),
		errors.Is(err, actor.ErrReplication), errors.Is(err, errStandby),
		errors.Is(err, ErrUnreachable),
		errors.Is(err, actor.ErrClosed), errors.Is(err, persist.ErrClosed):
		return RecordedMaybe
	}
	return RecordedNo
}

// unavailable is an UNAVAILABLE status with msg, carrying an ErrorInfo
// with reason and meta, and MetaRecorded for err.
func unavailable(reason, msg string, meta map[string]string, cause error) error {
	if meta == nil {
		meta = make(map[string]string, 1)
	}
	meta[MetaRecorded] = recorded(cause)
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
// forwarded check this node does not act for is ABORTED. The ErrorInfo
// also says whether the call may have recorded hits (MetaRecorded).
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
	case errors.Is(err, actor.ErrDamaged):
		return status.Error(codes.DataLoss, err.Error())
	case errors.Is(err, actor.ErrOverloaded), errors.Is(err, actor.ErrTooManyKeys):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, actor.ErrClosed), errors.Is(err, persist.ErrClosed), errors.Is(err, control.ErrClosed):
		return unavailable(ReasonShuttingDown, "sluice: node shutting down; retry on another node", nil, err)
	case errors.Is(err, errMisrouted):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, errWrongEpoch), errors.Is(err, errLate), errors.Is(err, control.ErrAlive),
		errors.Is(err, control.ErrMismatch), errors.Is(err, control.ErrTwoClusters):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, control.ErrNoMember):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrNoQuorum), errors.Is(err, control.ErrNoLeader):
		return unavailable(ReasonNoQuorum, err.Error(), nil, err)
	case errors.Is(err, ErrMoving):
		return unavailable(ReasonMoving, err.Error(), nil, err)
	case errors.Is(err, ErrOwnerDown):
		return unavailable(ReasonOwnerDown, err.Error(), nil, err)
	case errors.Is(err, actor.ErrReplication), errors.Is(err, errStandby):
		return unavailable(ReasonStandby, err.Error(), nil, err)
	case errors.Is(err, actor.ErrStale):
		return unavailable(ReasonMoving, ErrMoving.Error()+": "+err.Error(), nil, err)
	case errors.Is(err, ErrUnreachable):
		var meta map[string]string
		if ue := (*UnreachableError)(nil); errors.As(err, &ue) {
			meta = map[string]string{MetaMember: ue.Member}
		}
		return unavailable(ReasonOwnerUnreachable, err.Error()+"; the edge decides whether to fail open or closed", meta, err)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
