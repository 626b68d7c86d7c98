"""Local mode's dev loop, the agent's side: the dev voucher vouches only for a process of the
agent's own uid, outside Triton, as a model the dev-models file names; the file's failures
vouch for nobody; the `dev` settings section exists in local mode only (a cluster node
refuses it, by name, through `modelswap sidecar` too); `modelswap up --dev` writes it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_sidecar.agent.assembly import voucher_of
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.engine.vouching import (
    MAX_DEV_MODELS_FILE_BYTES,
    AnyVoucher,
    DevModels,
    DevVoucher,
    RegisteredVoucher,
    process_uids,
)
from modelswap_sidecar.local.rundir import RunDir
from modelswap_sidecar.local.settings import LocalSettings, agent_document
from tests.support.agent_documents import settings_document

DEV = "m-0b6f3c1e5a4d4e0f9c2b7d8e9f0a1b2c"
TRITON_MODEL = "m-ffffffffffffffffffffffffffffffff"
ME = 1000


def fake_proc(tmp_path: Path, uids: dict[int, tuple[int, int]]) -> Path:
    """A /proc whose pid → (real uid, effective uid) status lines are `uids`."""
    proc = tmp_path / "proc"
    for pid, (real, effective) in uids.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(
            f"Name:\tpython3\nPid:\t{pid}\nUid:\t{real}\t{effective}\t{effective}\t{effective}\n"
        )
    return proc


def models_file(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "dev-models.json"
    path.write_text(json.dumps({"models": names}))
    return path


def test_the_dev_voucher_vouches_for_a_process_of_the_agents_uid_outside_triton_as_a_dev_model(
    tmp_path: Path,
) -> None:
    proc = fake_proc(tmp_path, {10: (ME, ME), 11: (0, 0), 12: (ME, 0), 13: (ME, ME)})
    dev_models = DevModels(models_file(tmp_path, [DEV]))
    voucher = DevVoucher(dev_models.names, uid=ME, excluded=lambda pid: pid == 13, proc=proc)
    assert voucher.vouch(10, DEV)
    assert not voucher.vouch(10, TRITON_MODEL)  # not a dev model
    assert not voucher.vouch(11, DEV)  # another uid (root is no exception)
    assert not voucher.vouch(12, DEV)  # a set-uid process: effective uid differs
    assert not voucher.vouch(13, DEV)  # a Triton process (the assembly excludes them)
    assert not voucher.vouch(99, DEV)  # gone


def test_the_dev_models_file_is_read_at_each_call_and_its_failures_name_no_model(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dev-models.json"
    models = DevModels(path)
    assert models.names() == frozenset()  # missing: nobody
    path.write_text(json.dumps({"models": [DEV]}))
    assert models.names() == {DEV}
    path.write_text(json.dumps({"models": []}))  # an edit of the folder takes effect at once
    assert models.names() == frozenset()
    for bad in ("{", '{"models": "m-x"}', '{"models": [1]}', "[]", '{"other": []}'):
        path.write_text(bad)
        assert models.names() == frozenset(), bad
    path.write_text(json.dumps({"models": [DEV], "pad": "x" * MAX_DEV_MODELS_FILE_BYTES}))
    assert models.names() == frozenset()  # oversized: not read into the agent


def test_any_voucher_asks_each_in_turn() -> None:
    first, second = RegisteredVoucher(), RegisteredVoucher()
    second.register(7, DEV)
    both = AnyVoucher([first, second])
    assert both.vouch(7, DEV)
    assert not both.vouch(7, TRITON_MODEL)
    assert not AnyVoucher([]).vouch(7, DEV)


def test_process_uids_reads_the_real_and_effective_uid_of_this_process() -> None:
    assert process_uids(os.getpid()) == (os.getuid(), os.geteuid())


def test_the_assembly_adds_the_dev_voucher_only_with_a_dev_models_file(tmp_path: Path) -> None:
    no_triton: list[int | None] = [None]
    triton_only = voucher_of(lambda: no_triton[0], None)
    assert not triton_only.vouch(os.getpid(), DEV)
    dev = voucher_of(lambda: no_triton[0], DevModels(models_file(tmp_path, [DEV])))
    assert dev.vouch(os.getpid(), DEV)  # this test process: the agent's uid, no Triton
    assert not dev.vouch(os.getpid(), TRITON_MODEL)
    no_triton[0] = os.getppid()  # this process as a descendant of "Triton": excluded
    assert not dev.vouch(os.getpid(), DEV)


def test_the_dev_section_is_taken_in_local_mode_and_refused_by_name_otherwise(
    tmp_path: Path,
) -> None:
    dev = {"modelsFile": str(tmp_path / "dev-models.json")}
    local = settings_from_document(settings_document(tmp_path, localMode=True, dev=dev))
    assert local.dev_models_file == tmp_path / "dev-models.json"
    assert (
        settings_from_document(settings_document(tmp_path, localMode=True)).dev_models_file is None
    )
    with pytest.raises(SettingsError, match=r"^dev: .*local mode only"):
        settings_from_document(settings_document(tmp_path, dev=dev))  # a cluster node
    with pytest.raises(SettingsError, match=r"^dev: .*local mode only"):
        settings_from_document(
            settings_document(tmp_path, dev=dev, kube={"inCluster": True})
        )  # under the operator
    with pytest.raises(SettingsError, match=r"^dev\.modelsFile is required"):
        settings_from_document(settings_document(tmp_path, localMode=True, dev={}))
    with pytest.raises(SettingsError, match=r"^dev: expected a mapping"):
        settings_from_document(settings_document(tmp_path, localMode=True, dev=True))


def test_modelswap_sidecar_refuses_a_cluster_config_with_the_dev_section(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    doc = settings_document(
        tmp_path, dev={"modelsFile": str(tmp_path / "d.json")}, kube={"inCluster": True}
    )
    config.write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [sys.executable, "-m", "modelswap_api.cli", "sidecar", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "modelswap sidecar: dev: " in done.stderr and "local mode only" in done.stderr
    assert not (tmp_path / "sock").exists()  # refused before anything started


def test_modelswap_up_writes_the_dev_section_only_with_dev(tmp_path: Path) -> None:
    def document(dev: bool) -> dict[str, object]:
        settings = LocalSettings(
            folder=tmp_path,
            run_dir=RunDir(tmp_path / "run"),
            model_root=tmp_path / "models",
            defaults=BUILTIN_DEFAULTS,
            triton_binary=tmp_path / "tritonserver",
            dev=dev,
        )
        return agent_document(
            settings, triton_url="x:1", control_port=1, gateway_port=0, metrics_port=0
        )

    assert "dev" not in document(False)
    with_dev = document(True)
    assert with_dev["dev"] == {"modelsFile": str(tmp_path / "run" / "dev-models.json")}
    assert settings_from_document(with_dev).dev_models_file == tmp_path / "run" / "dev-models.json"


def test_modelswap_up_takes_dev_and_no_reload_flags() -> None:
    from modelswap_sidecar.local import command

    parser = argparse.ArgumentParser()
    command.register_up(parser.add_subparsers())
    plain = parser.parse_args(["up"])
    assert (plain.dev, plain.reload) == (False, True)
    flagged = parser.parse_args(["up", "--dev", "--no-reload"])
    assert (flagged.dev, flagged.reload) == (True, False)
