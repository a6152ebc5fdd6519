package api

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/cluster"
)

// inputError is bad input found by the api layer (rather than the engine):
// it maps to InvalidArgument with its message.
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

// badInput returns an *inputError. Messages say what to change.
func badInput(format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...)}
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
		return status.Error(codes.InvalidArgument, ie.msg)
	}
	if errors.Is(err, errNotClustered) {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	// Engine and cluster errors: the mapping the peer protocol shares.
	return cluster.Status(err)
}
