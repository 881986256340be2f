#!/usr/bin/env python3
"""The scale benchmark's tables from the driver's results.jsonl: per N, floor | base | vmop |
vmop-nolist | peer | peer-same (the peer storing vmop's object), those that ran, with ratios
vmop/peer, vmop/peer-same, vmop/base, vmop/vmop-nolist, vmop-nolist/peer, vmop/floor and
peer/floor (ratios of the means; each cell the range over the runs), then the writes per VM by
verb and resource. With runs against a throttled testcloud (run.sh --cloud ec2-like: the
driver's -cloud, phases with "cloud" counters) and its limits (LIMITS.json, the testcloud's
GET /v1/limits), also the cloud's figures and the bucket-limited floors.

usage: summarize.py RESULTS.jsonl [META.txt] [LOADS.tsv] [LIMITS.json]"""
import json
import os
import sys
from collections import defaultdict

IMPLS = ("floor", "base", "vmop", "vmop-nolist", "peer", "peer-same")
DRIVER_WRITES = ("POST virtualmachines", "DELETECOLLECTION virtualmachines")


def peak_rss(r):
    return max(r["startupPeakRssMiB"], r["create"]["peakRssMiB"], r["idle"]["peakRssMiB"],
               r["delete"]["peakRssMiB"])


def total_cpu(r):
    """What a CPU-bound machine spends per VM lifecycle: the wall time follows it."""
    spent = 0.0
    for phase in ("create", "delete"):
        spent += r[phase]["cpuSeconds"] + sum(r[phase]["watchedCpuSeconds"].values())
    return 1000 * spent / r["n"]


def w(phase):
    return lambda r: r[phase]["operatorWrites"] / r["n"]


# (name, value of one run, unit, whether the floor has it); see ONLY for rows only vmop has
MAIN = [
    ("create → all Ready", lambda r: r["create"]["seconds"], " s", True),
    ("delete → all gone", lambda r: r["delete"]["seconds"], " s", True),
    ("operator writes per VM, create + delete", None, "", True),
    ("kube-apiserver CPU, create", lambda r: r["create"]["watchedCpuSeconds"].get("apiserver", 0), " s", True),
    ("operator peak RSS", peak_rss, " MiB", False),
    ("operator CPU, idle", lambda r: r["idle"]["cpuSeconds"], " s", False),
]
MORE = [
    ("kube-apiserver CPU, delete", lambda r: r["delete"]["watchedCpuSeconds"].get("apiserver", 0), " s", True),
    ("kube-apiserver CPU ms per VM, create + delete",
     lambda r: 1000 * (r["create"]["watchedCpuSeconds"].get("apiserver", 0)
                       + r["delete"]["watchedCpuSeconds"].get("apiserver", 0)) / r["n"], " ms", True),
    ("etcd CPU, create + delete", lambda r: r["create"]["watchedCpuSeconds"].get("etcd", 0)
     + r["delete"]["watchedCpuSeconds"].get("etcd", 0), " s", True),
    ("operator CPU, create", lambda r: r["create"]["cpuSeconds"], " s", False),
    ("operator CPU, delete", lambda r: r["delete"]["cpuSeconds"], " s", False),
    ("testcloud CPU, create + delete", lambda r: r["create"]["watchedCpuSeconds"].get("testcloud", 0)
     + r["delete"]["watchedCpuSeconds"].get("testcloud", 0), " s", False),
    ("writes answered 409, per VM", lambda r: (r["create"]["conflicts"] + r["delete"]["conflicts"]) / r["n"], "", True),
    ("writes during idle", lambda r: r["idle"]["writesTotal"], "", False),
    ("operator RSS after idle", lambda r: r["idle"]["endRssMiB"], " MiB", False),
    ("driver: all creates posted", lambda r: r["postSeconds"], " s", True),
    ("CPU ms per VM, create + delete: kube-apiserver + etcd + operator + testcloud", total_cpu, " ms", True),
    ("host CPU steal, create + delete", lambda r: r["create"].get("stealSeconds", 0)
     + r["delete"].get("stealSeconds", 0), " s", True),
]


# Rows only some impls have; "cloud": also any impl whose runs used the testcloud (the driver's -cloud).
ONLY = {"testcloud CPU, create + delete": {"vmop", "base", "vmop-nolist", "cloud"}}


