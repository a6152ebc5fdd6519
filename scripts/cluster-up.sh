#!/usr/bin/env bash
# cluster-up.sh: start an N-node Sluice cluster on 127.0.0.1, each node with
# its own ports, data dir and log file under $SLUICE_CLUSTER_DIR (default
# ./sluice-cluster). Stop it with scripts/cluster-down.sh.
#
#   scripts/cluster-up.sh [N]        # default 3 nodes
#
# Node i (from 1) serves gRPC on 127.0.0.1:(PORT_BASE+i*10+1), HTTP on
# 127.0.0.1:(PORT_BASE+i*10) and gossips on 127.0.0.1:(GOSSIP_BASE+i); all
# join node 1 with --expect N: a new cluster is bootstrapped once N nodes
# are up (later, --expect is ignored, so running it again with a larger N
# adds nodes to the running cluster). A node restarted later rejoins the
# Raft group it was in, through the members of the cluster map it kept in
# its data dir (raft.db).
#
# Environment:
#   SLUICE_CLUSTER_DIR          where nodes keep data, logs, pid files (./sluice-cluster)
#   SLUICE_CLUSTER_PORT_BASE    PORT_BASE above (9080: gRPC 9091, 9101, ...; HTTP 9090, 9100, ...)
#   SLUICE_CLUSTER_GOSSIP_BASE  GOSSIP_BASE above (7946: gossip 7947, 7948, ...)
#   SLUICE_CLUSTER_FLAGS        extra serve flags for every node
#   SLUICE_CLUSTER_BIN          a sluice binary to run instead of building
#                               ./cmd/sluice into $SLUICE_CLUSTER_DIR/sluice
set -euo pipefail
n=${1:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${SLUICE_CLUSTER_DIR:-$PWD/sluice-cluster}
port_base=${SLUICE_CLUSTER_PORT_BASE:-9080}
gossip_base=${SLUICE_CLUSTER_GOSSIP_BASE:-7946}
for v in "$n" "$port_base" "$gossip_base"; do
  case $v in
    '' | *[!0-9]*) echo "cluster-up.sh: $v is not a number (N, SLUICE_CLUSTER_PORT_BASE, SLUICE_CLUSTER_GOSSIP_BASE)" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
bin=${SLUICE_CLUSTER_BIN:-}
if [ -z "$bin" ]; then
  bin="$dir/sluice"
  (cd "$root" && go build -o "$bin" ./cmd/sluice)
fi
grpc_port() { echo $((port_base + $1 * 10 + 1)); }
http_port() { echo $((port_base + $1 * 10)); }
for i in $(seq 1 "$n"); do
  node="$dir/node-$i"
  mkdir -p "$node"
  if [ -f "$node/pid" ] && kill -0 "$(cat "$node/pid")" 2>/dev/null; then
    echo "node-$i already running (pid $(cat "$node/pid"))"; continue
  fi
  rm -f "$node/ready.json"
  # shellcheck disable=SC2086
  "$bin" serve --node-name "node-$i" \
    --grpc-addr "127.0.0.1:$(grpc_port "$i")" --http-addr "127.0.0.1:$(http_port "$i")" \
    --gossip-addr "127.0.0.1:$((gossip_base + i))" --join "127.0.0.1:$((gossip_base + 1))" --expect "$n" \
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
  echo "node-$i: gRPC 127.0.0.1:$(grpc_port "$i")  HTTP 127.0.0.1:$(http_port "$i")  log $dir/node-$i/log"
done
echo "the CLI: $bin (e.g. $bin members --addr 127.0.0.1:$(grpc_port 1))"
