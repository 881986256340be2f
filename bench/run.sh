#!/usr/bin/env bash
# The scale benchmark, in one command: vmop (release build, the testcloud provider
# against the in-memory `vmop-testcloud`), the controller-runtime peer (bench/peer/) and the
# bare-client floor, on one fresh control plane, through one driver (bench/peer/driver/), and
# the table with ratios. README.md beside this file says what each figure is.
#
#   bench/run.sh [--sizes "1000 10000"] [--reps N] [--mode scale|shards] [--impls "floor vmop peer"]
#                [--idle 60s] [--work DIR] [--no-build]
#                [--cloud default|ec2-like] [--ec2-scale F] [--cloud-latency 50ms..200ms]
#
# Each flag has an environment twin: SIZES (default 1000), REPS (2), MODE (scale), IMPLS,
# IDLE, WORK (default $TMPDIR/vmop-bench, outside the repository), and VMOP_ARGS: extra
# `vmop run` flags (default `--resync-period 30m`: the peer never re-reads its machines, so
# vmop's drift check is kept out of the measured window; VMOP_ARGS= measures with the 5m default),
# VMOP: a vmop binary to measure instead of building target/release/vmop (e.g.
# target/release/vmop-operator, the same CLI built inside the test package); VMOP_BASE: a second
# vmop binary, measured as impl `base` (IMPLS="base vmop peer") with ratios vmop/base: before and
# after a change in one run. PLUGIN: another component for the testcloud, e.g. the Python one the
# test package builds (target/wasm-guests/python/vmop_provider_testcloud_py.wasm). TESTCLOUD: a
# vmop-testcloud binary to use instead of target/release/vmop-testcloud (not built then).
# For each N and each rep the runs alternate floor, vmop, peer, each in its own namespace, in that
# order on odd rounds and reversed on even ones, so that no impl always runs first or last (the
# machine drifts over a session: the summary lists the load average at each run's start).
# IMPLS may add peer-same: the peer storing the object vmop stores (bench/peer/main.go -status vmop).
# MODE=shards: vmop on 1 replica vs 3 sharded replicas (IMPLS "vmop-x1 vmop-x3", K replicas
# with --shards K each; base-xK: VMOP_BASE's), default N=5000, 1 round, no idle phase; prints
# the speed-up.
# --cloud ec2-like (CLOUD): the testcloud throttles as EC2 does (vmop-testcloud --ec2-buckets: request
# buckets for reads and mutations, RunInstances and TerminateInstances resource buckets, all
# scaled by --ec2-scale/EC2_SCALE, default 1) and delays each answer by --cloud-latency/
# CLOUD_LATENCY (default 50ms..200ms, uniform); default impls "vmop vmop-nolist peer", idle 120s,
# VMOP_ARGS empty (vmop's own defaults), DEADLINE 3h; vmop-nolist is vmop with VMOP_NOLIST_ARGS
# (default --cloud-view off) added; the peer keeps its machines in the same testcloud (-cloud).
# The summary adds the cloud's calls per VM by phase, its 429s, calls per VM-hour over the idle
# window, and each phase's time against the bucket-limited floor.
# Results: $WORK/results.jsonl (one JSON object per run), $WORK/summary.md (the table), logs.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
here=$top/bench
cd "$top"

sizes=${SIZES:-}
reps=${REPS:-}
mode=${MODE:-scale}
impls=${IMPLS:-}
idle=${IDLE:-}
work=${WORK:-${TMPDIR:-/tmp}/vmop-bench}
cloud=${CLOUD:-default}
ec2_scale=${EC2_SCALE:-1}
cloud_latency=${CLOUD_LATENCY:-}
build=1
while [ $# -gt 0 ]; do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --impls) impls=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --cloud) cloud=$2; shift 2 ;;
    --ec2-scale) ec2_scale=$2; shift 2 ;;
    --cloud-latency) cloud_latency=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
case $cloud in
  default) ;;
  ec2-like)
    [ "$mode" = scale ] || { echo "run.sh: --cloud ec2-like goes with --mode scale" >&2; exit 2; }
    impls=${impls:-vmop vmop-nolist peer} idle=${idle:-120s} cloud_latency=${cloud_latency:-50ms..200ms} ;;
  *) echo "run.sh: --cloud is default or ec2-like, not $cloud" >&2; exit 2 ;;
