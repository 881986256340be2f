#!/usr/bin/env python3
"""kube-apiserver CPU per VirtualMachine lifecycle, by object shape and write verb.

Run through `bench/write_cost.sh` (it starts the control plane). No operator runs: this
script makes the writes an operator makes, with `--workers` connections, so that the API
server's cost of a shape (what vmop stores, what the peer stores) and of a verb (the merge
patch vmop adds its finalizer with, the PUT the peer uses) is measured apart from any
operator's own CPU. Per VM: the driver's POST, the finalizer write, one status PUT, DELETE,
and the PUT that removes the finalizer; one watch on all VirtualMachines stands in for the
operator's. CPU is read from /proc/PID/stat of kube-apiserver around each phase. The table's
last column is the size of one Ready VM of each shape as the API server answers it (compact
JSON, managed fields included): a count, not a timing, the same on every machine.

The shapes are copies of a Ready VM as vmop (testcloud plugin) and the peer wrote them in
`bench/run.sh` on 2026-12-02: when either changes what it writes, update them here.
"""
import argparse
import http.client
import json
import os
import queue
import ssl
import statistics
import sys
import threading

LOCATION = "testcloud:http://127.0.0.1:40617"
STAMP = "2026-12-02T11:48:30Z"
READY = {"lastTransitionTime": STAMP, "message": "the external machine is running",
         "observedGeneration": 1, "reason": "Running", "status": "True", "type": "Ready"}
SYNCED = {"lastTransitionTime": STAMP, "message": "", "observedGeneration": 1,
          "reason": "ReconcileSucceeded", "status": "True", "type": "Synced"}


def vmop_status(_uid):
    return {"addresses": ["10.0.0.30"], "applied": {"cpu": 1, "memoryMiB": 512},
            "conditions": [READY, SYNCED], "id": "tc-0000001e", "location": LOCATION,
            "observedGeneration": 1, "phase": "Running"}


def peer_status(uid):
    return {"conditions": [READY], "id": "vm-" + uid, "observedGeneration": 1, "phase": "Running"}


def without(status_of, *fields):
    """status_of with the status fields named dropped ("Synced": that condition)."""
    def status(uid):
        out = {k: v for k, v in status_of(uid).items() if k not in fields}
        out["conditions"] = [c for c in out["conditions"] if c["type"] not in fields]
        return out
    return status


# shape: (status, annotations written with the finalizer). `vmop-nosynced` and `vmop-lean` (no
# `Synced`, no create annotations) are candidates, not what vmop writes today.
CREATE = {"vmop.dev/create-location": LOCATION, "vmop.dev/create-parameters": "{}"}
SHAPES = {
    "vmop": (vmop_status, CREATE),
    "peer": (peer_status, {}),
    "vmop-nosynced": (without(vmop_status, "Synced"), CREATE),
    "vmop-lean": (without(vmop_status, "Synced"), {}),
}
# With vmop-nosynced: one shape per thing vmop stores beyond the peer, each dropped alone.
SHAPES.update({f"vmop-no-{f.lower()}": (without(vmop_status, f), CREATE)
               for f in ("addresses", "applied", "location")})
SHAPES["vmop-no-annotation"] = (vmop_status, {})
VERBS = ("patch", "put")
# fieldValidation on the operator's writes: "default" sends none (the server's default, Warn:
# unknown and duplicate fields are looked for and reported as warnings), "Ignore" skips that.
VALIDATIONS = ("default", "Ignore")
PHASES = ("post", "finalizer", "status", "delete", "release")