def only(name, impl, runs):
    if name not in ONLY:
        return True
    return impl in ONLY[name] or ("cloud" in ONLY[name] and all("cloud" in r["create"] for r in runs))


def fmt(v):
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def span(vals, unit=""):
    lo, hi = min(vals), max(vals)
    return (fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}") + unit


def mean(vals):
    return sum(vals) / len(vals)


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "–"


def table(groups, n, impls, rows):
    have = [i for i in IMPLS if i in impls]
    pairs = [(a, b) for a, b in (("vmop", "peer"), ("vmop", "peer-same"), ("vmop", "base"), ("vmop", "vmop-nolist"),
                                 ("vmop-nolist", "peer"), ("vmop", "floor"), ("peer", "floor"))
             if a in have and b in have]
    lines = ["| | " + " | ".join(f"{i} N={n}" for i in have) + "".join(f" | {a}/{b}" for a, b in pairs) + " |",
             "|---" * (1 + len(have) + len(pairs)) + "|"]
    for name, f, unit, floor_has in rows:
        cells, means = [], {}
        for i in have:
            rs = groups[(i, n)]
            if (i == "floor" and not floor_has) or not only(name, i, rs):
                cells.append("–")
                means[i] = None
            elif f is None:  # writes: create + delete
                c, d = [w("create")(r) for r in rs], [w("delete")(r) for r in rs]
                cells.append(f"{span(c)} + {span(d)}")
                means[i] = mean(c) + mean(d)
            else:
                vals = [f(r) for r in rs]
                cells.append(span(vals, unit))
                means[i] = mean(vals)
        lines.append(f"| {name} | " + " | ".join(cells)
                     + "".join(f" | {ratio(means[a], means[b])}" for a, b in pairs) + " |")
    return lines


SHARD_ROWS = [
    ("create → all Ready", lambda r: r["create"]["seconds"], " s"),
    ("delete → all gone", lambda r: r["delete"]["seconds"], " s"),
    ("create + delete", lambda r: r["create"]["seconds"] + r["delete"]["seconds"], " s"),
    ("kube-apiserver CPU, create + delete", lambda r: r["create"]["watchedCpuSeconds"].get("apiserver", 0)
     + r["delete"]["watchedCpuSeconds"].get("apiserver", 0), " s"),
    ("operator CPU (all replicas), create + delete",
     lambda r: r["create"]["cpuSeconds"] + r["delete"]["cpuSeconds"], " s"),
    ("operator peak RSS (sum over replicas), create", lambda r: r["create"]["peakRssMiB"], " MiB"),
    ("operator writes per VM, create + delete",
     lambda r: (r["create"]["operatorWrites"] + r["delete"]["operatorWrites"]) / r["n"], ""),
]


def shards_table(groups, n, replicas, prefix):
    """PREFIX-x1 against PREFIX-xK: the times and the speed-up (x1 / xK, of the means)."""
    ks = sorted(replicas, key=lambda i: int(i[len(prefix):]))
    base = ks[0]
    lines = ["| | " + " | ".join(f"{k[:len(prefix) - 2]}, {k[len(prefix):]} replica(s) N={n}" for k in ks)
             + "".join(f" | speed-up {base[len(prefix):]}→{k[len(prefix):]}" for k in ks[1:]) + " |",
             "|---" * (1 + 2 * len(ks) - 1) + "|"]
    for name, f, unit in SHARD_ROWS:
        vals = {k: [f(r) for r in groups[(k, n)]] for k in ks}
        lines.append(f"| {name} | " + " | ".join(span(vals[k], unit) for k in ks)
                     + "".join(f" | {ratio(mean(vals[base]), mean(vals[k]))}" for k in ks[1:]) + " |")
    return lines


def bucket_seconds(bucket, n):
    """Seconds a full token bucket needs to grant n tokens: 0 within its burst."""
    return max(0, n - bucket["burst"]) / bucket["perSecond"]


