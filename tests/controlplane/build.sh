#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the Go modules pinned in
# go.mod/go.sum into a cache outside the repository, keyed by those pins. Prints the directory
# holding the binaries on its last line of stdout; everything else goes to stderr.
#
#   VMOP_CONTROLPLANE_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/vmop/controlplane)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf 'controlplane: %s\n' "$*" >&2; }

command -v go >/dev/null 2>&1 || {
  say "the 'go' command is not on PATH: install Go (>= $(sed -n 's/^go //p' "$here/go.mod")) to build the control plane"
  exit 1
}

k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$here/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { print $2; exit }' "$here/go.mod")
# Bump when the build recipe (flags, tool list) changes so a stale cache is not reused.
recipe=1
key=$( (cat "$here/go.mod" "$here/go.sum"; echo "recipe=$recipe") | sha256sum | cut -c1-16)
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
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
say "downloading modules for kubernetes $k8s_version and etcd $etcd_version (through GOPROXY=$(go env GOPROXY))"
if ! (cd "$here" && go mod download); then
  say "go mod download failed: the Go module proxy is unreachable or refused a pinned version (output above)"
  exit 1
fi

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
