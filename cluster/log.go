package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// newMemberlistLogger returns a standard logger for memberlist whose lines,
// "[LEVEL] memberlist: message", go to l at the matching slog level, with
// attribute lib=memberlist.
func newMemberlistLogger(l *slog.Logger) *log.Logger {
	return log.New(memberlistWriter{l.With("lib", "memberlist")}, "", 0)
}

type memberlistWriter struct{ l *slog.Logger }

var memberlistLevels = []struct {
	prefix string
	level  slog.Level
}{
	{"[DEBUG]", slog.LevelDebug},
	{"[INFO]", slog.LevelInfo},
	{"[WARN]", slog.LevelWarn},
	{"[ERR]", slog.LevelError},
	{"[ERROR]", slog.LevelError},
}

func (w memberlistWriter) Write(p []byte) (int, error) {
	n := len(p)
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, l := range memberlistLevels {
		if bytes.HasPrefix(line, []byte(l.prefix)) {
			level = l.level
			line = bytes.TrimSpace(line[len(l.prefix):])
			break
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	ctx := context.Background()
	if w.l.Enabled(ctx, level) {
		w.l.Log(ctx, level, string(line))
	}
	return n, nil
}
