"""Local mode's host store is memory-backed wherever its run dir is, and goes with the run."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from modelswap_sidecar.engine.hoststore import filesystem_of
from modelswap_sidecar.local import up
from modelswap_sidecar.local.rundir import RunDir


def test_a_run_dir_on_disk_gets_its_store_in_dev_shm_and_loses_it_at_clean(tmp_path: Path) -> None:
    assert filesystem_of(tmp_path) not in {"tmpfs", "ramfs"}, "this test needs /tmp on disk"
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    up._memory_backed_store(run.host_store)
    target = Path(os.path.realpath(run.host_store))
    try:
        assert run.host_store.is_symlink() and target.parent == up.SHM
        assert filesystem_of(run.host_store) == "tmpfs"
        assert target.stat().st_mode & 0o777 == 0o700
        (run.host_store / "gpu0").mkdir()  # the agent writes through the link
        up._remove(run.host_store)
        assert not target.exists() and not run.host_store.exists()
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_a_run_dir_in_memory_keeps_its_store_in_place() -> None:
    root = Path(tempfile.mkdtemp(prefix="modelswap-test-run-", dir=up.SHM))
    try:
        run = RunDir(root)
        up._memory_backed_store(run.host_store)
        assert not run.host_store.exists()  # the agent makes it, in the run dir
        run.host_store.mkdir()
        up._remove(run.host_store)
        assert not run.host_store.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
