package api

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// HTTP endpoints of envoyproxy/ratelimit that its users script against,
// served by the node on its HTTP listener.

// defaultMaxJSONBytes bounds a /json body when Config.MaxMessageBytes is 0.
const defaultMaxJSONBytes = 4 << 20

// JSONHandler serves envoyproxy/ratelimit's /json endpoint: a POST whose
// body is a RateLimitRequest in protobuf's JSON mapping ({"domain": ...,
// "descriptors": [{"entries": [{"key": ..., "value": ...}]}]}, with
// hits_addend or hitsAddend) is decided exactly as ShouldRateLimit decides
// it, and answered with the RateLimitResponse in the JSON mapping: status
// 200 when the overall code is OK, 429 when it is OVER_LIMIT.
//
// Like the gRPC API, a decision needs no credential, but a refund
// (is_negative_hits) does when the node has an admin or refund token: the
// Authorization header ("Bearer <token>") carries it. Errors are answered
// in text with the HTTP status of their gRPC code (see httpStatus): 400 for
// a body that is not a request or a request that is malformed, 401 for a
// refund without a credential, 503 when the node is overloaded or cannot
// decide.
func (s *Server) JSONHandler() http.Handler {
	e := &envoyService{s: s}
	max := int64(s.cfg.MaxMessageBytes)
	if max <= 0 {
		max = defaultMaxJSONBytes
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "/json takes a POST whose body is a rate limit request in JSON", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
		if err != nil {
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				http.Error(w, fmt.Sprintf("the body is larger than %d bytes", max), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "read the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "the body is not a rate limit request in JSON ({\"domain\": ..., \"descriptors\": [{\"entries\": [{\"key\": ..., \"value\": ...}]}]}): "+err.Error(), http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		if auth := r.Header.Values("Authorization"); len(auth) > 0 {
			ctx = metadata.NewIncomingContext(ctx, metadata.MD{"authorization": auth})
		}
		resp, err := e.ShouldRateLimit(ctx, &req)
		if err != nil {
			st := status.Convert(err)
			http.Error(w, st.Message(), httpStatus(st.Code()))
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, "encode the response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		w.Write(out)
	})
}

// LimitsConfigHandler serves envoyproxy/ratelimit's /rlconfig: the rules of
// the limits in force as text, one line per rule (see limits.Config.Dump),
// and nothing without a limits file. When the node has an admin token, the
// request needs it in its Authorization header ("Bearer <token>"), as the
// admin API does: the rules say what a client may send.
func (s *Server) LimitsConfigHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "/rlconfig takes a GET", http.StatusMethodNotAllowed)
			return
		}
		if !s.httpAdmin(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
			http.Error(w, "/rlconfig needs the admin token: send \"Authorization: Bearer <token>\"", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s.limits != nil {
			io.WriteString(w, s.limits.Current().Dump())
		}
	})
}

// httpAdmin reports whether r may use the admin endpoints: no admin token
// is set, or r carries it.
func (s *Server) httpAdmin(r *http.Request) bool {
	if s.cfg.AdminToken == "" {
		return true
	}
	for _, v := range r.Header.Values("Authorization") {
		token, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.AdminToken)) == 1 {
			return true
		}
	}
	return false
}

// httpStatus is the HTTP status of an error of the decision APIs, by its
// gRPC code. 429 is kept for OVER_LIMIT: an overloaded node is 503, so that
// a script tells "denied" from "try again".
func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted, codes.Unavailable, codes.Aborted:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded, codes.Canceled:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
