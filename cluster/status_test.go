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
// could not reach the key's owner" without reading the message.
func TestStatusReasons(t *testing.T) {
	for _, tc := range []struct {
		err        error
		wantReason string
		wantMember string
	}{
		{fmt.Errorf("%w: node-0 holds no lease", ErrNoQuorum), ReasonNoQuorum, ""},
		{fmt.Errorf("%w: waiting for the handoff of node-1", ErrMoving), ReasonMoving, ""},
		{actor.ErrStale, ReasonMoving, ""},
		{fmt.Errorf("%w: node-2, which owns the key, is down", ErrOwnerDown), ReasonOwnerDown, ""},
		{&UnreachableError{Member: "node-2", Reason: "dial 127.0.0.1:1: connection refused"}, ReasonOwnerUnreachable, "node-2"},
		{fmt.Errorf("%w: override set here but not on every node", ErrUnreachable), ReasonOwnerUnreachable, ""},
		{actor.ErrClosed, ReasonShuttingDown, ""},
	} {
		st := status.Convert(Status(tc.err))
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		if st.Code() != codes.Unavailable || info == nil || info.Domain != ErrorDomain || info.Reason != tc.wantReason || info.Metadata["member"] != tc.wantMember {
			t.Errorf("Status(%v) = %v, details %v; want Unavailable with ErrorInfo reason %s, member %q", tc.err, st.Code(), info, tc.wantReason, tc.wantMember)
		}
	}
}
