#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the Go modules pinned in
# go.mod/go.sum into a cache outside the repository, keyed by those pins. Prints the directory
# holding the binaries on its last line of stdout; everything else goes to stderr.
#
#   VMOP_CONTROLPLANE_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/vmop/controlplane)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf 'controlplane: %s\n' "$*" >&2; }

# shellcheck source=../go-tools.sh
. "$here/../go-tools.sh"
require_go "the control plane"

k8s_version=$(required_version k8s.io/kubernetes)
etcd_version=$(required_version go.etcd.io/etcd/server/v3)
# Bump when the build recipe (flags, tool list) changes so a stale cache is not reused.
key=$(cache_key 1)
root=${VMOP_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmop/controlplane}
out="$root/$k8s_version-etcd-$etcd_version-$key"
tools=(kube-apiserver kube-controller-manager kubectl etcd)

have_all() { for t in "${tools[@]}"; do [ -x "$out/$t" ] || return 1; done; }
if have_all; then
  say "using cached binaries in $out"
  echo "$out"
  exit 0
fi

mkdir -p "$out"
download_modules "kubernetes $k8s_version and etcd $etcd_version"

major=${k8s_version#v}; major=${major%%.*}
minor=${k8s_version#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() {
  local name=$1 pkg=$2 start=$SECONDS
  say "building $name from $pkg (the first build takes minutes)"
  (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  say "built $name in $((SECONDS - start)) s"
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl k8s.io/kubernetes/cmd/kubectl
echo "$out"
