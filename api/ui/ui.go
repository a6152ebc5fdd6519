package ui

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/cluster"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

//go:embed static
var staticFiles embed.FS

// Prefix is the path the pages are served under.
const Prefix = "/ui/"

// Config configures the pages.
type Config struct {
	// AdminToken, when set, is the bearer token every /ui/api/ request
	// needs (the node's admin token).
	AdminToken string
	// Clock tells the time; nil is the wall clock.
	Clock clock.Clock
	// Logger receives the handlers' errors; nil discards them.
	Logger *slog.Logger
}

// Backend is what the pages show: a node's api.Server implements it.
type Backend interface {
	// NodeName is the node's name.
	NodeName() string
	// Admin is the admin service, answering for the whole cluster.
	Admin() sluicepb.AdminServiceServer
	// Traffic answers TrafficService.GetTraffic for the whole cluster.
	Traffic(context.Context, *sluicepb.GetTrafficRequest) (*sluicepb.GetTrafficResponse, error)
	// KeyOwner and KeyStandby name the nodes that decide a key and hold
	// its copy ("" for none).
	KeyOwner(key string) string
	KeyStandby(key string) string
	// OverrideFor is the override in force for a key, or nil.
	OverrideFor(key []byte) *sluicepb.Override
	// MembershipChanges are the node's last membership changes, oldest
	// first.
	MembershipChanges() []cluster.Change
}

// Handler serves the pages and their data.
type Handler struct {
	cfg Config
	b   Backend
	log *slog.Logger
	mux *http.ServeMux
}

// New returns the handler of Prefix: mount it on the node's mux as
// mux.Handle(ui.Prefix, h).
func New(cfg Config, b Backend) *Handler {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, b: b, log: cfg.Logger.With("component", "ui"), mux: http.NewServeMux()}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	h.mux.Handle("GET "+Prefix, http.StripPrefix(Prefix, http.FileServerFS(static)))
	h.mux.HandleFunc("GET "+Prefix+"api/overview", h.api(h.overview))
	h.mux.HandleFunc("GET "+Prefix+"api/key", h.api(h.key))
	h.mux.HandleFunc("GET "+Prefix+"api/envoykey", h.api(h.envoyKey))
	h.mux.HandleFunc("GET "+Prefix+"api/overrides", h.api(h.overrides))
	h.mux.HandleFunc("GET "+Prefix+"api/", h.api(func(*http.Request) (any, error) {
		return nil, httpError{http.StatusNotFound, "no such endpoint"}
	}))
	return h
}

// ServeHTTP serves the pages (GET) and their data.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cache-Control", "no-cache")
	h.mux.ServeHTTP(w, r)
}

// httpError is an error with the HTTP status it answers.
type httpError struct {
	code int
	msg  string
}

func (e httpError) Error() string { return e.msg }

// api wraps a data handler: the token check, then JSON out, or an error as
// {"error": "..."} with its status.
func (h *Handler) api(f func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		var v any
		err := h.authorize(r)
		if err == nil {
			v, err = f(r)
		}
		if err != nil {
			code, msg := httpStatus(err)
			if code >= 500 {
				h.log.Warn("ui: request failed", "path", r.URL.Path, "err", err)
			}
			w.WriteHeader(code)
			json.NewEncoder(w).Encode(map[string]string{"error": msg})
			return
		}
		if err := json.NewEncoder(w).Encode(v); err != nil {
			h.log.Debug("ui: write response", "path", r.URL.Path, "err", err)
		}
	}
}

// errToken is a request without the admin token.
var errToken = httpError{http.StatusUnauthorized, "this node has an admin token: enter it to see the cluster's data"}

// authorize requires the admin token, when one is set, as a bearer token.
func (h *Handler) authorize(r *http.Request) error {
	if h.cfg.AdminToken == "" {
		return nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(token), []byte(h.cfg.AdminToken)) == 1 {
		return nil
	}
	return errToken
}

// httpStatus maps an error to its HTTP status and message: a gRPC status
// from the admin API by its code.
func httpStatus(err error) (int, string) {
	var he httpError
	if errors.As(err, &he) {
		return he.code, he.msg
	}
	st, ok := status.FromError(err)
	if !ok {
		return http.StatusInternalServerError, err.Error()
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest, st.Message()
	case codes.NotFound:
		return http.StatusNotFound, st.Message()
	case codes.Unauthenticated:
		return http.StatusUnauthorized, st.Message()
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted:
		return http.StatusServiceUnavailable, st.Message()
	case codes.DeadlineExceeded, codes.Canceled:
		return http.StatusGatewayTimeout, st.Message()
	}
	return http.StatusInternalServerError, st.Message()
}
