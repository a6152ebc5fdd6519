// Package xdstest is an xDS management server for tests: it serves the
// Aggregated Discovery Service on 127.0.0.1, pushes the RateLimitConfig
// resources a test gives it, and hands the test every request it receives
// (the first of a stream, ACKs and NACKs), so that a test can play the
// management server's part of the protocol step by step.
package xdstest

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// TypeURL is the type of the resources Send pushes.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// wait bounds every wait of the server for the client.
const wait = 10 * time.Second

// Server is a management server. Its methods fail the test after 10s
// without the client; they are for the test's goroutine.
type Server struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	t testing.TB
	// Addr is the address it serves on.
	Addr    string
	push    chan *discoveryv3.DiscoveryResponse
	reqs    chan *discoveryv3.DiscoveryRequest
	drop    chan struct{}
	streams atomic.Int32
	md      atomic.Pointer[metadata.MD] // of the latest stream
}

// New starts a server on 127.0.0.1:0, stopped when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, Addr: lis.Addr().String(), push: make(chan *discoveryv3.DiscoveryResponse),
		reqs: make(chan *discoveryv3.DiscoveryRequest, 64), drop: make(chan struct{})}
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s)
	done := make(chan struct{})
	go func() { defer close(done); g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return s
}

// StreamAggregatedResources serves one stream: it forwards the client's
// requests to Request and pushes what Send gives it.
func (s *Server) StreamAggregatedResources(st grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	s.streams.Add(1)
	md, _ := metadata.FromIncomingContext(st.Context())
	s.md.Store(&md)
	go func() { // ends with the stream
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			select {
			case s.reqs <- r:
			case <-st.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case resp := <-s.push:
			if err := st.Send(resp); err != nil {
				return err
			}
		case <-s.drop:
			return status.Error(codes.Unavailable, "xdstest: stream dropped by the test")
		case <-st.Context().Done():
			return nil
		}
	}
}

// Request returns the client's next request.
func (s *Server) Request() *discoveryv3.DiscoveryRequest {
	s.t.Helper()
	select {
	case r := <-s.reqs:
		return r
	case <-time.After(wait):
		s.t.Fatalf("xdstest: no request from the client within %v", wait)
		return nil
	}
}

// Send pushes configs as version, with nonce, on the open stream.
func (s *Server) Send(version, nonce string, configs ...*rlsconfv3.RateLimitConfig) {
	s.t.Helper()
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: version, Nonce: nonce, TypeUrl: TypeURL}
	for _, c := range configs {
		a, err := anypb.New(c)
		if err != nil {
			s.t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	select {
	case s.push <- resp:
	case <-time.After(wait):
		s.t.Fatalf("xdstest: the client has no stream open within %v", wait)
	}
}

// Drop ends the open stream with UNAVAILABLE.
func (s *Server) Drop() {
	s.t.Helper()
	select {
	case s.drop <- struct{}{}:
	case <-time.After(wait):
		s.t.Fatalf("xdstest: the client has no stream open within %v", wait)
	}
}

// Metadata is the request metadata of the latest stream, nil before one.
func (s *Server) Metadata() metadata.MD {
	if md := s.md.Load(); md != nil {
		return *md
	}
	return nil
}

// Streams is how many streams clients opened.
func (s *Server) Streams() int { return int(s.streams.Load()) }