esac
case $mode in
  scale) sizes=${sizes:-1000} reps=${reps:-2} impls=${impls:-floor vmop peer} idle=${idle:-60s} ;;
  # vmop-xK: K replicas of vmop (K>1: --shards K each; bench/replicas.sh)
  shards) sizes=${sizes:-5000} reps=${reps:-1} impls=${impls:-vmop-x1 vmop-x3} idle=${idle:-0s} ;;
  *) echo "run.sh: MODE is scale or shards, not $mode" >&2; exit 2 ;;
esac
if [ "$cloud" = ec2-like ]; then
  vmop_args=${VMOP_ARGS-} deadline=${DEADLINE:-3h}
else
  vmop_args=${VMOP_ARGS---resync-period 30m} deadline=${DEADLINE:-30m}
fi
# What vmop-nolist adds to vmop's flags: the drift checks without the cloud view.
vmop_nolist_args=${VMOP_NOLIST_ARGS---cloud-view off}
say() { printf -- '-- %s %s\n' "$(date -u +%T)" "$*"; }

eval "$(scripts/prepare.sh)"
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$work/bin
mkdir -p "$bin" "$work/plugins" "$work/vmop-cache" "$work/logs"
wasm=${PLUGIN:-$target/wasm-guests/wasm32-wasip2/release/vmop_provider_testcloud.wasm}
if [ "$build" = 1 ]; then
  if [ -z "${VMOP:-}" ] && [ -z "${TESTCLOUD:-}" ]; then
    say "building vmop and vmop-testcloud (release)"
    cargo build --release --locked -p vmop --bin vmop -p vmop-tests --bin vmop-testcloud
  elif [ -z "${TESTCLOUD:-}" ]; then
    say "building vmop-testcloud (release); vmop is $VMOP"
    cargo build --release --locked -p vmop-tests --bin vmop-testcloud
  elif [ -z "${VMOP:-}" ]; then
    say "building vmop (release); vmop-testcloud is $TESTCLOUD"
    cargo build --release --locked -p vmop --bin vmop
  else
    say "vmop is $VMOP, vmop-testcloud is $TESTCLOUD: neither is built"
  fi
  say "building the testcloud provider (wasm32-wasip2, release)"
  # As tests/build.rs does: the guests' own workspace and target directory, no host flags.
  env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_TARGET -u CARGO_TARGET_DIR \
    cargo build --release --locked --target wasm32-wasip2 --manifest-path providers/Cargo.toml \
    -p vmop-provider-testcloud --target-dir "$target/wasm-guests"
  say "building the peer and the driver (go build; modules from the Go module proxy)"
  (cd "$here/peer" && GOWORK=off go build -o "$bin/peer" . && GOWORK=off go build -o "$bin/driver" ./driver)
fi
vmop=${VMOP:-$target/release/vmop}
testcloud=${TESTCLOUD:-$target/release/vmop-testcloud}
for f in "$vmop" "$testcloud" "$wasm" "$bin/peer" "$bin/driver"; do
  [ -f "$f" ] || { echo "run.sh: $f is missing (run without --no-build)" >&2; exit 1; }
done
cp "$wasm" "$work/plugins/testcloud.wasm"

# A fresh control plane and testcloud for this invocation, stopped on exit.
rm -rf "$work/cp"
pids=()
# kube-apiserver first (it lingers after SIGTERM once etcd is gone), then etcd and the testcloud.
cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
say "starting etcd + kube-apiserver in $work/cp"
"$here/controlplane.sh" "$work/cp" >/dev/null
pids+=("$(cat "$work/cp/apiserver.pid")" "$(cat "$work/cp/etcd.pid")")
export KUBECONFIG=$work/cp/admin.kubeconfig
kubectl() { "$VMOP_CONTROLPLANE_BIN/kubectl" "$@"; }
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established crd/virtualmachines.vmop.dev crd/providerconfigs.vmop.dev >/dev/null

