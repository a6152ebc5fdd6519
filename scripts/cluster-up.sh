#!/usr/bin/env bash
# cluster-up.sh: start an N-node Sluice cluster on 127.0.0.1, each node with
# its own ports, data dir and log file under $SLUICE_CLUSTER_DIR (default
# ./sluice-cluster). Stop it with scripts/cluster-down.sh.
#
#   scripts/cluster-up.sh [N]        # default 3 nodes
#
# Node i (from 1) serves gRPC on 127.0.0.1:(9080+i*10+1), HTTP on
# 127.0.0.1:(9080+i*10) and gossips on 127.0.0.1:(7946+i); all join node 1,
# and expect N nodes (a node decides nothing without a lease from a majority
# of them). A node restarted later rejoins through the members it knew.
# Extra serve flags for every node: SLUICE_CLUSTER_FLAGS.
set -euo pipefail
n=${1:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${SLUICE_CLUSTER_DIR:-$PWD/sluice-cluster}
mkdir -p "$dir"
(cd "$root" && go build -o "$dir/sluice" ./cmd/sluice)
for i in $(seq 1 "$n"); do
  node="$dir/node-$i"
  mkdir -p "$node"
  if [ -f "$node/pid" ] && kill -0 "$(cat "$node/pid")" 2>/dev/null; then
    echo "node-$i already running (pid $(cat "$node/pid"))"; continue
  fi
  rm -f "$node/ready.json"
  # shellcheck disable=SC2086
  "$dir/sluice" serve --node-name "node-$i" \
    --grpc-addr "127.0.0.1:$((9080 + i * 10 + 1))" --http-addr "127.0.0.1:$((9080 + i * 10))" \
    --gossip-addr "127.0.0.1:$((7946 + i))" --join "127.0.0.1:7947" --expect "$n" \
    --data-dir "$node/data" --ready-file "$node/ready.json" ${SLUICE_CLUSTER_FLAGS:-} \
    >"$node/log" 2>&1 &
  echo $! >"$node/pid"
done
for i in $(seq 1 "$n"); do
  for _ in $(seq 1 100); do
    [ -f "$dir/node-$i/ready.json" ] && break
    sleep 0.1
  done
  if [ ! -f "$dir/node-$i/ready.json" ]; then
    echo "node-$i did not start; see $dir/node-$i/log" >&2; exit 1
  fi
  echo "node-$i: gRPC 127.0.0.1:$((9080 + i * 10 + 1))  HTTP 127.0.0.1:$((9080 + i * 10))  log $dir/node-$i/log"
done
