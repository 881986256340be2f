#!/usr/bin/env bash
# The one-command demo: a local Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager), moto's EC2 API and the vmop operator with the ec2 WebAssembly plugin;
# a ProviderConfig, its Secret and three VirtualMachines from deploy/samples/ become Running, then
# it prints `kubectl get vm` and how to use the cluster. Ctrl-C stops everything it started.
#
#   scripts/demo.sh                    # runs until Ctrl-C
#   scripts/demo.sh --in-cluster       # the operator as a Pod on a real node (kubelet,
#                                      #   containerd, runc) from the image built here, by
#                                      #   `helm install`, its plugin from an image volume
#   scripts/demo.sh --exit-when-ready  # stops everything right after printing (CI, tests)
#   scripts/demo.sh --help             # the demo's own options
#
# The first run installs and builds what is missing (scripts/prepare.sh: Kubernetes from its Go
# modules, moto in a venv) and the Rust workspace: many minutes on two cores. Later runs take
# seconds.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
say() { printf 'demo.sh: %s\n' "$*" >&2; }

# Says every 30 s that a silent step is still at work, until it is killed or the shell `owner`
# is gone (Ctrl-C). It sleeps a second at a time, so no sleep outlives it by more than that.
progress() {
  local label=$1 owner=$2 ticks=0
  while sleep 1 && kill -0 "$owner" 2>/dev/null; do
    ticks=$((ticks + 1))
    if [ $((ticks % 30)) -eq 0 ]; then
      say "$label: still at work after $ticks s"
    fi
  done
}

# Runs "$@" with a progress line every 30 s; its stdout is the step's stdout.
with_progress() {
  local label=$1 begun=$SECONDS status=0
  shift
  progress "$label" "$BASHPID" >&2 &
  local ticker=$!
  trap 'kill "$ticker" 2>/dev/null' EXIT
  "$@" || status=$?
  trap - EXIT
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$status" -eq 0 ]; then
    say "$label: done in $((SECONDS - begun)) s"
  fi
  return "$status"
}

begun=$SECONDS
say "preparing the prerequisites (the first run builds etcd, kube-apiserver,"
say "  kube-controller-manager and kubectl from their Go modules: about 15 minutes on two cores)"
exports=$(with_progress "preparing" scripts/prepare.sh)
eval "$exports"

say "building vmop and the demo (the first build compiles the workspace and the wasm plugins:"
say "  minutes; cargo shows its progress)"
with_progress "building vmop and the demo" \
  cargo build -p vmop --bin vmop -p vmop-tests --bin demo
say "ready to run after $((SECONDS - begun)) s of preparation"

# `exec`: the demo takes this process's place, so Ctrl-C and SIGTERM reach it directly and it
# stops everything it started.
exec cargo run --quiet -p vmop-tests --bin demo -- "$@"
