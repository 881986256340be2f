#!/usr/bin/env bash
# What a VirtualMachine's shape and the finalizer's write verb cost kube-apiserver, apart from
# any operator: a fresh control plane (controlplane.sh), the CRDs, then write_cost.py (its
# docstring says what it writes). Arguments go to write_cost.py.
#   bench/write_cost.sh [--n 1000] [--rounds 4] [--workers 4] [--shapes "vmop peer"] [--verbs "patch put"]
#                       [--validations "default Ignore"]
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
eval "$(scripts/prepare.sh)"
cp=$(mktemp -d "${TMPDIR:-/tmp}/vmop-write-cost.XXXXXX")
"$top/bench/controlplane.sh" "$cp" >/dev/null
trap 'kill "$(cat "$cp/apiserver.pid")" 2>/dev/null; sleep 1; kill "$(cat "$cp/etcd.pid")" 2>/dev/null; rm -rf "$cp"' EXIT
kubectl() { "$VMOP_CONTROLPLANE_BIN/kubectl" --kubeconfig "$cp/admin.kubeconfig" "$@"; }
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established crd/virtualmachines.vmop.dev >/dev/null
python3 "$top/bench/write_cost.py" "$cp" "$@"
