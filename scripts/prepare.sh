#!/usr/bin/env bash
# Installs or builds what the tests and the demo need and that a fresh machine lacks, then
# prints `export` lines for the caller to eval. Idempotent and cached:
#   - the wasm32-wasip2 Rust target (and rustfmt/clippy);
#   - etcd, kube-apiserver, kube-controller-manager, kubectl built from Go modules
#     (tests/controlplane/build.sh; cached outside the repo, keyed on the pins);
#   - helm (tests/helm/build.sh, same pattern), to render the chart in the manifest tests;
#   - the test node: kubelet, kube-scheduler, containerd, runc, the CNI loopback plugin and the
#     pause image (tests/node/build.sh, same pattern; installs libseccomp-dev for runc);
#   - moto's EC2-compatible server in a Python venv outside the repo, keyed on its version;
#   - componentize-py (builds the Python provider, providers/python/) in the same venv, keyed on
#     its own version, so changing one pin reinstalls only that package.
# Progress goes to stderr; stdout carries only the export lines.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'prepare: %s\n' "$*" >&2; }
cache=${VMOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmop}
moto_version=5.2.5
componentize_py_version=0.25.1

need() {
  command -v "$1" >/dev/null 2>&1 || { say "'$1' is not on PATH: $2"; exit 1; }
}
need cargo "install Rust with rustup (https://rustup.rs)"
need rustup "the wasm32-wasip2 target is added with rustup"
need go "install Go to build the Kubernetes control plane from its modules"
need python3 "install Python 3 to run moto's EC2 server"

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  say "adding the wasm32-wasip2 Rust target"
  rustup target add wasm32-wasip2 >&2
fi
for component in rustfmt clippy; do
  rustup component list --installed | grep -q "^$component" || rustup component add "$component" >&2
done

controlplane_bin=$("$top/tests/controlplane/build.sh" | tail -n 1)
helm_bin=$("$top/tests/helm/build.sh" | tail -n 1)
node_bin=$("$top/tests/node/build.sh" | tail -n 1)

venv="$cache/moto-$moto_version"
# The stamp is written last, so an interrupted install is redone rather than trusted.
if [ ! -f "$venv/.complete" ]; then
  say "installing moto[server]==$moto_version into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$moto_version" >&2
  touch "$venv/.complete"
else
  say "using moto from $venv"
fi
componentize_stamp="$venv/.componentize-py-$componentize_py_version"
if [ ! -f "$componentize_stamp" ]; then
  say "installing componentize-py==$componentize_py_version into $venv"
  rm -f "$venv"/.componentize-py-*
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "componentize-py==$componentize_py_version" >&2
  touch "$componentize_stamp"
else
  say "using componentize-py $componentize_py_version from $venv"
fi

printf 'export VMOP_CONTROLPLANE_BIN=%q\n' "$controlplane_bin"
printf 'export VMOP_HELM=%q\n' "$helm_bin"
printf 'export VMOP_NODE_BIN=%q\n' "$node_bin"
printf 'export VMOP_MOTO_SERVER=%q\n' "$venv/bin/moto_server"
printf 'export VMOP_COMPONENTIZE_PY=%q\n' "$venv/bin/componentize-py"
printf 'export PATH=%q:"$PATH"\n' "$controlplane_bin"
