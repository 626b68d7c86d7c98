"""A GPU backend's host store must be memory-backed: the agent refuses to start otherwise."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from modelswap_sidecar.agent.assembly import check_host_store
from modelswap_sidecar.agent.errors import StartupError
from modelswap_sidecar.engine.hoststore import filesystem_of

MOUNTS = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 8:1 / / rw,relatime - ext4 /dev/vda1 rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684092k
30 27 0:30 / /var/lib/modelswap/host\\040store rw - tmpfs tmpfs rw
31 27 0:31 / /data rw - xfs /dev/vdb rw
"""


def _settings(path: str) -> Any:
    return SimpleNamespace(host_store_dir=Path(path))


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/dev/shm/modelswap/store", "tmpfs"),
        ("/dev/shm", "tmpfs"),
        ("/dev/shmx/store", "ext4"),  # a sibling whose name starts alike is not inside
        ("/var/lib/modelswap/host store/gpu0", "tmpfs"),  # mountinfo escapes spaces
        ("/data/store", "xfs"),
        ("/tmp/store", "ext4"),
    ],
)
def test_the_filesystem_is_the_longest_mount_point_above_the_path(path: str, kind: str) -> None:
    assert filesystem_of(Path(path), MOUNTS) == kind


def test_a_gpu_backend_refuses_a_disk_backed_store_naming_the_setting() -> None:
    with pytest.raises(StartupError, match=r"hostStore.dir /data/store is on a xfs filesystem"):
        check_host_store(_settings("/data/store"), "cuda-vmm", MOUNTS)


def test_memory_backed_stores_and_the_sim_backend_pass() -> None:
    check_host_store(_settings("/dev/shm/store"), "cuda-vmm", MOUNTS)
    check_host_store(_settings("/data/store"), "sim", MOUNTS)  # the sim pins nothing
    check_host_store(_settings("/data/store"), "cuda-vmm", "")  # unknown: not refused
