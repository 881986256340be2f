#!/usr/bin/env bash
# The one command that runs every check and test of vmop, on a fresh machine or a warm one.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
say() { printf '\n== %s\n' "$*" >&2; }

say "preparing toolchain target, control plane and moto"
eval "$(scripts/prepare.sh)"

say "formatting"
cargo fmt --all -- --check
for ws in providers tests/fixtures/guests; do
  [ -f "$ws/Cargo.toml" ] && (cd "$ws" && cargo fmt --all -- --check)
done

say "lints (host workspace, then guests for wasm32-wasip2)"
cargo clippy --workspace --all-targets --locked -- -D warnings
for ws in providers tests/fixtures/guests; do
  [ -f "$ws/Cargo.toml" ] && (cd "$ws" && cargo clippy --workspace --all-targets --target wasm32-wasip2 --locked -- -D warnings)
done

say "guest unit tests (pure logic: SigV4 vectors, XML, status mapping), native and Python"
(cd providers && cargo test --workspace --locked)
python3 -m unittest discover -s providers/python/tests

say "tests (guests are built to wasm32-wasip2 by tests/build.rs)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --locked "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# One closing line for the whole run: cargo prints one per test binary, the last often a doc-test
# binary with nothing in it.
awk '/^test result:/ { p += $4; f += $6 } END { printf "\ntests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