class Cluster:
    def __init__(self, cp):
        config = open(f"{cp}/admin.kubeconfig").read()
        server = config.split('server: "')[1].split('"')[0]
        self.host, port = server.removeprefix("https://").split(":")
        self.port = int(port)
        self.tls = ssl.create_default_context(cafile=f"{cp}/pki/ca.crt")
        self.tls.load_cert_chain(f"{cp}/pki/admin.crt", f"{cp}/pki/admin.key")
        self.apiserver = int(open(f"{cp}/apiserver.pid").read())
        self.local = threading.local()

    def connect(self):
        return http.client.HTTPSConnection(self.host, self.port, context=self.tls)

    def request(self, method, path, body=None, ctype="application/json"):
        if getattr(self.local, "conn", None) is None:
            self.local.conn = self.connect()
        data = None if body is None else json.dumps(body).encode()
        self.local.conn.request(method, path, body=data,
                                headers={"Content-Type": ctype, "Accept": "application/json"})
        response = self.local.conn.getresponse()
        out = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {out[:300]!r}")
        return json.loads(out) if out else None

    def cpu_seconds(self):
        fields = open(f"/proc/{self.apiserver}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def watch_all(self):
        conn = self.connect()
        conn.request("GET", "/apis/vmop.dev/v1alpha1/virtualmachines?watch=1&allowWatchBookmarks=true")
        response = conn.getresponse()
        while response.read(65536):
            pass


def phase(cluster, work, n, workers):
    """Runs work(i) for i in 0..n on `workers` threads; returns the results and apiserver CPU s."""
    todo = queue.SimpleQueue()
    for i in range(n):
        todo.put(i)
    results, errors = {}, []

    def worker():
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = work(i)
            except Exception as e:  # noqa: BLE001 - reported below, the run fails
                errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    before = cluster.cpu_seconds()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
    return results, cluster.cpu_seconds() - before


def lifecycle(cluster, ns, variant, n, workers):
    """Apiserver CPU ms per VM for each phase of n VMs in namespace ns, and the bytes of one
    Ready VM as the API server answers it (managed fields included, compact JSON)."""
    shape, verb, validation = variant
    status_of, annotations = SHAPES[shape]
    base = f"/apis/vmop.dev/v1alpha1/namespaces/{ns}/virtualmachines"
    query = "" if validation == "default" else f"?fieldValidation={validation}"
    cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    spent = {}

    def put(path, vm):
        # As vmop and the peer do: the server keeps the managed fields of a PUT that has none.
        vm["metadata"].pop("managedFields", None)
        return cluster.request("PUT", path + query, vm)

    def post(i):
        return cluster.request("POST", base, {
            "apiVersion": "vmop.dev/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": f"vm-{i}"},
            "spec": {"providerConfigRef": {"name": "bench"}, "image": "ami-12c6146b", "cpu": 1,
                     "memory": "512Mi", "deletionPolicy": "Delete"}})

    def add_finalizer(i):
        vm = vms[i]
        if verb == "patch":
            metadata = {"finalizers": ["vmop.dev/cleanup"], "resourceVersion": vm["metadata"]["resourceVersion"]}
            if annotations:
                metadata["annotations"] = annotations
            return cluster.request("PATCH", f"{base}/vm-{i}{query}", {"metadata": metadata},
                                   "application/merge-patch+json")
        vm["metadata"]["finalizers"] = ["vmop.dev/cleanup"]
        if annotations:
            vm["metadata"].setdefault("annotations", {}).update(annotations)
        return put(f"{base}/vm-{i}", vm)

    def write_status(i):
        vm = vms[i]
        vm["status"] = status_of(vm["metadata"]["uid"])
        return put(f"{base}/vm-{i}/status", vm)

    def delete(i):
        return cluster.request("DELETE", f"{base}/vm-{i}")

    def release(i):
        vm = vms[i]
        vm["metadata"]["finalizers"] = None
        return put(f"{base}/vm-{i}", vm)

    # Each phase works on the objects the previous one's answers returned.
    vms, size = None, 0
    for name, work in zip(PHASES, (post, add_finalizer, write_status, delete, release)):
        vms, cpu = phase(cluster, work, n, workers)
        spent[name] = cpu / n * 1000
        if name == "status":
            size = len(json.dumps(vms[0], separators=(",", ":")))
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
    return spent, size


def name(variant):
    return ", ".join(variant)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("controlplane", help="directory bench/controlplane.sh wrote")
    parser.add_argument("--n", type=int, default=1000, help="VMs per run (1000)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of every variant (4)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent connections (4)")
    parser.add_argument("--shapes", default="vmop peer", help=f"of {' '.join(SHAPES)} ('vmop peer')")
    parser.add_argument("--verbs", default="patch put", help="finalizer verbs, patch and/or put ('patch put')")
    parser.add_argument("--validations", default="default",
                        help=f"fieldValidation of the operator's writes, of {' '.join(VALIDATIONS)} ('default')")
    args = parser.parse_args()
    cluster = Cluster(args.controlplane)
    threading.Thread(target=cluster.watch_all, daemon=True).start()
    shapes, verbs, validations = args.shapes.split(), args.verbs.split(), args.validations.split()
    unknown = ([x for x in shapes if x not in SHAPES] + [x for x in verbs if x not in VERBS]
               + [x for x in validations if x not in VALIDATIONS])
    if unknown or "peer" not in shapes or "default" not in validations:
        parser.error(f"unknown shapes, verbs or validations {unknown}; "
                     "the shapes must include peer and the validations default")
    variants = [(s, v, f) for s in shapes for v in verbs for f in validations]
    runs = {variant: [] for variant in variants}
    sizes = {}
    for r in range(args.rounds):
        # As bench/run.sh: the order reverses every other round, so none always runs first.
        for variant in variants if r % 2 == 0 else list(reversed(variants)):
            ns = f"wc-{r}-" + "-".join(variant).lower()
            spent, sizes[variant] = lifecycle(cluster, ns, variant, args.n, args.workers)
            runs[variant].append(spent)
            print(f"round {r + 1}: {name(variant)}: {sum(spent.values()):.2f} ms per VM",
                  file=sys.stderr, flush=True)

    def total(variant):
        return statistics.mean(sum(s.values()) for s in runs[variant])

    print(f"kube-apiserver CPU ms per VM lifecycle, N={args.n}, {args.rounds} rounds (mean; total's range)\n")
    print("| shape, finalizer verb, fieldValidation | " + " | ".join(PHASES)
          + " | total | / peer, same verb, default | bytes |")
    print("|---" * (len(PHASES) + 4) + "|")
    for variant, spent in runs.items():
        totals = [sum(s.values()) for s in spent]
        cells = [f"{statistics.mean(s[p] for s in spent):.2f}" for p in PHASES]
        print(f"| {name(variant)} | " + " | ".join(cells) +
              f" | {total(variant):.2f} ({min(totals):.2f}–{max(totals):.2f}) |"
              f" {total(variant) / total(('peer', variant[1], 'default')):.2f} | {sizes[variant]} |")


if __name__ == "__main__":
    main()
