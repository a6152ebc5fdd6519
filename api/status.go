package api

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/cluster"
)

// inputError is bad input found by the api layer (rather than the engine):
// it maps to InvalidArgument with its message, and with an
// errdetails.BadRequest when it names the fields at fault.
type inputError struct {
	msg    string
	fields []string // paths of the request's fields at fault, "checks[0].window"
}

func (e *inputError) Error() string { return e.msg }

// badInput returns an *inputError. Messages say what to change.
func badInput(format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...)}
}

// badFields is badInput about the named fields of the request.
func badFields(fields []string, format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...), fields: fields}
}

// errNotClustered is an admin call that needs a cluster made to a single
// node: FailedPrecondition.
var errNotClustered = errors.New("this node is not in a cluster")

// toStatus maps an error to the gRPC status a client sees. It is the only
// place where errors become statuses.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ie *inputError
	if errors.As(err, &ie) {
		st := status.New(codes.InvalidArgument, ie.msg)
		if len(ie.fields) > 0 {
			br := &errdetails.BadRequest{}
			for _, f := range ie.fields {
				br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: f, Description: ie.msg})
			}
			if withDetails, err := st.WithDetails(br); err == nil {
				st = withDetails
			}
		}
		return st.Err()
	}
	if errors.Is(err, errNotClustered) {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	// Engine and cluster errors: the mapping the peer protocol shares.
	return cluster.Status(err)
}

// checkStatus is toStatus for one check of a batch that could not be
// decided (actor.Decision.Err): its code and message, for the fields
// error_code and error_message of its decision.
func checkStatus(err error) (code uint32, msg string) {
	st := status.Convert(toStatus(err))
	return uint32(st.Code()), st.Message()
}
