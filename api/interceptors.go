package api

import (
	"context"
	"crypto/subtle"
	"runtime/debug"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Method prefixes of the services that need the admin token when one is
// set: the admin API, the traffic report (it names the keys), and the
// internal peer service (forwarded checks and handoffs must not be
// injectable by anyone who reaches the port).
const (
	adminPrefix   = "/sluice.v1.AdminService/"
	trafficPrefix = "/sluice.v1.TrafficService/"
	peerPrefix    = "/sluice.v1.PeerService/"
)

// intercept is the node's unary interceptor: a request that did not decode
// is answered INVALID_ARGUMENT (see requestCodec), admin, traffic and peer
// calls need the admin token when one is set (decisions stay open to the
// proxies), and a panic in a handler becomes an Internal error, so that one
// bad request cannot take the node down. One interceptor, not a chain of
// three: gRPC allocates a chain's links anew for every call.
func (s *Server) intercept(c requestCodec) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		if err := c.decoded(req); err != nil {
			return nil, err
		}
		if err := s.checkToken(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		defer func() {
			if r := recover(); r != nil {
				s.log.Error("panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
				err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return h(ctx, req)
	}
}

// authorizeStream requires the admin token on streams (the peer handoff),
// as intercept does on unary calls.
func (s *Server) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.checkToken(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

func (s *Server) checkToken(ctx context.Context, method string) error {
	if s.cfg.AdminToken == "" || !strings.HasPrefix(method, adminPrefix) && !strings.HasPrefix(method, trafficPrefix) && !strings.HasPrefix(method, peerPrefix) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		token, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.AdminToken)) == 1 {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "admin API: send the admin token as metadata \"authorization: Bearer <token>\" (sluice CLI: --admin-token or SLUICE_ADMIN_TOKEN; every node of a cluster needs the same token)")
}

// mayRefund reports whether the caller may give hits back: a refund
// erases counted hits, so when an admin or refund token is set it needs
// one of them (see Config.RefundToken). Nothing is recorded when it fails.
func (s *Server) mayRefund(ctx context.Context) error {
	if s.holdsGiveBackToken(ctx) {
		return nil
	}
	return status.Error(codes.Unauthenticated, "refunds give counted hits back, so they need a credential: send \"authorization: Bearer <token>\" with the refund token (--refund-token) or the admin token; nothing was recorded")
}

// mayLease reports whether the caller may hold quota leases (a native
// check with lease, an RLQS stream): a holder decides on its own and
// reports what it spent, the unspent rest going back to the key, so it
// is trusted as a refund is and needs the same credential. what names
// the request in the error.
func (s *Server) mayLease(ctx context.Context, what string) error {
	if s.holdsGiveBackToken(ctx) {
		return nil
	}
	return status.Errorf(codes.Unauthenticated, "%s: a lease holder decides on its own and reports what it spent, so it needs a credential: send \"authorization: Bearer <token>\" with the refund token (--refund-token) or the admin token (Envoy: the grpc_service's initial_metadata); nothing was granted", what)
}

// holdsGiveBackToken reports whether ctx carries the refund or admin
// token, or no such token is set.
func (s *Server) holdsGiveBackToken(ctx context.Context) bool {
	if s.cfg.AdminToken == "" && s.cfg.RefundToken == "" {
		return true
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		token, ok := strings.CutPrefix(v, "Bearer ")
		if !ok {
			continue
		}
		for _, want := range []string{s.cfg.RefundToken, s.cfg.AdminToken} {
			if want != "" && subtle.ConstantTimeCompare([]byte(token), []byte(want)) == 1 {
				return true
			}
		}
	}
	return false
}

// tokenCredentials sends the admin token on a node's calls to its peers.
type tokenCredentials struct {
	token  string
	secure bool
}

func (c tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

func (c tokenCredentials) RequireTransportSecurity() bool { return c.secure }