# The driver's VMs ask for image ami-12c6146b, which the testcloud is told to accept.
testcloud_args=(--listen 127.0.0.1:0 --image ami-12c6146b)
if [ "$cloud" = ec2-like ]; then
  testcloud_args+=(--ec2-buckets --ec2-scale "$ec2_scale" --latency "$cloud_latency")
fi
"$testcloud" "${testcloud_args[@]}" >"$work/testcloud.out" 2>"$work/logs/testcloud.log" &
pids+=("$!")
testcloud_pid=$!
for _ in $(seq 100); do [ -s "$work/testcloud.out" ] && break; sleep 0.1; done
endpoint=$(head -1 "$work/testcloud.out")
[ -n "$endpoint" ] || { echo "run.sh: vmop-testcloud printed no endpoint" >&2; exit 1; }
say "testcloud at $endpoint${testcloud_args[4]:+ (${testcloud_args[*]:4})}"
# The cloud's throttles as it runs them: the summary's bucket-limited floors come from here.
rm -f "$work/cloud-limits.json"
driver_cloud=()
if [ "$cloud" = ec2-like ]; then
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1] + "/v1/limits").read().decode())' \
    "$endpoint" >"$work/cloud-limits.json"
  driver_cloud=(-cloud "$endpoint")
fi

# No limit of vmop's may set the pace: the plugin calls are not throttled (the defaults, 10/s in
# bursts of 20 and 8 at once, would make the limiter, not the operator, the bottleneck), and the
# testcloud has no read-after-write lag, so no creation grace period. No credentials.
# Against the EC2-like cloud, vmop is configured as its user would be (VMOP_LIMITS=cloud, the
# default there): the reads within the cloud's read rate, calls that change machines within its
# mutating rate (and nothing of the reads', as EC2 charges them), each burst below the cloud's by a second of its rate (a full cloud bucket refills
# nothing while a request travels; a request takes well under a second to arrive);
# VMOP_LIMITS=none keeps the unthrottled limits above.
limits="requestsPerSecond: 10000, burst: 10000, maxConcurrentCalls: 1024, creationGracePeriodSeconds: 0"
if [ "$cloud" = ec2-like ] && [ "${VMOP_LIMITS:-cloud}" = cloud ]; then
  limits=$(python3 - "$work/cloud-limits.json" <<'PY'
import json, sys
ec2 = json.load(open(sys.argv[1]))["ec2"]
rate = lambda b: max(1, int(b["perSecond"]))
burst = lambda b: max(1, int(b["burst"]) - rate(b))
print(f"requestsPerSecond: {rate(ec2['read'])}, burst: {burst(ec2['read'])}, "
      f"mutatingRequestsPerSecond: {rate(ec2['mutate'])}, mutatingBurst: {burst(ec2['mutate'])}, "
      "maxConcurrentCalls: 1024, creationGracePeriodSeconds: 0")
PY
)
  say "vmop's ProviderConfig limits: $limits"
fi
kubectl apply --server-side --force-conflicts -f - >/dev/null <<EOF
apiVersion: vmop.dev/v1alpha1
kind: ProviderConfig
metadata: {name: bench}
spec:
  plugin: {path: testcloud.wasm}
  config: {endpoint: "$endpoint"}
  allowedHosts: ["$endpoint"]
  allowPrivateNetworks: true
  limits: {$limits}
EOF
watch=(-watch "apiserver=$(cat "$work/cp/apiserver.pid")" -watch "etcd=$(cat "$work/cp/etcd.pid")"
       -watch "testcloud=$testcloud_pid")

results=$work/results.jsonl
: >"$results"
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- host providers || echo ' (+ uncommitted changes in host/ or providers/)')"
  echo "vmop binary $vmop${VMOP:+ (given by VMOP, not built here)}; cores $(nproc); vmop run flags: --max-concurrent-reconciles 16 $vmop_args; idle $idle"
  if [ "$cloud" = ec2-like ]; then
    echo "cloud: EC2-like, vmop-testcloud ${testcloud_args[*]:4}; vmop-nolist adds: $vmop_nolist_args; the peer keeps its machines in the testcloud"
  fi
} >"$work/meta.txt"
: >"$work/loads.tsv"

