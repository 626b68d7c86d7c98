"""The fake `cuda.bindings` against the real driver's recorded call sequences (issue 31).

- `test_the_fake_replays_the_recorded_gpu_cycle`: each committed recording of one full swap
  cycle on a GPU (tests/data/cuda_recordings/<backend>.json, written by
  `python3 tests/gpu/record_cycles.py --out DIR` on a GPU machine) names no function, enum
  member, handle type or struct field the fake lacks, and the same cycle run on the fake
  (given the recorded device attributes) makes the same calls with the same normalised
  arguments, error codes and outputs. A difference fails with a unified diff.
- the recorder (tests/support/cuda_recorder.py) behind cuda_compat's `MODELSWAP_CUDA_WRAP`
  seam, and the comparator (tests/support/cuda_replay.py) on synthetic sequences: each kind
  of drift fails, readably.
- the fake's own recording of the cycles is deterministic and covers every step the
  cycles' doc names.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelswap_client import cuda_compat as cc
from tests.gpu import record_cycles
from tests.support import cuda_recorder
from tests.support.cuda_recorder import RECORD_ENV, ROLE_ENV, WRAP_SPEC, Recorder, read_jsonl
from tests.support.cuda_replay import (
    apply_facts,
    compare,
    facts_of,
    fake_gaps,
    lines,
    load_recording,
)
from tests.support.fake_cuda import types as T  # noqa: N812 - as the fake calls it
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.world import MIB, FakeCuda

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "tests" / "data" / "cuda_recordings"
BACKENDS = record_cycles.BACKENDS


@pytest.fixture
def recording_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The recorder wrapped in through cuda_compat, writing under tmp_path, role "agent"."""
    prefix = tmp_path / "rec"
    monkeypatch.setenv(cc.WRAP_ENV, WRAP_SPEC)
    monkeypatch.setenv(RECORD_ENV, str(prefix))
    monkeypatch.setenv(ROLE_ENV, "agent")
    cuda_recorder.reset()
    yield prefix
    cuda_recorder.reset()


# --- the replay of real recordings --------------------------------------------------------


