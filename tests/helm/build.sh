#!/usr/bin/env bash
# Builds helm from the Go module pinned in go.mod/go.sum into a cache outside the repository,
# keyed by those pins. Prints the path of the helm binary on its last line of stdout; everything
# else goes to stderr. Same pattern as tests/controlplane/build.sh.
#
#   VMOP_HELM_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/vmop/helm)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf 'helm: %s\n' "$*" >&2; }

# shellcheck source=../go-tools.sh
. "$here/../go-tools.sh"
require_go helm

version=$(required_version helm.sh/helm/v4)
# Bump when the build recipe (flags) changes so a stale cache is not reused.
key=$(cache_key 1)
root=${VMOP_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vmop/helm}
out="$root/$version-$key"

if [ -x "$out/helm" ]; then
  say "using cached $out/helm"
  echo "$out/helm"
  exit 0
fi

mkdir -p "$out"
download_modules "helm $version"

pkg=helm.sh/helm/v4/internal/version
ldflags="-s -w -X $pkg.version=$version -X $pkg.metadata= -X $pkg.gitTreeState=clean"
start=$SECONDS
say "building helm $version (the first build takes a few minutes)"
(cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out/helm.tmp" helm.sh/helm/v4/cmd/helm)
mv "$out/helm.tmp" "$out/helm"
say "built helm in $((SECONDS - start)) s"
echo "$out/helm"
