#!/usr/bin/env python3
"""Writes OCI image archives without a container engine: the operator image and plugin images.

    oci_image.py operator --binary target/release/vmop --name docker.io/vmop/vmop:dev --out vmop.tar
    oci_image.py plugin --wasm ec2.wasm --name docker.io/vmop/ec2-plugin:0.2.0 --out ec2.tar
    oci_image.py program --program pause --user 65535:65535 --name vmop.dev/node/pause:1 --out p.tar

The operator image is the Dockerfile's final stage rebuilt from the same inputs: the binary at
/usr/local/bin/vmop, the shared libraries it links (what distroless/cc ships: libc, libm,
libgcc_s, the loader, found with ldd on this machine), CA certificates, and a passwd/group naming
the `nonroot` user 65532; user 65532, the same entrypoint and arguments. A plugin image holds one
component at /<file>.wasm and records its sha256 in the label `dev.vmop.plugin.sha256`: mounted as
an image volume, the ProviderConfig points at the file and pins that digest. A program image holds
one static program at /<file>, its entrypoint (the test node's pause image, test tools).

The archive is an OCI image layout in a tar (what `ctr images import` and `skopeo` read),
byte-for-byte reproducible: sorted entries, zero times and owners, gzip without a timestamp.
Prints the image's size (its compressed layers) and, for a plugin, the component's sha256.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
NONROOT = 65532


def entry(name, data=None, mode=0o644, kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.linkname = link
    if data is not None:
        info.size = len(data)
    return info, data


def layer(entries):
    """A gzipped tar of `entries` (with their parent directories); returns (blob, diff_id)."""
    dirs = set()
    for info, _ in entries:
        parts = info.name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            info, _ = entry(d, mode=0o755, kind=tarfile.DIRTYPE)
            tar.addfile(info)
        for info, data in sorted(entries, key=lambda e: e[0].name):
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    tar_bytes = raw.getvalue()
    diff_id = "sha256:" + hashlib.sha256(tar_bytes).hexdigest()
    blob = gzip.compress(tar_bytes, compresslevel=6, mtime=0)
    return blob, diff_id


def linked_libraries(binary):
    """The shared objects `binary` loads, as (path in the image, bytes): ldd's resolved paths."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        line = line.strip()
        path = None
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" ")[0]
            if target.startswith("/"):
                path = target
        elif line.startswith("/"):
            path = line.split(" ")[0]
        if path:
            found.append(path)
    libs = []
    for path in found:
        real = os.path.realpath(path)
        with open(real, "rb") as f:
            libs.append((path.lstrip("/"), f.read()))
    return libs


def operator_layers(binary):
    base = []
    for path, data in linked_libraries(binary):
        base.append(entry(path, data, 0o755))
    passwd = f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
    group = f"root:x:0:\nnonroot:x:{NONROOT}:\n"
    base.append(entry("etc/passwd", passwd.encode()))
    base.append(entry("etc/group", group.encode()))
    certs = "/etc/ssl/certs/ca-certificates.crt"
    if os.path.exists(certs):
        with open(certs, "rb") as f:
            base.append(entry(certs.lstrip("/"), f.read()))
    base.append(entry("tmp", mode=0o1777, kind=tarfile.DIRTYPE))
    with open(binary, "rb") as f:
        app = [entry("usr/local/bin/vmop", f.read(), 0o755)]
    return [layer(base), layer(app)]


def operator_config():
    return {
        "User": f"{NONROOT}:{NONROOT}",
        "Entrypoint": ["/usr/local/bin/vmop"],
        "Cmd": ["run", "--plugin-dir=/plugins", "--cache-dir=/cache", "--log-format=json"],
        "ExposedPorts": {"8080/tcp": {}},
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
        "WorkingDir": "/",
    }


def write(out, name, layers, config, labels, arch="amd64"):
    blobs = {}

    def add(data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    config = dict(config, Labels=labels)
    image_config = {
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff for _, diff in layers]},
        "history": [{"created_by": "scripts/oci_image.py"} for _ in layers],
    }
    config_desc = add(json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode())
    layer_descs = [dict(add(blob), mediaType=MEDIA_LAYER) for blob, _ in layers]
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": dict(config_desc, mediaType=MEDIA_CONFIG),
        "layers": layer_descs,
    }
    manifest_desc = add(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "manifests": [
            dict(
                manifest_desc,
                mediaType=MEDIA_MANIFEST,
                annotations={
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag,
                },
            )
        ],
    }
    files = [
        entry("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        entry("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    for digest, data in blobs.items():
        files.append(entry("blobs/sha256/" + digest.split(":", 1)[1], data))
    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in [entry("blobs", mode=0o755, kind=tarfile.DIRTYPE),
                           entry("blobs/sha256", mode=0o755, kind=tarfile.DIRTYPE)]:
            tar.addfile(info)
        for info, data in sorted(files, key=lambda e: e[0].name):
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return sum(len(blob) for blob, _ in layers)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    op = sub.add_parser("operator", help="the operator image")
    op.add_argument("--binary", required=True)
    plugin = sub.add_parser("plugin", help="a provider plugin image")
    plugin.add_argument("--wasm", required=True)
    program = sub.add_parser("program", help="one static program, its entrypoint")
    program.add_argument("--program", required=True)
    program.add_argument("--user", default="65535:65535")
    program.add_argument("--arch", default="amd64")
    for p in (op, plugin, program):
        p.add_argument("--name", required=True, help="image name, e.g. docker.io/vmop/vmop:dev")
        p.add_argument("--out", required=True, help="the OCI archive to write")
    args = parser.parse_args()

    if args.kind == "program":
        with open(args.program, "rb") as f:
            data = f.read()
        file = os.path.basename(args.program)
        config = {"Entrypoint": ["/" + file], "User": args.user}
        size = write(args.out, args.name, [layer([entry(file, data, 0o755)])], config, {}, args.arch)
        print(f"image {args.name}: {size / 2**20:.1f} MiB compressed ({args.out})", file=sys.stderr)
    elif args.kind == "operator":
        layers = operator_layers(args.binary)
        size = write(args.out, args.name, layers, operator_config(), {})
        print(f"image {args.name}: {size / 2**20:.1f} MiB compressed ({args.out})", file=sys.stderr)
    else:
        with open(args.wasm, "rb") as f:
            wasm = f.read()
        digest = hashlib.sha256(wasm).hexdigest()
        file = os.path.basename(args.wasm)
        layers = [layer([entry(file, wasm)])]
        labels = {"dev.vmop.plugin.sha256": digest, "dev.vmop.plugin.file": file}
        size = write(args.out, args.name, layers, {}, labels)
        print(f"image {args.name}: {size / 2**10:.0f} KiB compressed, /{file} sha256:{digest}", file=sys.stderr)
        print(f"sha256:{digest}")


if __name__ == "__main__":
    main()