@pytest.fixture(scope="module")
def fake_recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each backend's cycle recorded once on the fake (given the committed recording's device
    facts when there is one), by the same script a GPU machine runs."""
    out = tmp_path_factory.mktemp("fake-recordings")
    made = {}
    for backend in BACKENDS:
        committed = RECORDINGS / f"{backend}.json"
        facts = str(committed) if committed.exists() else None
        made[backend] = record_cycles.record(backend, out, fake=True, facts_file=facts)
    return made


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fake_replays_the_recorded_gpu_cycle(
    backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = RECORDINGS / f"{backend}.json"
    if not path.exists():
        pytest.skip(
            f"{path.relative_to(ROOT)} is missing: record it on a GPU machine with "
            f"`python3 tests/gpu/record_cycles.py --out DIR` and commit DIR/{backend}.json"
        )
    real = load_recording(str(path))
    assert real["backend"] == backend
    assert real["meta"]["fake"] is False, f"{path} was recorded on the fake, not on a GPU"
    fake = install(monkeypatch, FakeCuda(major=facts_of(real)["major"]))
    gaps = fake_gaps(
        real, sys.modules["cuda.bindings.driver"], sys.modules["cuda.bindings.runtime"]
    )
    assert gaps == [], f"the fake lacks what the driver was called with ({path}):\n" + "\n".join(
        gaps
    )
    assert fake.calls == []  # fake_gaps only looks the names up
    replayed = load_recording(str(request.getfixturevalue("fake_recordings")[backend]))
    problems = compare(real, replayed, expected_name="GPU", actual_name="fake")
    assert problems == [], (
        f"the fake's calls differ from the GPU's recorded in {path.relative_to(ROOT)} "
        "(fix the fake, or re-record on a GPU if the backend's calls changed on purpose):\n"
        + "\n\n".join(problems)
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fake_cycle_records_the_same_file_every_time(
    backend: str, fake_recordings: dict[str, Path], tmp_path: Path
) -> None:
    first = fake_recordings[backend]
    committed = RECORDINGS / f"{backend}.json"
    facts = str(committed) if committed.exists() else None
    second = record_cycles.record(backend, tmp_path, fake=True, facts_file=facts)
    assert first.read_bytes() == second.read_bytes()


def _count(calls: list[dict[str, Any]], fn: str, **match: Any) -> int:
    return sum(1 for c in calls if c["fn"] == fn and all(c.get(k) == v for k, v in match.items()))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cuda_vmm_cycle_covers_swap_in_out_twice_and_readopt(
    fake_recordings: dict[str, Path],
) -> None:
    rec = load_recording(str(fake_recordings["cuda-vmm"]))
    assert rec["meta"]["fake"] is True
    agent, client = rec["calls"]["agent"], rec["calls"]["client"]
    assert all(c.get("code") == "CUresult.CUDA_SUCCESS" for c in agent + client)
    # agent: two swap-ins of two chunks, then the readopt imports what the client handed back
    assert _count(agent, "cuMemCreate") == 4
    assert _count(agent, "cuMemExportToShareableHandle") == 4
    assert _count(agent, "cuMemImportFromShareableHandle") == 2
    assert _count(agent, "cuMemGetAllocationPropertiesFromHandle") == 2
    assert _count(agent, "cuMemRelease") == 4 + 2, "every created and readopted chunk released"
    assert not any(c["fn"].startswith("cuCtx") for c in agent), "the agent makes no context"
    # client: reserve once, map/unmap twice, copies both ways, free, close
    assert _count(client, "cuMemAddressReserve") == 1
    assert _count(client, "cuMemImportFromShareableHandle") == 4
    assert _count(client, "cuMemMap") == 4
    assert _count(client, "cuMemSetAccess") == 2
    assert _count(client, "cuMemcpyHtoDAsync") == 4
    assert _count(client, "cuMemcpyDtoHAsync") == 4
    assert _count(client, "cuMemUnmap") == 4
    retained = _count(client, "cuMemRetainAllocationHandle")  # readopt by address, if used
    assert _count(client, "cuMemRelease") == 4 + retained, "every handle it held released"
    assert [c["fn"] for c in client[-4:]] == [
        "cuCtxSynchronize", "cuStreamDestroy", "cuStreamDestroy", "cuDevicePrimaryCtxRelease",
    ]  # fmt: skip
    assert _count(client, "cuMemAddressFree", args=["$va#1+0x0", 128 * MIB]) == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_managed_cycle_covers_advise_and_prefetch_both_ways(
    fake_recordings: dict[str, Path],
) -> None:
    rec = load_recording(str(fake_recordings["managed"]))
    calls = rec["calls"]["client"]
    assert all(c.get("code") == "cudaError_t.cudaSuccess" for c in calls if c["api"] == "runtime")
    host = {
        "id": 0,
        "struct": "cudaMemLocation",
        "type": "cudaMemLocationType.cudaMemLocationTypeHost",
    }
    device = {**host, "type": "cudaMemLocationType.cudaMemLocationTypeDevice"}
    prefetches = [c["args"][2] for c in calls if c["fn"] == "cudaMemPrefetchAsync"]
    assert prefetches == [device, host, device]
    assert _count(calls, "cudaMallocManaged") == 1
    assert _count(calls, "cudaMemAdvise") == 5
    assert _count(calls, "cudaFree", args=["$managed#1+0x0"]) == 1


# --- the recorder -------------------------------------------------------------------------


def test_without_the_wrap_variable_load_returns_the_binding_modules_themselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(cc.WRAP_ENV, raising=False)
    install(monkeypatch, FakeCuda())
    b = cc.load(runtime=True)
    assert b.driver is sys.modules["cuda.bindings.driver"]
    assert b.runtime is sys.modules["cuda.bindings.runtime"]


def test_a_wrap_variable_that_names_nothing_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeCuda())
    monkeypatch.setenv(cc.WRAP_ENV, "tests.support.no_such_module:wrap")
    with pytest.raises(RuntimeError, match=r"MODELSWAP_CUDA_WRAP=tests\.support\.no_such_module"):
        cc.load()
    monkeypatch.setenv(cc.WRAP_ENV, "tests.support.cuda_recorder:no_such_function")
    with pytest.raises(RuntimeError, match="no_such_function"):
        cc.load()


def test_the_recorder_writes_each_call_normalised_as_it_returns(
    monkeypatch: pytest.MonkeyPatch, recording_env: Path
) -> None:
    fake = install(monkeypatch, FakeCuda(total_bytes=64 * MIB))
    b = cc.load()
    assert b.driver is not sys.modules["cuda.bindings.driver"]
    d = b.driver
    cc.initialize(b)
    dev = cc.check(b, "cuDeviceGet", d.cuDeviceGet(0))
    ctx = cc.check(b, "r", d.cuDevicePrimaryCtxRetain(dev))
    cc.check(b, "s", d.cuCtxSetCurrent(ctx))
    va = cc.check(b, "r", d.cuMemAddressReserve(8 * MIB, 2 * MIB, 0, 0))
    h = cc.check(b, "c", d.cuMemCreate(4 * MIB, cc.allocation_prop(b, ordinal=0), 0))
    cc.check(b, "m", d.cuMemMap(int(va) + 4 * MIB, 4 * MIB, 0, h, 0))
    desc = cc.access_desc(b, 0, writable=False)
    cc.check(b, "a", d.cuMemSetAccess(int(va) + 4 * MIB, 4 * MIB, [desc], 1))
    cc.check(b, "u", d.cuMemUnmap(int(va) + 4 * MIB, 4 * MIB))
    cc.check(b, "r", d.cuMemRelease(h))
    assert cc.code_of(d.cuMemRelease(h)) == T.CUresult.CUDA_ERROR_INVALID_VALUE  # twice: refused
    cc.check(b, "f", d.cuMemAddressFree(va, 8 * MIB))
    assert d.CUresult is T.CUresult  # types and constants pass through unwrapped
    prop = (
        '{"location":{"id":0,"struct":"CUmemLocation","type":"CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE"},'
        '"requestedHandleTypes":"CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",'
        '"struct":"CUmemAllocationProp","type":"CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED"}'
    )
    access = (
        '[{"flags":"CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ",'
        '"location":{"id":0,"struct":"CUmemLocation","type":"CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE"},'
        '"struct":"CUmemAccessDesc"}]'
    )
    ok = "CUresult.CUDA_SUCCESS"
    expected = [
        f"driver.cuInit(0) -> {ok}",
        f"driver.cuDeviceGet(0) -> {ok} [CUdevice(0)]",
        f"driver.cuDevicePrimaryCtxRetain(CUdevice(0)) -> {ok} [$CUcontext#1]",
        f"driver.cuCtxSetCurrent($CUcontext#1) -> {ok}",
        f"driver.cuMemAddressReserve(8388608, 2097152, NULL, 0) -> {ok} [CUdeviceptr($va#1)]",
        f"driver.cuMemCreate(4194304, {prop}, 0) -> {ok} [$CUmemGenericAllocationHandle#1]",
        f"driver.cuMemMap($va#1+0x400000, 4194304, 0, $CUmemGenericAllocationHandle#1, 0) -> {ok}",
        f"driver.cuMemSetAccess($va#1+0x400000, 4194304, {access}, 1) -> {ok}",
        f"driver.cuMemUnmap($va#1+0x400000, 4194304) -> {ok}",
        f"driver.cuMemRelease($CUmemGenericAllocationHandle#1) -> {ok}",
        # released: the same handle value is no longer what it was, so it reads as new
        "driver.cuMemRelease($CUmemGenericAllocationHandle#2) -> CUresult.CUDA_ERROR_INVALID_VALUE",
        f"driver.cuMemAddressFree(CUdeviceptr($va#1+0x0), 8388608) -> {ok}",
    ]
    recorded = cuda_recorder.recorder().calls("agent")
    assert lines(recorded) == expected
    meta, from_file = read_jsonl(f"{recording_env}.agent.jsonl")
    assert from_file == recorded
    assert meta["role"] == "agent" and meta["fake"] is True
    assert meta["bindings_version"] == "13.0.1"
    assert len(fake.calls) == len(expected)


def test_values_the_driver_reuses_get_fresh_symbols_once_retired() -> None:
    rec = Recorder()
    s1, s2 = T.CUstream(0x77), T.CUstream(0x77)
    rec.log("driver", "cuStreamCreate", (1,), (T.CUresult(0), s1), None)
    rec.log("driver", "cuStreamSynchronize", (s1,), (T.CUresult(0),), None)
    rec.log("driver", "cuStreamDestroy", (s1,), (T.CUresult(0),), None)
    rec.log("driver", "cuStreamCreate", (1,), (T.CUresult(0), s2), None)
    host = 0x7F00_0000_0000
    rec.log("driver", "cuMemHostRegister", (host, 4 * MIB, 8), (T.CUresult(0),), None)
    rec.log("driver", "cuMemcpyDtoHAsync", (host + MIB, 0, 64, s2), (T.CUresult(0),), None)
    rec.log("driver", "cuMemHostUnregister", (host,), (T.CUresult(0),), None)
    rec.log("driver", "cuMemHostRegister", (host, 2 * MIB, 0), (T.CUresult(0),), None)
    rec.log("driver", "cuMemImportFromShareableHandle", (9, 1), (T.CUresult(0), None), None)
    rec.log("driver", "cuMemImportFromShareableHandle", (9, 1), (T.CUresult(0), None), None)
    ok = "CUresult.CUDA_SUCCESS"
    assert lines(rec.calls()) == [
        f"driver.cuStreamCreate(1) -> {ok} [$CUstream#1]",
        f"driver.cuStreamSynchronize($CUstream#1) -> {ok}",
        f"driver.cuStreamDestroy($CUstream#1) -> {ok}",
        f"driver.cuStreamCreate(1) -> {ok} [$CUstream#2]",
        f"driver.cuMemHostRegister($host#1+0x0, 4194304, 8) -> {ok}",
        f"driver.cuMemcpyDtoHAsync($host#1+0x100000, NULL, 64, $CUstream#2) -> {ok}",
        f"driver.cuMemHostUnregister($host#1+0x0) -> {ok}",
        f"driver.cuMemHostRegister($host#2+0x0, 2097152, 0) -> {ok}",
        # an fd number says nothing across closes (not CUDA calls): each appearance is new
        f"driver.cuMemImportFromShareableHandle($fd#1, 1) -> {ok} [null]",
        f"driver.cuMemImportFromShareableHandle($fd#2, 1) -> {ok} [null]",
    ]
    assert rec.path("main") is None  # no prefix: kept in memory only


def test_a_call_that_raises_is_recorded_and_the_exception_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch, recording_env: Path
) -> None:
    fake = install(monkeypatch, FakeCuda())
    fake.no_driver = True
    b = cc.load()
    with pytest.raises(cc.CudaUnavailable, match="libcuda"):
        cc.initialize(b)
    (call,) = cuda_recorder.recorder().calls("agent")
    assert call["raised"] == 'RuntimeError: Failed to dlopen "libcuda.so.1"'
    assert lines([call]) == [
        'driver.cuInit(0) -> raised RuntimeError: Failed to dlopen "libcuda.so.1"'
    ]


def test_a_thread_records_under_the_role_it_names(
    monkeypatch: pytest.MonkeyPatch, recording_env: Path
) -> None:
    install(monkeypatch, FakeCuda())
    b = cc.load()
    b.driver.cuInit(0)

    def client() -> None:
        with cuda_recorder.recorder().role("client"):
            b.driver.cuDeviceGetCount()

    thread = threading.Thread(target=client)
    thread.start()
    thread.join()
    b.driver.cuDriverGetVersion()
    rec = cuda_recorder.recorder()
    assert [c["fn"] for c in rec.calls("agent")] == ["cuInit", "cuDriverGetVersion"]
    assert [c["fn"] for c in rec.calls("client")] == ["cuDeviceGetCount"]
    assert Path(f"{recording_env}.client.jsonl").exists()


def test_a_fault_of_the_recorder_is_written_down_never_raised_to_the_caller(
    monkeypatch: pytest.MonkeyPatch, recording_env: Path
) -> None:
    install(monkeypatch, FakeCuda())
    b = cc.load()

    def broken(self: Any, fn: str, args: tuple[Any, ...]) -> list[Any]:
        raise ValueError("cannot normalise")

    monkeypatch.setattr(cuda_recorder.Normaliser, "args", broken)
    assert cc.code_of(b.driver.cuInit(0)) == 0
    (call,) = cuda_recorder.recorder().calls("agent")
    assert call == {
        "fn": "cuInit",
        "api": "driver",
        "recorder_error": "ValueError: cannot normalise",
    }
    recording = {"calls": {"agent": [call]}}
    problems = compare(recording, recording)
    assert [p.split(":")[0] for p in problems] == ["recorded", "replayed"]
    assert all("the recorder failed on 1 calls" in p for p in problems)


# --- the comparator on synthetic sequences ------------------------------------------------


def _call(
    fn: str, *args: Any, code: str = "CUresult.CUDA_SUCCESS", out: Any = ()
) -> dict[str, Any]:
    api = "runtime" if fn.startswith("cuda") else "driver"
    return {"fn": fn, "api": api, "args": list(args), "code": code, "out": list(out)}


PROP = {
    "struct": "CUmemAllocationProp",
    "type": "CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED",
    "requestedHandleTypes": "CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
    "location": {
        "struct": "CUmemLocation",
        "type": "CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE",
        "id": 0,
    },
}


def _recording() -> dict[str, Any]:
    return {
        "backend": "cuda-vmm",
        "meta": {"fake": False, "bindings_version": "13.0.2"},
        "calls": {
            "agent": [
                _call("cuInit", 0),
                _call("cuDeviceTotalMem", "CUdevice(0)", out=[85_000_000_000]),
                _call(
                    "cuMemCreate",
                    64 * MIB,
                    copy.deepcopy(PROP),
                    0,
                    out=["$CUmemGenericAllocationHandle#1"],
                ),
                _call(
                    "cuMemExportToShareableHandle",
                    "$CUmemGenericAllocationHandle#1",
                    "CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
                    0,
                    out=["$fd#1"],
                ),
            ],
            "client": [
                _call("cuEventQuery", "$CUevent#1", code="CUresult.CUDA_ERROR_NOT_READY"),
                _call("cuEventQuery", "$CUevent#1"),
                _call("cuMemMap", "$va#1+0x0", 64 * MIB, 0, "$CUmemGenericAllocationHandle#1", 0),
                _call(
                    "cudaMallocManaged",
                    64 * MIB,
                    1,
                    code="cudaError_t.cudaSuccess",
                    out=["$managed#1"],
                ),
            ],
        },
    }


def test_equal_sequences_compare_equal() -> None:
    assert compare(_recording(), copy.deepcopy(_recording())) == []


def test_machine_facts_and_not_ready_polls_are_not_differences() -> None:
    other = _recording()
    other["calls"]["agent"][1]["out"] = [34_000_000_000]  # another GPU's memory size
    other["calls"]["client"].insert(0, copy.deepcopy(other["calls"]["client"][0]))  # one more poll
    other["meta"]["bindings_version"] = "13.1.0"
    assert compare(_recording(), other) == []


def test_a_renamed_call_fails_with_a_diff_naming_both() -> None:
    other = _recording()
    other["calls"]["client"][2]["fn"] = "cuMemMapArrayAsync"
    (problem,) = compare(_recording(), other, expected_name="GPU", actual_name="fake")
    assert problem.startswith("role client: first difference at call 2\n")
    assert "--- GPU (client)" in problem and "+++ fake (client)" in problem
    assert "-driver.cuMemMap($va#1+0x0, 67108864, 0, $CUmemGenericAllocationHandle#1, 0)" in problem
    assert "+driver.cuMemMapArrayAsync($va#1+0x0" in problem


def test_a_changed_enum_fails_with_a_diff() -> None:
    other = _recording()
    other["calls"]["agent"][2]["args"][1]["location"]["type"] = (
        "CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA"
    )
    (problem,) = compare(_recording(), other)
    assert problem.startswith("role agent: first difference at call 3\n")
    assert (
        '-driver.cuMemCreate(67108864, {"location":{"id":0,"struct":"CUmemLocation","type":"CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE"}'
        in problem
    )
    assert "+driver.cuMemCreate(" in problem and "CU_MEM_LOCATION_TYPE_HOST_NUMA" in problem


def test_a_changed_error_code_or_output_fails() -> None:
    other = _recording()
    other["calls"]["agent"][3]["code"] = "CUresult.CUDA_ERROR_NOT_SUPPORTED"
    other["calls"]["client"][3]["out"] = ["CUdeviceptr($managed#1)"]
    problems = compare(_recording(), other)
    assert [p.splitlines()[0] for p in problems] == [
        "role agent: first difference at call 4",
        "role client: first difference at call 3",
    ]
    assert "-> CUresult.CUDA_ERROR_NOT_SUPPORTED [$fd#1]" in problems[0]
    assert (
        "+runtime.cudaMallocManaged(67108864, 1) -> cudaError_t.cudaSuccess [CUdeviceptr($managed#1)]"
        in problems[1]
    )


def test_an_extra_or_a_missing_call_fails() -> None:
    other = _recording()
    other["calls"]["agent"].append(_call("cuMemRelease", "$CUmemGenericAllocationHandle#1"))
    (problem,) = compare(_recording(), other)
    assert problem.startswith("role agent: 4 calls vs 5\n")
    assert (
        "+driver.cuMemRelease($CUmemGenericAllocationHandle#1) -> CUresult.CUDA_SUCCESS" in problem
    )
    (problem,) = compare(other, _recording())
    assert "-driver.cuMemRelease($CUmemGenericAllocationHandle#1)" in problem


def test_a_missing_role_fails() -> None:
    other = _recording()
    del other["calls"]["client"]
    (problem,) = compare(_recording(), other)
    assert problem == "roles differ: recorded has ['agent', 'client'], replayed has ['agent']"


def test_fake_gaps_name_what_the_fake_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeCuda())
    driver, runtime = sys.modules["cuda.bindings.driver"], sys.modules["cuda.bindings.runtime"]
    assert fake_gaps(_recording(), driver, runtime) == []
    other = _recording()
    agent = other["calls"]["agent"]
    agent.append(_call("cuMemGetHandleForAddressRange", "$va#1+0x0", 4096))
    agent.append(
        _call("cuStreamCreate", "CUstream_flags.CU_STREAM_PER_THREAD", out=["$CUstream#1"])
    )
    agent.append(_call("cuGraphLaunch", "$CUgraphExec#1", "$CUstream#1"))
    agent.append(
        _call(
            "cuMemSetAccess",
            "$va#1+0x0",
            4096,
            [{"struct": "CUmemAccessDesc", "flags": 3, "localized": 0}],
            1,
        )
    )
    agent.append(
        _call(
            "cuMemAdvise",
            "$va#1+0x0",
            4096,
            "CUmem_advise_enum.CU_MEM_ADVISE_SET_READ_MOSTLY",
            {"struct": "CUmemDecompressParams"},
        )
    )
    assert fake_gaps(other, driver, runtime) == [
        "function driver.cuMemGetHandleForAddressRange is missing",
        "function driver.cuGraphLaunch is missing",
        "enum type CUmem_advise_enum is missing",
        "enum member CUstream_flags.CU_STREAM_PER_THREAD is missing",
        "type CUgraphExec is missing",
        "struct type CUmemDecompressParams is missing",
        "struct field CUmemAccessDesc.localized is missing",
    ]


def test_facts_of_a_recording_configure_the_fake() -> None:
    recording = {
        "meta": {"bindings_version": "12.9.1"},
        "calls": {
            "agent": [
                _call("cuDeviceGetCount", out=[2]),
                _call(
                    "cuDeviceGetAttribute",
                    "CUdevice_attribute.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT",
                    "CUdevice(0)",
                    out=[5],
                ),
                _call(
                    "cuDeviceGetAttribute",
                    "CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID",
                    "CUdevice(0)",
                    code="CUresult.CUDA_ERROR_INVALID_VALUE",
                    out=[None],
                ),
                _call(
                    "cuDeviceGetName", 96, "CUdevice(0)", out=[{"bytes": "NVIDIA H100 80GB HBM3"}]
                ),
            ],
            "client": [
                _call(
                    "cudaDeviceGetAttribute",
                    "cudaDeviceAttr.cudaDevAttrConcurrentManagedAccess",
                    0,
                    code="cudaError_t.cudaSuccess",
                    out=[0],
                )
            ],
        },
    }
    facts = facts_of(recording)
    assert facts == {
        "major": 12,
        "gpus": 2,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "attributes": {
            "CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT": 5,
            "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS": 0,
        },
        "attribute_errors": {
            "CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID": "CUresult.CUDA_ERROR_INVALID_VALUE"
        },
    }
    fake = FakeCuda(gpus=2)
    apply_facts(fake, facts)
    for device in fake.devices:
        assert device.attributes["CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT"] == 5
        assert device.attributes["CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS"] == 0
        assert "CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID" not in device.attributes


def test_a_recording_round_trips_through_json(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_recording()))
    assert compare(_recording(), load_recording(str(path))) == []


def test_the_command_line_compare_prints_the_diff_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cuda_replay import main

    same, drifted = tmp_path / "gpu.json", tmp_path / "fake.json"
    same.write_text(json.dumps(_recording()))
    other = _recording()
    other["calls"]["client"][2]["args"][1] = 32 * MIB
    drifted.write_text(json.dumps(other))
    assert main([str(same), str(same)]) == 0
    assert capsys.readouterr().out == "same calls\n"
    assert main([str(same), str(drifted)]) == 1
    out = capsys.readouterr().out
    assert "-driver.cuMemMap($va#1+0x0, 67108864," in out
    assert "+driver.cuMemMap($va#1+0x0, 33554432," in out
    assert out.endswith("1 differences\n")


# --- the cycles' failure paths --------------------------------------------------------------


@pytest.mark.timeout(200)
def test_a_failed_cycle_reports_its_log_and_leaves_its_calls_as_a_partial_recording(
    tmp_path: Path,
) -> None:
    with pytest.raises(RuntimeError) as failed:
        record_cycles.record("cuda-vmm", tmp_path, fake=True, fake_fail="cuMemAddressReserve")
    message = str(failed.value)
    assert message.startswith(f"cuda-vmm cycle exited 1 ({tmp_path / 'cuda-vmm.log'})")
    assert "cuMemAddressReserve failed: CUDA_ERROR_INVALID_VALUE" in message
    assert not (tmp_path / "cuda-vmm.json").exists()  # never a replayable recording
    partial = load_recording(str(tmp_path / "cuda-vmm.partial.json"))
    (reserve,) = [c for c in partial["calls"]["client"] if c["fn"] == "cuMemAddressReserve"]
    assert reserve["code"] == "CUresult.CUDA_ERROR_INVALID_VALUE"
    assert partial["calls"]["agent"][0]["fn"] == "cuInit"


@pytest.mark.timeout(200)
def test_a_refused_readopt_export_still_swaps_out_and_closes_then_fails_the_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from modelswap_client.mappers.base import MapperError
    from modelswap_client.mappers.cuda_vmm import CudaVmmMapper

    monkeypatch.delenv(cc.WRAP_ENV, raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    fake = install(monkeypatch, FakeCuda(total_bytes=1024 * MIB))

    def refuse(self: CudaVmmMapper, address: int) -> int:
        raise MapperError("cuMemExportToShareableHandle failed: CUDA_ERROR_INVALID_VALUE (1)")

    monkeypatch.setattr(CudaVmmMapper, "export_mapped_fd", refuse)
    with pytest.raises(
        AssertionError, match="readopt: the model process could not export: MapperError"
    ):
        record_cycles.cuda_vmm_cycle(fake=True)
    names = fake.names()
    last_map = max(i for i, n in enumerate(names) if n == "cuMemMap")
    assert names.count("cuMemUnmap") == 4 and names.index("cuMemAddressFree") > last_map
    assert fake.violations == []
    assert fake.live_allocations() == []
    assert fake.mappings == {} and fake.reservations == {} and fake.registered == {}
    assert all(n == 0 for n in fake.contexts.values())