def floors(limits, n):
    """The bucket-limited floors of N creates and N deletes, in seconds: what EC2's buckets
    alone allow, full at the phase start (the driver refills them), one mutating request and
    one resource token per machine, no latency; the slowest bucket decides."""
    ec2 = (limits or {}).get("ec2")
    if not ec2:
        return None
    return {
        "create": max(bucket_seconds(ec2["mutate"], n), bucket_seconds(ec2["run"], n)),
        "delete": max(bucket_seconds(ec2["mutate"], n), bucket_seconds(ec2["terminate"], n)),
    }


def cloud(phase, *keys):
    return sum(phase.get("cloud", {}).get(k, 0) for k in keys)


def per_vm_hour(r):
    """The cloud calls of the idle window per VM per hour."""
    seconds = r["idle"]["seconds"]
    return cloud(r["idle"], "reads", "mutates") / r["n"] * 3600 / seconds if seconds else 0.0


def cloud_table(groups, n, impls, limits):
    """The cloud's figures per impl: times against the bucket-limited floor, calls and 429s."""
    have = [i for i in IMPLS if i in impls and all("cloud" in r["create"] for r in groups[(i, n)])]
    if not have:
        return []
    floor = floors(limits, n)
    rows = []

    def ratio_to(phase):
        if not floor or not floor[phase]:
            return None
        return lambda r: r[phase]["seconds"] / floor[phase]

    rows.append(("create → all Ready", lambda r: r["create"]["seconds"], " s"))
    rows.append(("… / bucket-limited floor", ratio_to("create"), "×"))
    rows.append(("delete → all gone", lambda r: r["delete"]["seconds"], " s"))
    rows.append(("… / bucket-limited floor", ratio_to("delete"), "×"))
    for phase in ("create", "delete"):
        rows.append((f"cloud calls per VM, {phase}: all",
                     lambda r, p=phase: cloud(r[p], "reads", "mutates") / r["n"], ""))
        rows.append((f"cloud calls per VM, {phase}: reads + mutations",
                     (lambda r, p=phase: cloud(r[p], "reads") / r["n"],
                      lambda r, p=phase: cloud(r[p], "mutates") / r["n"]), ""))
        rows.append((f"throttled answers (429), {phase}",
                     lambda r, p=phase: cloud(r[p], "throttledReads", "throttledMutates"), ""))
    rows.append(("throttled answers (429), idle", lambda r: cloud(r["idle"], "throttledReads", "throttledMutates"), ""))
    rows.append(("steady-state cloud calls per VM-hour (idle window)", per_vm_hour, ""))
    pairs = [(a, b) for a, b in (("vmop", "vmop-nolist"), ("vmop", "peer"), ("vmop-nolist", "peer"))
             if a in have and b in have]
    lines = ["| | " + " | ".join(f"{i} N={n}" for i in have) + "".join(f" | {a}/{b}" for a, b in pairs) + " |",
             "|---" * (1 + len(have) + len(pairs)) + "|"]
    for name, f, unit in rows:
        if f is None:
            lines.append(f"| {name} | " + " | ".join("–" for _ in have) + "".join(" | –" for _ in pairs) + " |")
            continue
        cells, means = [], {}
        for i in have:
            rs = groups[(i, n)]
            if isinstance(f, tuple):
                a, b = [f[0](r) for r in rs], [f[1](r) for r in rs]
                cells.append(f"{span(a)} + {span(b)}")
                means[i] = mean(a) + mean(b)
            else:
                vals = [f(r) for r in rs]
                cells.append(span(vals, unit))
                means[i] = mean(vals)
        lines.append(f"| {name} | " + " | ".join(cells)
                     + "".join(f" | {ratio(means[a], means[b])}" for a, b in pairs) + " |")
    out = [f"The cloud (EC2-like testcloud; counters of its GET /v1/stats over each phase; calls include "
           f"those answered 429):", ""]
    if floor:
        ec2 = limits["ec2"]
        desc = ", ".join(f"{k} {b['burst']} + {b['perSecond']:g}/s" for k, b in ec2.items())
        out.append(f"Bucket-limited floor at N={n} (buckets: {desc}; full at each phase's start; one mutating "
                   f"request and one RunInstances or TerminateInstances token per VM): create "
                   f"{fmt(floor['create'])} s, delete {fmt(floor['delete'])} s"
                   + ("" if floor["create"] and floor["delete"] else " (0: within the bursts, no ratio)")
                   + f"; latency {limits.get('latencyMinMs', 0):g}–{limits.get('latencyMaxMs', 0):g} ms per call.")
        out.append("")
    idles = sorted({r["idle"]["seconds"] for i in have for r in groups[(i, n)]})
    if idles:
        out.append(f"Idle window: {fmt(idles[0])}–{fmt(idles[-1])} s (calls per VM-hour read well only over a "
                   f"window of several of vmop's resync periods).")
        out.append("")
    return out + lines


