package api

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/persist"
)

// inputError is bad input found by the api layer (rather than the engine):
// it maps to InvalidArgument with its message.
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

// badInput returns an *inputError. Messages say what to change.
func badInput(format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...)}
}

// toStatus maps an error to the gRPC status a client sees. It is the only
// place where errors become statuses.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ice *actor.InvalidCheckError
	var ie *inputError
	switch {
	case errors.As(err, &ice):
		return status.Errorf(codes.InvalidArgument, "check %d: %s: %s", ice.Index, ice.Field, ice.Reason)
	case errors.As(err, &ie):
		return status.Error(codes.InvalidArgument, ie.msg)
	case errors.Is(err, actor.ErrBatchTooLarge):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, actor.ErrOverloaded), errors.Is(err, actor.ErrTooManyKeys):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, actor.ErrClosed), errors.Is(err, persist.ErrClosed):
		return status.Error(codes.Unavailable, "sluice: node shutting down; retry on another node")
	case errors.Is(err, cluster.ErrUnreachable):
		return status.Error(codes.Unavailable, err.Error()+"; the edge decides whether to fail open or closed")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
