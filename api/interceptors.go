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

// adminPrefix is the method prefix of the admin service.
const adminPrefix = "/sluice.v1.AdminService/"

// authorize requires the admin token on admin calls when one is set.
// Decisions stay open to the proxies.
func (s *Server) authorize(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if s.cfg.AdminToken == "" || !strings.HasPrefix(info.FullMethod, adminPrefix) {
		return h(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		token, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.AdminToken)) == 1 {
			return h(ctx, req)
		}
	}
	return nil, status.Error(codes.Unauthenticated, "admin API: send the admin token as metadata \"authorization: Bearer <token>\" (sluice CLI: --admin-token or SLUICE_ADMIN_TOKEN)")
}

// recoverPanics turns a panic in a handler into an Internal error, so that
// one bad request cannot take the node down.
func (s *Server) recoverPanics(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
	}()
	return h(ctx, req)
}
