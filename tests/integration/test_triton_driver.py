"""The Triton driver against a real tritonserver (CPU, from `make setup`) on loopback."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from modelswap_sidecar.triton.config import AGENT_SOCKET_KEY, UID_KEY, parameters_of
from modelswap_sidecar.triton.driver import ModelStatistics
from modelswap_sidecar.triton.errors import ModelConfigInvalid, ModelLoadFailed
from modelswap_sidecar.triton.process import shm_regions
from modelswap_sidecar.triton.stubs import TritonVoucher, descendant_stub_pids
from tests.support.triton_server import (
    RunningTriton,
    copy_model,
    new_uid,
    parameters_for,
    running_triton,
)
from tests.support.waiting import until_async, wait_for


async def statistics_counting(triton: RunningTriton, uid: str, count: int) -> ModelStatistics:
    """`uid`'s statistics once they count `count` inferences (within 10 s)."""

    async def counted() -> ModelStatistics | None:
        stats = await triton.driver.statistics(uid)
        return stats if stats.inference_count >= count else None

    return await until_async(counted, f"{uid}'s statistics to count {count} inferences", 10.0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.asyncio
async def test_load_infer_statistics_vouch_unload(tmp_path: Path) -> None:
    uid = new_uid()
    socket_path = tmp_path / "agent.sock"
    async with running_triton(tmp_path) as triton:
        driver = triton.driver
        name = await driver.load(uid, copy_model(tmp_path), parameters_for(uid, socket_path))
        assert name == "m-" + uid.replace("-", "")
        assert await driver.model_ready(uid)

        # What anyone can read back: the UID-derived name and modelswap's parameters, merged
        # with the model's own.
        config = await driver.model_config(uid)
        assert config["name"] == name
        parameters = parameters_of(config)
        assert parameters[UID_KEY] == uid
        assert parameters[AGENT_SOCKET_KEY] == str(socket_path)
        assert parameters["greeting"] == "hello"

        before = await driver.statistics(uid)
        assert before.inference_count == 0 and before.last_inference_seconds is None

        started = time.time()
        doubled, answered_uid, stub_pid = await triton.echo(uid, [1.0, 2.5])
        assert doubled == [2.0, 5.0]
        assert answered_uid == uid

        # Triton counts an inference once `execute` returns, which may be just after the
        # response reached us.
        after = await statistics_counting(triton, uid, 1)
        assert after.inference_count == 1 and after.success_count == 1
        assert after.last_inference_seconds is not None
        assert started - 1.0 <= after.last_inference_seconds <= time.time() + 1.0
        assert (await driver.all_statistics())[uid] == after

        # The stub that answered is the one /proc vouches for, and only for its own model.
        assert descendant_stub_pids(triton.process.pid, name) == [stub_pid]
        voucher = TritonVoucher(lambda: triton.process.pid)
        assert voucher.vouch(stub_pid, name)
        assert not voucher.vouch(stub_pid, "m-" + new_uid().replace("-", ""))
        assert not voucher.vouch(os.getpid(), name)
        assert not TritonVoucher(lambda: None).vouch(stub_pid, name)

        await driver.unload(uid)
        assert not await driver.model_ready(uid)
        assert not triton.driver.repository.names()
        wait_for(lambda: not _alive(stub_pid), 10.0, "the unloaded model's stub to exit")
        assert descendant_stub_pids(triton.process.pid, name) == []
        await driver.unload(uid)  # idempotent


@pytest.mark.slow
@pytest.mark.asyncio
async def test_two_models_with_the_same_name_from_two_namespaces_serve_side_by_side(
    tmp_path: Path,
) -> None:
    # Both sources are the same `echo` model (config name "echo"), as two namespaces' `llama`.
    first, second = new_uid(), new_uid()
    async with running_triton(tmp_path) as triton:
        for uid in (first, second):
            params = parameters_for(uid, tmp_path / "agent.sock")
            await triton.driver.load(uid, copy_model(tmp_path), params)
        _, uid_a, pid_a = await triton.echo(first, [1.0])
        _, uid_b, pid_b = await triton.echo(second, [1.0])
        assert (uid_a, uid_b) == (first, second)
        assert pid_a != pid_b
        voucher = TritonVoucher(lambda: triton.process.pid)
        assert voucher.vouch(pid_a, triton.driver.name_of(first))
        assert not voucher.vouch(pid_a, triton.driver.name_of(second))
        _, _, _ = await triton.echo(second, [2.0])
        assert (await statistics_counting(triton, first, 1)).inference_count == 1
        assert (await statistics_counting(triton, second, 2)).inference_count == 2


@pytest.mark.asyncio
async def test_load_failures_name_the_cause(tmp_path: Path) -> None:
    uid = new_uid()
    async with running_triton(tmp_path) as triton:
        params = parameters_for(uid, tmp_path / "agent.sock")
        with pytest.raises(ModelLoadFailed, match="weights are missing on purpose"):
            await triton.driver.load(uid, copy_model(tmp_path, "broken"), params)
        assert not await triton.driver.model_ready(uid)
        assert triton.driver.repository.names() == []

        no_config = copy_model(tmp_path)
        (no_config / "config.pbtxt").unlink()
        with pytest.raises(ModelConfigInvalid, match=r"no config\.pbtxt"):
            await triton.driver.load(uid, no_config, params)


@pytest.mark.asyncio
async def test_kill_9_of_triton_leaves_no_stub_and_no_shm_region(tmp_path: Path) -> None:
    uid = new_uid()
    async with running_triton(tmp_path) as triton:
        await triton.driver.load(uid, copy_model(tmp_path), parameters_for(uid, tmp_path / "s"))
        _, _, stub_pid = await triton.echo(uid, [1.0])
        assert shm_regions(triton.process.shm_prefix), "a loaded python model has a region"

        os.kill(triton.process.pid, signal.SIGKILL)  # Triton alone, as a crash would
        assert await triton.process.wait(10.0) == -signal.SIGKILL
        assert shm_regions(triton.process.shm_prefix), "a crash leaves the regions behind"

        await triton.process.kill()  # what the supervisor does after a Triton death
        assert shm_regions(triton.process.shm_prefix) == []
        wait_for(lambda: not _alive(stub_pid), 10.0, "the orphaned stub to die")
