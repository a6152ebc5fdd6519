#!/usr/bin/env bash
# Floods a single node with distinct keys and reports its anonymous memory
# and its data file: the figures of docs/operations.md, "Memory and disk".
#
#   scripts/flood.sh [MAX_KEYS [FLOOD_KEYS [LIVE_KEYS]]]   (defaults 20000 1000000 20000)
#
# 1. LIVE_KEYS keys with a 10-minute window are written; they stay live.
# 2. `sluice bench --keys FLOOD_KEYS --batch 100 --duration 20s`, a 20 s
#    window: about a million distinct keys, past --max-keys.
# 3. Wait until the flood has expired, been swept and compacted.
# Then a fresh node receives the live keys alone and stops: its data file is
# what the live keys need. RssAnon is sampled from /proc every 0.2 s.
# Linux only; talks to 127.0.0.1 only; about two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
max_keys=${1:-20000} flood_keys=${2:-1000000} live_keys=${3:-20000}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
go build -o "$work/sluice" ./cmd/sluice

start() { # start DIR: a node on port 0; sets pid and addr
  "$work/sluice" serve --data-dir "$1" --max-keys "$max_keys" --grpc-addr 127.0.0.1:0 \
    --http-addr "" --ready-file "$1.ready" --log-level warn 2>>"$work/log" &
  pid=$!
  for _ in $(seq 100); do [ -s "$1.ready" ] && break; sleep 0.1; done
  addr=$(sed -n 's/.*"grpc_addr":"\([^"]*\)".*/\1/p' "$1.ready")
}
bench() { "$work/sluice" bench --addr "$addr" --warmup 0s "$@" >/dev/null 2>>"$work/log"; }
size() { stat -c %s "$1/sluice.db"; }
anon() { awk '/RssAnon/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

start "$work/flood"
node=$pid
( peak=0; while kill -0 "$node" 2>/dev/null; do a=$(anon "$node"); [ "${a:-0}" -gt "$peak" ] && peak=$a && echo "$peak" >"$work/peak"; sleep 0.2; done ) &
bench --keys "$live_keys" --key-prefix live: --window 10m --batch 100 --duration 3s
bench --keys "$flood_keys" --key-prefix flood: --window 20s --batch 100 --duration 20s
flooded=$(size "$work/flood")
echo "after the flood:   data file $((flooded >> 20)) MiB, peak RssAnon $(( $(cat "$work/peak") >> 10 )) MiB"
# Keys expire 20 s after their last hit; sweeps and the compaction follow.
for _ in $(seq 90); do sleep 1; done
echo "after its expiry:  data file $(( $(size "$work/flood") >> 20 )) MiB, RssAnon $(( $(anon "$node") >> 10 )) MiB, peak RssAnon $(( $(cat "$work/peak") >> 10 )) MiB"
kill "$node"; wait "$node" || true

start "$work/live"
bench --keys "$live_keys" --key-prefix live: --window 10m --batch 100 --duration 3s
kill "$pid"; wait "$pid" || true
echo "live keys alone:   data file $(( $(size "$work/live") >> 20 )) MiB"
