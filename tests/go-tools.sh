# Shared steps of the scripts that build pinned Go tools into a cache outside the repository
# (tests/controlplane/build.sh, tests/helm/build.sh). Sourced, not run. The caller sets `here`
# (the directory of its go.mod) and `say` (its progress function, to stderr) first.

# Stops with a message naming what is missing when there is no Go toolchain.
require_go() {
  command -v go >/dev/null 2>&1 || {
    say "the 'go' command is not on PATH: install Go (>= $(sed -n 's/^go //p' "$here/go.mod")) to build $1"
    exit 1
  }
}

# The version a module is required at in go.mod (not its `tool` lines, which carry none).
required_version() {
  awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$here/go.mod"
}

# A cache key over the pins and the caller's recipe number (bumped when flags or tools change).
cache_key() {
  (cat "$here/go.mod" "$here/go.sum"; echo "recipe=$1") | sha256sum | cut -c1-16
}

# Downloads the pinned modules, showing the proxy used; the go command's own output on failure.
download_modules() {
  export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
  say "downloading modules for $1 (through GOPROXY=$(go env GOPROXY))"
  if ! (cd "$here" && go mod download); then
    say "go mod download failed: the Go module proxy is unreachable or refused a pinned version (output above)"
    exit 1
  fi
}
