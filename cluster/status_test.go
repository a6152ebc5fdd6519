package cluster

import (
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/actor"
)

// TestStatusReasons: every refusal is UNAVAILABLE with an ErrorInfo whose
// reason says why, and an unreachable owner is named in its metadata, so
// that a client tells "the node I asked is down" from "the node I asked
// could not reach the key's owner" without reading the message. The
// metadata also says whether the call may have recorded hits: "no" only
// for refusals made before anything was recorded, "maybe" for failures
// after a record (the lease ran out while the call decided, the standby
// did not confirm) and for those that cannot tell (an unreachable owner,
// a shutdown).
func TestStatusReasons(t *testing.T) {
	lapsed := maybeRecorded(fmt.Errorf("%w: the lease of node-0 ran out while it decided", ErrNoQuorum))
	for _, tc := range []struct {
		err          error
		wantReason   string
		wantMember   string
		wantRecorded string
	}{
		{fmt.Errorf("%w: node-0 holds no lease", ErrNoQuorum), ReasonNoQuorum, "", RecordedNo},
		{lapsed, ReasonNoQuorum, "", RecordedMaybe},
		{fmt.Errorf("router: %w", lapsed), ReasonNoQuorum, "", RecordedMaybe},
		{fmt.Errorf("%w: waiting for the handoff of node-1", ErrMoving), ReasonMoving, "", RecordedNo},
		{actor.ErrStale, ReasonMoving, "", RecordedNo},
		{&actor.StaleError{Refused: []int{1}}, ReasonMoving, "", RecordedMaybe},
		{fmt.Errorf("%w: node-2, which owns the key, is down", ErrOwnerDown), ReasonOwnerDown, "", RecordedNo},
		{maybeRecorded(fmt.Errorf("%w: node-2, which owns the key, is down", ErrOwnerDown)), ReasonOwnerDown, "", RecordedMaybe},
		{fmt.Errorf("%w: node-1: not sent within the replica timeout", errStandby), ReasonStandby, "", RecordedMaybe},
		{fmt.Errorf("%w: timeout", actor.ErrReplication), ReasonStandby, "", RecordedMaybe},
		{&UnreachableError{Member: "node-2", Reason: "dial 127.0.0.1:1: connection refused"}, ReasonOwnerUnreachable, "node-2", RecordedMaybe},
		{fmt.Errorf("%w: override set here but not on every node", ErrUnreachable), ReasonOwnerUnreachable, "", RecordedMaybe},
		{actor.ErrClosed, ReasonShuttingDown, "", RecordedMaybe},
	} {
		st := status.Convert(Status(tc.err))
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		if st.Code() != codes.Unavailable || info == nil || info.Domain != ErrorDomain || info.Reason != tc.wantReason ||
			info.Metadata["member"] != tc.wantMember || info.Metadata[MetaRecorded] != tc.wantRecorded {
			t.Errorf("Status(%v) = %v, details %v; want Unavailable with ErrorInfo reason %s, member %q, recorded %q",
				tc.err, st.Code(), info, tc.wantReason, tc.wantMember, tc.wantRecorded)
		}
	}
}

// TestPeerStatusKeepsRecorded: a refusal a peer answered keeps, on the
// forwarding node, what the peer said about its hits: a peer's "maybe"
// stays "maybe" when the forwarding node answers its own client, and a
// peer's "no" stays "no".
func TestPeerStatusKeepsRecorded(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"refused before a record", fmt.Errorf("%w: node-1 holds no lease", ErrNoQuorum), RecordedNo},
		{"lease ran out after the record", maybeRecorded(fmt.Errorf("%w: the lease of node-1 ran out while it decided", ErrNoQuorum)), RecordedMaybe},
		{"moving", fmt.Errorf("%w: waiting for the handoff of node-2", ErrMoving), RecordedNo},
		{"standby", fmt.Errorf("%w: node-2: timeout", errStandby), RecordedMaybe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The peer maps its error; the forwarding node reads the status
			// back and maps it again for its own client.
			again := Status(fromPeerStatus("node-1", Status(tc.err)))
			st := status.Convert(again)
			var got string
			for _, d := range st.Details() {
				if i, ok := d.(*errdetails.ErrorInfo); ok {
					got = i.Metadata[MetaRecorded]
				}
			}
			if got != tc.want {
				t.Errorf("forwarded %v: answered %v with recorded %q; want %q", tc.err, st, got, tc.want)
			}
		})
	}
}
