package main

import (
	"log/slog"

	"github.com/sluice-io/sluice/actor"
)

// readableAttr is the ReplaceAttr of serve's log handlers: it writes
// durations as Go writes them ("1m30s"), which the text handler does
// already and the JSON handler does not (it writes nanoseconds).
func readableAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// engineAttrs describes the engine's configuration as the engine runs it:
// the flags left at 0 show the defaults they stand for (durability decides
// that of --max-keys).
func engineAttrs(cfg actor.Config, durability string) []any {
	if cfg.MaxKeys <= 0 && durability != "memory" {
		cfg.MaxKeys = actor.DefaultMaxKeys // the default with a data file
	}
	cfg = cfg.Effective()
	return []any{
		"actors", cfg.Actors,
		"max_keys", cfg.MaxKeys,
		"mailbox_size", cfg.MailboxSize,
		"max_key_len", cfg.Limits.MaxKeyLen,
		"max_batch", cfg.Limits.MaxBatch,
	}
}
