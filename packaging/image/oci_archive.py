"""Wrap a root file system tarball into a one-layer OCI image archive (stdlib only).

    python3 oci_archive.py ROOTFS.tar OUT.tar --tag pg-exporter:VERSION --created EPOCH

The image configuration (user, entrypoint, environment, port) is written here, once;
``scripts/image`` calls this after mmdebstrap has made the root file system.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

UID = 9630  # the image's prometheus user and group, fixed so runAsNonRoot can check it
CONFIG = {
    "User": f"{UID}:{UID}",
    "Entrypoint": ["/usr/bin/pg_exporter"],
    "Cmd": [],
    "Env": [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PG_EXPORTER_CONFIG=/etc/pg_exporter",
    ],
    "ExposedPorts": {"9630/tcp": {}},
    "WorkingDir": "/",
    "StopSignal": "SIGTERM",
}


def _blob(layout: Path, data: bytes, media_type: str) -> dict[str, object]:
    """Store ``data`` under blobs/sha256 and return its descriptor."""
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _layer(rootfs: Path, layout: Path) -> tuple[dict[str, object], str]:
    """The gzip-compressed layer's descriptor and the uncompressed diff id."""
    raw = hashlib.sha256()
    packed = io.BytesIO()
    with rootfs.open("rb") as src, gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as gz:
        while chunk := src.read(1 << 20):
            raw.update(chunk)
            gz.write(chunk)
    media = "application/vnd.oci.image.layer.v1.tar+gzip"
    return _blob(layout, packed.getvalue(), media), f"sha256:{raw.hexdigest()}"


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(rootfs: Path, out: Path, tag: str, created: int) -> None:
    """Write the OCI archive ``out`` holding ``rootfs`` as its only layer."""
    layout = out.with_suffix(".layout")
    shutil.rmtree(layout, ignore_errors=True)
    (layout / "blobs" / "sha256").mkdir(parents=True)
    layer, diff_id = _layer(rootfs, layout)
    stamp = datetime.datetime.fromtimestamp(created, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": stamp,
        "config": CONFIG,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": stamp, "created_by": "scripts/image (mmdebstrap)"}],
    }
    config_desc = _blob(layout, _json(config), "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer],
    }
    manifest_desc = _blob(layout, _json(manifest), "application/vnd.oci.image.manifest.v1+json")
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (layout / "index.json").write_bytes(_json({"schemaVersion": 2, "manifests": [manifest_desc]}))
    (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            info = tar.gettarinfo(path, str(path.relative_to(layout)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = created, 0, 0, "", ""
            with path.open("rb") if path.is_file() else io.BytesIO() as data:
                tar.addfile(info, data if path.is_file() else None)
    shutil.rmtree(layout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rootfs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--created", type=int, required=True)
    args = parser.parse_args()
    build(args.rootfs, args.out, args.tag, args.created)


if __name__ == "__main__":
    main()
