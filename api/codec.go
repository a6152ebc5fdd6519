package api

import (
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// requestCodec is gRPC's protobuf codec, except for a request that does not
// decode: gRPC would answer INTERNAL itself, before any interceptor runs,
// though the fault is the caller's. requestCodec resets the message, notes
// why in undecodable, and lets the call go on to Server.intercept, which
// answers INVALID_ARGUMENT.
type requestCodec struct {
	encoding.CodecV2
	undecodable *sync.Map // proto.Message (the request) → error
	// pending counts undecodable's entries, so that a request that decoded
	// (every well-formed one) costs one atomic load, not a map lookup.
	pending *atomic.Int64
}

func newRequestCodec() requestCodec {
	return requestCodec{CodecV2: encoding.GetCodecV2(protoenc.Name), undecodable: new(sync.Map), pending: new(atomic.Int64)}
}

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawRequest); ok {
		// Kept for the request budget, decoded once it is taken.
		data.Ref()
		r.data, r.codec = data, c
		return nil
	}
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	proto.Reset(m)
	c.pending.Add(1)
	c.undecodable.Store(m, err)
	return nil
}

// decoded returns INVALID_ARGUMENT if req did not decode.
func (c requestCodec) decoded(req any) error {
	if c.pending.Load() == 0 {
		return nil
	}
	if err, ok := c.undecodable.LoadAndDelete(req); ok {
		c.pending.Add(-1)
		return status.Errorf(codes.InvalidArgument, "the request is not a valid %T protobuf message: %v", req, err)
	}
	return nil
}

// checkDecodedStream is the stream interceptor of requestCodec: each
// message received is checked as Server.intercept checks a unary request.
func (c requestCodec) checkDecodedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, decodedStream{ServerStream: ss, c: c})
}

type decodedStream struct {
	grpc.ServerStream
	c requestCodec
}

func (s decodedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.c.decoded(m)
}
