#!/usr/bin/env bash
# cluster-down.sh: stop the nodes scripts/cluster-up.sh started (SIGTERM:
# each leaves its keys complete on their standbys, ends its epoch and
# exits), waiting up to 30 s for each. Once a quorum of voters has stopped,
# the nodes left cannot end their epochs and take their --shutdown-timeout.
set -euo pipefail
dir=${SLUICE_CLUSTER_DIR:-$PWD/sluice-cluster}
for pidfile in "$dir"/node-*/pid; do
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "pid $pid still running; killing" >&2; kill -KILL "$pid"; fi
  fi
  rm -f "$pidfile"
done