# With an EC2-like cloud the peer's machines live in it too (bench/peer/cloud.go).
peer_cloud=()
[ "$cloud" = ec2-like ] && peer_cloud=(-cloud "$endpoint")

# `vmop run` as every vmop impl runs it ('{ns}': the driver's namespace).
# shellcheck disable=SC2206 # VMOP_ARGS is split on purpose
vmop_run=(run --plugin-dir "$work/plugins" --cache-dir "$work/vmop-cache" --namespace '{ns}'
          --operator-namespace '{ns}' --metrics-addr 127.0.0.1:0 --max-concurrent-reconciles 16
          $vmop_args)

run() { # IMPL N REP
  local impl=$1 n=$2 rep=$3 ns="$1-$2-$3" cmd=()
  case $impl in
    floor) cmd=() ;;
    vmop) cmd=(-- "$vmop" "${vmop_run[@]}") ;;
    # shellcheck disable=SC2206 # VMOP_NOLIST_ARGS is split on purpose
    vmop-nolist) cmd=(-- "$vmop" "${vmop_run[@]}" $vmop_nolist_args) ;;
    # The same flags for a second vmop binary, for before/after in one run.
    base) cmd=(-- "${VMOP_BASE:?impl base measures the binary VMOP_BASE names}" "${vmop_run[@]}") ;;
    vmop-x*) cmd=(-- "$here/replicas.sh" "${impl#vmop-x}" "$vmop" "${vmop_run[@]}") ;;
    base-x*) cmd=(-- "$here/replicas.sh" "${impl#base-x}" "${VMOP_BASE:?impl base-xK measures the binary VMOP_BASE names}" "${vmop_run[@]}") ;;
    peer) cmd=(-- "$bin/peer" --namespace '{ns}' --metrics-bind-address 127.0.0.1:0
               --max-concurrent-reconciles 16 "${peer_cloud[@]}") ;;
    # The peer storing the object vmop stores (its status fields, the create-location annotation):
    # the same operator work with vmop's object, to tell the object's cost from the operator's.
    peer-same) cmd=(-- "$bin/peer" --namespace '{ns}' --metrics-bind-address 127.0.0.1:0
               --max-concurrent-reconciles 16 -status vmop -location "testcloud:$endpoint" "${peer_cloud[@]}") ;;
    *) echo "run.sh: unknown implementation $impl (floor, base, vmop, vmop-nolist, peer, peer-same, vmop-xK, base-xK)" >&2; return 1 ;;
  esac
  # Every vmop run starts as a new pod does, with an empty plugin cache (the chart's emptyDir):
  # it compiles the plugin at start, and what that leaves in its memory counts.
  rm -rf "$work/vmop-cache" && mkdir -p "$work/vmop-cache"
  local extra=(-idle "$idle")
  [ "$impl" = floor ] && extra=(-floor -idle 0s) # no operator to watch idling
  [ -n "${PPROF:-}" ] && extra+=(-pprof "$work/pprof")
  printf '%s\t%s\n' "$impl N=$n #$rep" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$work/loads.tsv"
  say "$impl N=$n #$rep (namespace $ns; load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$bin/driver" -namespace "$ns" -n "$n" -workers 16 "${extra[@]}" "${driver_cloud[@]}" -deadline "$deadline" \
    -label "$impl N=$n #$rep" -out "$results" -log "$work/logs/$ns.log" "${watch[@]}" "${cmd[@]}"
}

order() { # REP: the impls in the order given, reversed on even rounds
  # shellcheck disable=SC2086 # impls is a list
  if [ $(($1 % 2)) = 0 ]; then printf '%s\n' $impls | tac; else printf '%s\n' $impls; fi
}

failed=0
for n in $sizes; do
  for rep in $(seq "$reps"); do
    for impl in $(order "$rep"); do
      run "$impl" "$n" "$rep" || { echo "!! $impl N=$n #$rep failed (log: $work/logs/$impl-$n-$rep.log)"; failed=1; }
    done
  done
done
python3 "$here/summarize.py" "$results" "$work/meta.txt" "$work/loads.tsv" "$work/cloud-limits.json" | tee "$work/summary.md"
say "done: $work/summary.md"
exit "$failed"