def requests(phase_result):
    """Writes and reads by "VERB resource" (reads: absent from runs before the driver kept them)."""
    return {**phase_result["writes"], **phase_result.get("reads", {})}


def requests_table(groups, n, impls):
    have = [i for i in IMPLS if i in impls]
    lines = [f"Requests per VM by verb and resource, writes and reads (GET, LIST, and WATCH that "
             f"ended; mean of the runs; the driver's own writes marked, the driver's informer "
             f"is in every column):", "",
             "| phase | request | " + " | ".join(have) + " |", "|---" * (2 + len(have)) + "|"]
    for phase in ("create", "delete", "idle"):
        keys = sorted({k for i in have for r in groups[(i, n)] for k in requests(r[phase])})
        for k in keys:
            vals = [mean([requests(r[phase]).get(k, 0) for r in groups[(i, n)]]) / n for i in have]
            if phase == "idle":
                cells = [f"{v * n:.1f} total" for v in vals]
            else:
                cells = [f"{v:.3f}" for v in vals]
            mark = " (driver)" if k in DRIVER_WRITES else ""
            lines.append(f"| {phase} | `{k}`{mark} | " + " | ".join(cells) + " |")
    return lines


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    limits = None
    if len(sys.argv) > 4 and os.path.exists(sys.argv[4]) and os.path.getsize(sys.argv[4]):
        limits = json.load(open(sys.argv[4]))
    meta = open(sys.argv[2]).read().strip() if len(sys.argv) > 2 and os.path.exists(sys.argv[2]) else ""
    loads = []
    if len(sys.argv) > 3 and os.path.exists(sys.argv[3]):
        loads = [line.rstrip("\n").split("\t") for line in open(sys.argv[3]) if line.strip()]
    groups = defaultdict(list)
    for r in runs:
        groups[(r["label"].split()[0], r["n"])].append(r)
    out = ["# vmop scale benchmark", ""]
    if meta:
        out += [f"{line}  " for line in meta.splitlines()] + [""]
    out += ["Cells: the range over the runs; ratios: of the means. Writes: the operator's own "
            "(all but the driver's creates and deletecollection), leases excluded; the floor's are "
            "the driver's one status write per VM.", ""]
    for n in sorted({n for _, n in groups}):
        # vmop-xK: this build; base-xK: VMOP_BASE, to measure a change of the sharded path.
        for prefix in ("vmop-x", "base-x"):
            replicas = [i for i, m in groups if m == n and i.startswith(prefix)]
            if replicas:
                out.append(f"## Replicas, N = {n}  (runs: " + ", ".join(f"{i} ×{len(groups[(i, n)])}" for i in sorted(replicas)) + ")")
                out.append("")
                out += shards_table(groups, n, replicas, prefix)
                out.append("")
        impls = [i for i in IMPLS if (i, n) in groups]
        if not impls:
            continue
        out.append(f"## N = {n}  (runs: " + ", ".join(f"{i} ×{len(groups[(i, n)])}" for i in impls) + ")")
        out.append("")
        out += table(groups, n, impls, MAIN)
        cloud_lines = cloud_table(groups, n, impls, limits)
        if cloud_lines:
            out += [""] + cloud_lines
        out += ["", "More figures:", ""]
        out += table(groups, n, impls, MORE)
        out.append("")
        out += requests_table(groups, n, impls)
        errors = [f"{r['label']}: {r[p]['error']}" for i in impls for r in groups[(i, n)]
                  for p in ("create", "delete") if r[p].get("error")]
        if errors:
            out += ["", "Errors:"] + [f"- {e}" for e in errors]
        out.append("")
    if loads:
        out += ["Load average (1, 5, 15 min) at the start of each run:", ""]
        out += [f"- {label}: {load}" for label, load in loads]
    print("\n".join(out))


if __name__ == "__main__":
    main()
