#!/usr/bin/env bash
# bench-route.sh: measures, on a running local cluster (scripts/cluster-up.sh),
# what sending each check straight to its key's owner is worth: the same load
# through Sluice's Go client (sluice bench --api client) with routing on (every
# node's address) and off (every check enters through node 1, which forwards
# two thirds of them), in alternating rounds (on, off, then off, on, ...).
#
#   SLUICE_CLUSTER_DIR=/tmp/sc scripts/bench-route.sh [--rounds 5] [--secs 5] [--c 64] [--batch 1] [--keys 10000]
#
# For each run it prints the decisions per second and the p99, and the CPU
# time the nodes and the load generator used (from /proc and /usr/bin/time):
# on a machine shared with other work the throughput moves with whatever else
# runs, while the decisions per CPU-second of the nodes ("same CPU") move much
# less. Then the medians per mode and the medians of the paired ratios
# (routed / through one node) of each round. What the client did (checks
# routed, forwarded) goes to stderr after each run.
#
# Environment: SLUICE_CLUSTER_DIR and SLUICE_CLUSTER_PORT_BASE as for
# scripts/cluster-up.sh (the nodes' pid files and gRPC ports).
set -euo pipefail
rounds=5 secs=5 conc=64 batch=1 keys=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --secs) secs=$2; shift 2 ;;
    --c) conc=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    *) echo "bench-route.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
dir=${SLUICE_CLUSTER_DIR:-$PWD/sluice-cluster}
port_base=${SLUICE_CLUSTER_PORT_BASE:-9080}
bin=${SLUICE_CLUSTER_BIN:-$dir/sluice}
pids=() addrs=()
for pidfile in "$dir"/node-*/pid; do
  [ -f "$pidfile" ] || continue
  i=$(basename "$(dirname "$pidfile")"); i=${i#node-}
  pid=$(cat "$pidfile")
  kill -0 "$pid" 2>/dev/null || { echo "bench-route.sh: node-$i (pid $pid) is not running" >&2; exit 1; }
  pids+=("$pid")
  addrs+=("127.0.0.1:$((port_base + i * 10 + 1))")
done
[ ${#pids[@]} -ge 2 ] || { echo "bench-route.sh: no cluster under $dir (run scripts/cluster-up.sh)" >&2; exit 1; }
all=$(IFS=,; echo "${addrs[*]}")
tck=$(getconf CLK_TCK)

node_cpu() { # CPU seconds used by the nodes so far
  local t=0 p
  for p in "${pids[@]}"; do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  awk -v t="$t" -v hz="$tck" 'BEGIN { printf "%.3f", t / hz }'
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() { # round mode
  local round=$1 mode=$2 before after
  before=$(node_cpu)
  /usr/bin/time -f '%U %S' -o "$out/time" "$bin" bench --api client --addr "$all" --routing "$mode" \
    --concurrency "$conc" --batch "$batch" --keys "$keys" --duration "${secs}s" --warmup 1s -q -o json \
    >"$out/json" 2>"$out/err" || { cat "$out/err" >&2; exit 1; }
  after=$(node_cpu)
  sed -n 's/^client: /  client (routing '"$mode"'): /p' "$out/err" >&2
  local dps p99 errs gen
  dps=$(grep -o '"decisions_per_s": *[0-9.e+]*' "$out/json" | awk '{print $2}')
  p99=$(grep -o '"p99_us": *[0-9.e+]*' "$out/json" | awk '{print $2 / 1000}')
  errs=$(grep -o '"errors": *[0-9]*' "$out/json" | awk '{print $2}')
  gen=$(awk '{print $1 + $2}' "$out/time")
  if [ "$errs" != 0 ]; then
    grep -o '"first_error": *"[^"]*"' "$out/json" | sed 's/^/  /' >&2
  fi
  # The node CPU covers the warmup too: scale the decisions to the whole run.
  awk -v r="$round" -v m="$mode" -v d="$dps" -v p="$p99" -v e="$errs" -v n="$(awk -v a="$after" -v b="$before" 'BEGIN{print a-b}')" \
    -v g="$gen" -v s="$secs" 'BEGIN {
      dec = d * (s + 1)
      printf "%d %-3s %9.0f %8.1f %6d %7.2f %7.2f %8.0f %8.0f\n", r, m, d, p, e, n, g, dec / n, dec / (n + g)
    }'
}

echo "round mode decisions/s p99_ms errors node_cpu_s gen_cpu_s dec/node_cpu_s dec/cpu_s" >&2
lines=()
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
  for m in $order; do
    line=$(run "$r" "$m")
    echo "$line"
    lines+=("$line")
  done
done
printf '%s\n' "${lines[@]}" | awk '
  function median(a, n,    i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { d[$2, $1] = $3; p[$2, $1] = $4; c[$2, $1] = $8; t[$2, $1] = $9; if ($1 > n) n = $1 }
  END {
    for (m = 0; m < 2; m++) {
      mode = m ? "off" : "on"
      for (i = 1; i <= n; i++) { a[i] = d[mode, i]; b[i] = p[mode, i]; x[i] = c[mode, i]; y[i] = t[mode, i] }
      printf "median %-3s %9.0f decisions/s, p99 %.1f ms, %.0f decisions per node CPU-s, %.0f per CPU-s\n", mode, median(a, n), median(b, n), median(x, n), median(y, n)
    }
    for (i = 1; i <= n; i++) { a[i] = d["on", i] / d["off", i]; x[i] = c["on", i] / c["off", i]; y[i] = t["on", i] / t["off", i] }
    printf "routed / through one node, median of paired rounds: decisions/s %.2f, per node CPU-s %.2f, per CPU-s %.2f\n", median(a, n), median(x, n), median(y, n)
  }'
