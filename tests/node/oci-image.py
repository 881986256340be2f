#!/usr/bin/env python3
"""Writes a one-layer OCI image archive holding one static program, for `ctr images import`.

    oci-image.py --program PATH --name REF --out TAR [--arch amd64] [--user 65535:65535]

The layer holds the program as /<basename>, its entrypoint. The archive is an OCI image layout
(oci-layout, index.json, blobs/sha256/...) whose index entry names the image with both
`io.containerd.image.name` (what containerd imports it as) and `org.opencontainers.image.ref.name`.
Every timestamp and owner is fixed, so the same program gives the same bytes and digests.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile


def tar_bytes(entries):
    """A tar archive of (name, data, mode) entries, owned by root, dated the epoch."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", required=True)
    parser.add_argument("--name", required=True, help="image reference, e.g. vmop.dev/pause:1")
    parser.add_argument("--out", required=True)
    parser.add_argument("--arch", default="amd64")
    parser.add_argument("--user", default="65535:65535")
    args = parser.parse_args()

    program = os.path.basename(args.program)
    with open(args.program, "rb") as f:
        layer_tar = tar_bytes([(program, f.read(), 0o755)])
    # Level 1: these images never leave the machine, and a test may pack a large program.
    layer = gzip.compress(layer_tar, compresslevel=1, mtime=0)
    config = canonical(
        {
            "architecture": args.arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": ["/" + program], "User": args.user},
            "rootfs": {"type": "layers", "diff_ids": [digest(layer_tar)]},
        }
    )
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest(layer),
                    "size": len(layer),
                }
            ],
        }
    )
    tag = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": args.arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": args.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    blobs = [("blobs/sha256/" + digest(b)[7:], b, 0o644) for b in (layer, config, manifest)]
    archive = tar_bytes(
        [("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}), 0o644)]
        + blobs
        + [("index.json", index, 0o644)]
    )
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(archive)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
