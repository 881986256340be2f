#!/usr/bin/env bash
# Builds what the tests' node runs, from Go modules pinned here, into a cache outside the
# repository keyed by those pins (the same pattern as tests/controlplane/build.sh):
#   bin/kubelet, bin/kube-scheduler        kubernetes/go.mod (the control plane's pins)
#   bin/containerd, bin/ctr,               runtime/go.mod: containerd 2.x (>= 2.1 for image
#   bin/containerd-shim-runc-v2,             volumes), runc with seccomp (cgo, static against
#   bin/runc, cni/loopback                   libseccomp), the CNI loopback plugin
#   bin/pause, images/pause.tar            pause/: the project's sandbox program, and its OCI
#                                            image archive (scripts/oci_image.py) for `ctr images import`
# Three modules, because Kubernetes and containerd pin different grpc/otel versions and each is
# built with its own. Prints the output directory on its last line of stdout; everything else
# goes to stderr, with the time each build took.
#
# runc needs cgo and libseccomp: when `pkg-config libseccomp` fails, libseccomp-dev (and
# pkg-config, gcc) are installed with apt-get, as root, once.
#
#   VMOP_NODE_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/vmop/node)
set -euo pipefail

node=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf 'node: %s\n' "$*" >&2; }

here=$node/kubernetes
# shellcheck source=../go-tools.sh
. "$node/../go-tools.sh"
require_go "the node"

k8s_version=$(here=$node/kubernetes required_version k8s.io/kubernetes)
containerd_version=$(here=$node/runtime required_version github.com/containerd/containerd/v2)
runc_version=$(here=$node/runtime required_version github.com/opencontainers/runc)
# The tag of the pause image; the harness configures containerd's sandbox image with it.
pause_image=vmop.dev/node/pause:1
# Bump when the build recipe (flags, tags, tool list) changes so a stale cache is not reused.
recipe=1
key=$(cd "$node" && cat kubernetes/go.mod kubernetes/go.sum runtime/go.mod runtime/go.sum \
  pause/go.mod pause/main.go ../../scripts/oci_image.py <(echo "recipe=$recipe image=$pause_image") |
  sha256sum | cut -c1-16)
root=${VMOP_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmop/node}
out="$root/$k8s_version-containerd-$containerd_version-runc-$runc_version-$key"

if [ -f "$out/.complete" ]; then
  say "using cached node binaries in $out"
  echo "$out"
  exit 0
fi
mkdir -p "$out/bin" "$out/cni" "$out/images"
total=$SECONDS

# libseccomp's headers and static library, for runc's seccomp support.
if ! pkg-config --exists libseccomp 2>/dev/null || ! command -v gcc >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "runc needs gcc, pkg-config and libseccomp-dev: install them (as root: apt-get install gcc pkg-config libseccomp-dev)"
    exit 1
  fi
  start=$SECONDS
  say "installing gcc, pkg-config and libseccomp-dev with apt-get (for runc)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    gcc libc6-dev pkg-config libseccomp-dev >&2
  say "installed them in $((SECONDS - start)) s"
fi

for module in kubernetes runtime pause; do
  here=$node/$module download_modules "$module ($node/$module)"
done

# build NAME DEST MODULE PACKAGE [go build flags...]: builds PACKAGE from MODULE's directory
# into DEST/NAME unless it is there already (an interrupted build redoes only what is missing).
build() {
  local name=$1 dest=$2 module=$3 pkg=$4 start=$SECONDS
  shift 4
  if [ -x "$dest/$name" ]; then
    say "have $name"
    return
  fi
  say "building $name from $pkg"
  (cd "$node/$module" && go build -trimpath "$@" -o "$dest/$name.tmp" "$pkg")
  mv "$dest/$name.tmp" "$dest/$name"
  say "built $name in $((SECONDS - start)) s"
}

major=${k8s_version#v}; major=${major%%.*}
minor=${k8s_version#v*.}; minor=${minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
build kubelet "$out/bin" kubernetes k8s.io/kubernetes/cmd/kubelet -ldflags "$k8s_ldflags"
build kube-scheduler "$out/bin" kubernetes k8s.io/kubernetes/cmd/kube-scheduler -ldflags "$k8s_ldflags"

# containerd's own Makefile flags, less the snapshotters the node does not use (overlayfs is it).
cpkg=github.com/containerd/containerd/v2
containerd_ldflags="-s -w -X $cpkg/version.Version=$containerd_version -X $cpkg/version.Package=$cpkg"
containerd_tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"
build containerd "$out/bin" runtime $cpkg/cmd/containerd \
  -tags "$containerd_tags" -ldflags "$containerd_ldflags"
build ctr "$out/bin" runtime $cpkg/cmd/ctr -tags "$containerd_tags" -ldflags "$containerd_ldflags"
build containerd-shim-runc-v2 "$out/bin" runtime $cpkg/cmd/containerd-shim-runc-v2 \
  -tags "$containerd_tags no_grpc" -ldflags "$containerd_ldflags"
# runc's `make static`: cgo (libcontainer's nsenter is C), seccomp, linked statically.
CGO_ENABLED=1 build runc "$out/bin" runtime github.com/opencontainers/runc \
  -tags "seccomp netgo osusergo urfave_cli_no_docs" \
  -ldflags "-s -w -X main.version=${runc_version#v} -extldflags -static"
build loopback "$out/cni" runtime github.com/containernetworking/plugins/plugins/main/loopback \
  -ldflags "-s -w"
# The one main-module package: no VCS stamp, so the image's digest does not follow vmop's commits.
build pause "$out/bin" pause . -buildvcs=false -ldflags "-s -w"

start=$SECONDS
python3 "$node/../../scripts/oci_image.py" program --program "$out/bin/pause" \
  --name "$pause_image" --arch "$(go env GOARCH)" --out "$out/images/pause.tar"
echo "$pause_image" >"$out/images/pause.ref"
say "wrote the pause image archive ($pause_image) in $((SECONDS - start)) s"

touch "$out/.complete"
say "node binaries ready in $((SECONDS - total)) s: $out"
echo "$out"
