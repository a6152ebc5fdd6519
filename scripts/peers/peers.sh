#!/usr/bin/env bash
# peers.sh: measures a running Sluice node side by side with its nearest peer
# (gubernator v2.13.0, installed from the Go module proxy) and with an echo
# server that answers without counting (the gRPC ceiling on this machine), on
# the same work, in one run, in alternating rounds.
#
#   scripts/peers/peers.sh --sluice 127.0.0.1:8081 [--rounds 3] [--secs 5] [--c 64] [--keys 10000]
#
# Start the Sluice node first, pinned to CPU 0 as the peers are
# (taskset -c 0 sluice serve ...); the load runs on CPU 1. Sluice is driven
# through the Envoy RLS v3 API with an inline limit per descriptor.
# Prints one line per run, then medians and the ratios that matter.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sluice="" rounds=3 secs=5 conc=64 keys=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --sluice) sluice=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --secs) secs=$2; shift 2 ;;
    --c) conc=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

cache=${SLUICE_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-bench}
mkdir -p "$cache/bin"
if [ ! -x "$cache/bin/gubernator" ]; then
  echo "installing gubernator v2.13.0 into $cache/bin (once; takes a few minutes)" >&2
  (cd "$cache" && GOBIN="$cache/bin" GOFLAGS=-mod=mod go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@v2.13.0)
fi
(cd "$here" && go build -o "$cache/bin/load" ./load && go build -o "$cache/bin/echo" ./echo)

pids=()
cleanup() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

pin0="" pin1=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin0="taskset -c 0"; pin1="taskset -c 1"; fi

$pin0 "$cache/bin/echo" -addr 127.0.0.1:17900 >/dev/null 2>&1 & pids+=($!)
GUBER_GRPC_ADDRESS=127.0.0.1:17981 GUBER_HTTP_ADDRESS=127.0.0.1:17980 GUBER_PEER_DISCOVERY_TYPE=member-list \
  GUBER_MEMBERLIST_ADDRESS=127.0.0.1:17946 GUBER_MEMBERLIST_KNOWN_NODES=127.0.0.1:17946 GUBER_LOG_LEVEL=error \
  $pin0 "$cache/bin/gubernator" >"$cache/gubernator.log" 2>&1 & pids+=($!)
sleep 3

run() { # label proto addr batch
  $pin1 "$cache/bin/load" -json -label "$1" -proto "$2" -addr "$3" -batch "$4" -c "$conc" -d "${secs}s" -keys "$keys"
}
out=$(mktemp)
for r in $(seq "$rounds"); do
  for b in 1 10; do
    run echo rls 127.0.0.1:17900 $b | sed "s/^/b$b /" >>"$out"
    run gubernator gubernator 127.0.0.1:17981 $b | sed "s/^/b$b /" >>"$out"
    [ -n "$sluice" ] && run sluice rls "$sluice" $b | sed "s/^/b$b /" >>"$out"
  done
done

python3 - "$out" <<'PY'
import json, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    b, js = line.split(" ", 1)
    r = json.loads(js)
    rows.setdefault((b, r["label"]), []).append(r)
    err = f'  errors {r["errors"]}: {r.get("first_error","")}' if r["errors"] else ""
    print(f'{b:4} {r["label"]:11} {r["decisions_per_s"]:10.0f} decisions/s  p50 {r["p50_us"]:7.0f} µs  p99 {r["p99_us"]:7.0f} µs{err}')
print()
med = {}
for (b, label), rs in sorted(rows.items()):
    m = st.median(x["decisions_per_s"] for x in rs)
    p99 = st.median(x["p99_us"] for x in rs)
    med[(b, label)] = m
    print(f'median {b:4} {label:11} {m:10.0f} decisions/s  p99 {p99:7.0f} µs')
for b in ("b1", "b10"):
    s, g, e = med.get((b, "sluice")), med.get((b, "gubernator")), med.get((b, "echo"))
    if s and g and e:
        print(f'{b}: sluice/gubernator {s/g:.2f}   sluice/echo {s/e:.2f}   gubernator/echo {g/e:.2f}')
PY
