package control

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogger passes hashicorp/raft's logs to slog, with attribute lib=raft.
// Raft's INFO lines (elections, heartbeats) go to debug unless they say
// something changed for the cluster; its WARN and ERROR keep their level.
type hclogger struct {
	l    *slog.Logger
	name string
	args []any
}

func newHCLogger(l *slog.Logger) hclog.Logger { return &hclogger{l: l.With("lib", "raft")} }

func (h *hclogger) log(level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !h.l.Enabled(ctx, level) {
		return
	}
	all := append(append([]any{}, h.args...), args...)
	h.l.Log(ctx, level, msg, all...)
}

func (h *hclogger) Log(level hclog.Level, msg string, args ...any) {
	switch level {
	case hclog.Trace, hclog.Debug:
		h.Debug(msg, args...)
	case hclog.Info:
		h.Info(msg, args...)
	case hclog.Warn:
		h.Warn(msg, args...)
	default:
		h.Error(msg, args...)
	}
}
func (h *hclogger) Trace(msg string, args ...any) { h.log(slog.LevelDebug-4, msg, args...) }
func (h *hclogger) Debug(msg string, args ...any) { h.log(slog.LevelDebug, msg, args...) }
func (h *hclogger) Info(msg string, args ...any)  { h.log(slog.LevelInfo, msg, args...) }
func (h *hclogger) Warn(msg string, args ...any)  { h.log(slog.LevelWarn, msg, args...) }
func (h *hclogger) Error(msg string, args ...any) { h.log(slog.LevelError, msg, args...) }
func (h *hclogger) IsTrace() bool                 { return false }
func (h *hclogger) IsDebug() bool                 { return h.l.Enabled(context.Background(), slog.LevelDebug) }
func (h *hclogger) IsInfo() bool                  { return true }
func (h *hclogger) IsWarn() bool                  { return true }
func (h *hclogger) IsError() bool                 { return true }
func (h *hclogger) ImpliedArgs() []any            { return h.args }
func (h *hclogger) With(args ...any) hclog.Logger {
	return &hclogger{l: h.l, name: h.name, args: append(append([]any{}, h.args...), args...)}
}
func (h *hclogger) Name() string { return h.name }
func (h *hclogger) Named(name string) hclog.Logger {
	n := name
	if h.name != "" {
		n = h.name + "." + name
	}
	return &hclogger{l: h.l.With("sub", n), name: n, args: h.args}
}
func (h *hclogger) ResetNamed(name string) hclog.Logger {
	return &hclogger{l: h.l.With("sub", name), name: name, args: h.args}
}
func (h *hclogger) SetLevel(hclog.Level)  {}
func (h *hclogger) GetLevel() hclog.Level { return hclog.Info }
func (h *hclogger) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(nil), "", 0)
}
func (h *hclogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer { return writer{h} }

type writer struct{ h *hclogger }

func (w writer) Write(p []byte) (int, error) {
	w.h.Info(fmt.Sprintf("%s", p))
	return len(p), nil
}
