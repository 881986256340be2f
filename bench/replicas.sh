#!/usr/bin/env bash
# K replicas of one vmop command as one process for the driver (bench/run.sh --mode shards):
#   replicas.sh K VMOP run ARGS...
# K=1 runs the command as is (one replica, no sharding); K>1 adds `--shards K` and a distinct
# POD_NAME/`--instance` (replica-1 ... replica-K) to each. SIGTERM is passed on to every
# replica and the script ends once all have. Output goes to stdout, prefixed by replica.
set -uo pipefail
k=${1:?usage: replicas.sh K COMMAND ARGS...}
shift
[ "$k" = 1 ] && exec "$@"
pids=()
for i in $(seq "$k"); do
  POD_NAME=replica-$i "$@" --shards "$k" --instance "replica-$i" \
    > >(sed -u "s/^/[replica-$i] /") 2>&1 &
  pids+=("$!")
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
alive() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive; do wait "${pids[@]}" 2>/dev/null; done
