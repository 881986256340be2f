#!/usr/bin/env bash
# Builds vmop's operator image without a container engine, as an OCI archive that
# `ctr images import`, `skopeo copy oci-archive:...` or `podman load` read, and optionally one
# image per provider plugin. The image is the Dockerfile's final stage rebuilt from the same
# inputs (scripts/oci_image.py says how); `docker build .` remains the way with an engine.
#
#   scripts/image.sh [--debug] [--out DIR] [--tag TAG] [--plugins]
#
#   --debug    package the dev-profile binary the tests build, instead of a release build
#   --out DIR  where the archives go (default target/images)
#   --tag TAG  image tag (default dev)
#   --plugins  also pack each provider plugin built for the tests (target/wasm-guests/...)
#
# Prints each archive's path on stdout; sizes and digests go to stderr.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
profile=release
out="$top/target/images"
tag=dev
plugins=false
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) profile=debug ;;
    --out) out=$2; shift ;;
    --tag) tag=$2; shift ;;
    --plugins) plugins=true ;;
    *) echo "image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"

start=$SECONDS
if [ "$profile" = release ]; then
  (cd "$top" && cargo build --release --locked -p vmop --bin vmop >&2)
else
  (cd "$top" && cargo build --locked -p vmop --bin vmop >&2)
fi
printf 'image.sh: built the %s binary in %d s\n' "$profile" "$((SECONDS - start))" >&2

python3 "$top/scripts/oci_image.py" operator --binary "$top/target/$profile/vmop" \
  --name "docker.io/vmop/vmop:$tag" --out "$out/vmop.tar"
echo "$out/vmop.tar"

if $plugins; then
  for wasm in "$top"/target/wasm-guests/wasm32-wasip2/release/vmop_provider_*.wasm; do
    [ -f "$wasm" ] || continue
    name=$(basename "$wasm" .wasm)
    name=${name#vmop_provider_}
    python3 "$top/scripts/oci_image.py" plugin --wasm "$wasm" \
      --name "docker.io/vmop/$name-plugin:$tag" --out "$out/$name-plugin.tar" >/dev/null
    echo "$out/$name-plugin.tar"
  done
fi
