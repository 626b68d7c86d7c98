"""KV bytes per tier as status fields (issue 29, item 4): a session store reports the bytes
of its blocks per tier with its heartbeats, the agent reports them per model
(`ModelInfo.kvGpuBytes`/`kvHostBytes`, the SwapNode's `models[]`), the operator copies them
into `status.kv` with their sizes and the wide KV column's `shown`, and `modelswap status
-o wide` shows them. The figures move to the host tier when a conversation crosses
offloadAfterTokens."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from modelswap_api.control import ModelInfo
from modelswap_api.models import HostedModel, ModelDeploymentStatus
from modelswap_operator.status import kv_status
from modelswap_sidecar.agent.ports.reports import kv_bytes_of
from modelswap_sidecar.engine.records import KvReport
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.status import ModelStatus
from modelswap_sidecar.local.status import WIDE_COLUMNS, rows, table

KI = 1 << 10


def test_a_store_reports_its_blocks_bytes_per_tier_and_they_move_past_offload() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from modelswap_client.kv_sessions import KvSessionStore
    from tests.unit.test_kv_tiered_cache import (
        OFFLOAD_AFTER_TOKENS,
        TOKENS_PER_BLOCK,
        Kv,
        llama,
        pooled,
        prompt,
    )

    model = llama()
    kv = Kv(model)
    store = KvSessionStore(
        kv.tensors, namespace="ns", model="m", max_sessions=4, hold=contextlib.nullcontext
    )
    block = kv.pool.block_bytes

    def turn(sid: str, ids: Any) -> Any:
        with store.turn(sid, ids, model) as t:
            out = pooled(model, ids, 2, t.cache)
            t.keep(out)
        return out

    first = turn("a", prompt(OFFLOAD_AFTER_TOKENS - 10))  # 15 tokens held: under the offload
    report = KvReport.from_doc(store.report())
    assert report is not None
    assert report.host_bytes == 0 and report.host_blocks == 0
    assert report.device_bytes == report.device_blocks * block > 0
    # the conversation crosses offloadAfterTokens: its tail's K/V is in host-tier blocks
    turn("a", torch.cat([first, prompt(20, seed=5)], dim=1))
    crossed = KvReport.from_doc(store.report())
    assert crossed is not None
    held = first.shape[1] + 20 + 2 - 1
    assert crossed.device_bytes == OFFLOAD_AFTER_TOKENS // TOKENS_PER_BLOCK * block
    assert crossed.host_bytes == -(-(held - OFFLOAD_AFTER_TOKENS) // TOKENS_PER_BLOCK) * block > 0


def status(resident_bytes: int, kv: KvReport) -> ModelStatus:
    return ModelStatus("m", 0, EngineState.RESIDENT, "Resident", 1, resident_bytes, 1, 0, 0,
                       0.0, False, "", kv=kv)  # fmt: skip


def test_the_agent_reports_kv_bytes_gpu_only_while_mapped() -> None:
    kv = KvReport(device_blocks=2, host_blocks=1, device_bytes=32 * KI, host_bytes=16 * KI)
    assert kv_bytes_of(status(8 << 20, kv)) == {"kv_gpu_bytes": 32 * KI, "kv_host_bytes": 16 * KI}
    # swapped out: the KV region holds no GPU memory, whatever the store last said
    assert kv_bytes_of(status(0, kv)) == {"kv_gpu_bytes": 0, "kv_host_bytes": 16 * KI}
    assert kv_bytes_of(None) == {}
    # a heartbeat from a client that reports no bytes reads 0, not a refusal
    assert KvReport.from_doc({"device_blocks": 3}) == KvReport(device_blocks=3)


def test_the_fields_pass_the_strict_codecs_and_the_operator_copies_them() -> None:
    info = ModelInfo.from_dict({"uid": "u", "namespace": "ns", "name": "m", "state": "RESIDENT",
                                "phase": "Resident", "kvGpuBytes": 32 * KI,
                                "kvHostBytes": 1536 * KI})  # fmt: skip
    assert (info.kv_gpu_bytes, info.kv_host_bytes) == (32 * KI, 1536 * KI)
    hosted = HostedModel.from_dict({"uid": "u", "kvGpuBytes": 32 * KI, "kvHostBytes": 1536 * KI})
    assert hosted.to_dict()["kvHostBytes"] == 1536 * KI
    kv = kv_status(hosted)
    assert kv is not None
    assert kv.to_dict() == {"gpuBytes": 32 * KI, "gpuSize": "32Ki", "hostBytes": 1536 * KI,
                            "hostSize": "1.5Mi", "shown": "32Ki/1.5Mi"}  # fmt: skip
    doc = ModelDeploymentStatus(kv=kv).to_dict()
    assert ModelDeploymentStatus.from_dict(doc).kv == kv
    assert kv_status(HostedModel(uid="u")).shown == "0/0"  # type: ignore[union-attr]
    assert kv_status(None) is None  # no node reports it: no figures


def test_the_crds_carry_the_fields_and_the_wide_kv_column() -> None:
    from modelswap_api import crds

    md = crds.version_of(crds.crd_for(crds.MODEL_DEPLOYMENT), crds.VERSION)
    columns = {c["name"]: c for c in md["additionalPrinterColumns"]}
    assert columns["KV"]["jsonPath"] == ".status.kv.shown" and columns["KV"]["priority"] == 1
    kv = md["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["kv"]
    assert set(kv["properties"]) == {"gpuBytes", "gpuSize", "hostBytes", "hostSize", "shown"}
    sn = crds.version_of(crds.crd_for(crds.SWAP_NODE), crds.VERSION)
    hosted = sn["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["models"]
    assert {"kvGpuBytes", "kvHostBytes"} <= set(hosted["items"]["properties"])


def test_modelswap_status_wide_shows_kv_per_tier() -> None:
    models = [
        {"uid": "1", "namespace": "default", "name": "chat", "phase": "Resident",
         "residentBytes": 3 << 20, "hostBytes": 5 << 20, "kvGpuBytes": 64 * KI,
         "kvHostBytes": 0, "swapIns": 2, "gpu": "sim-gpu-0"},
        {"uid": "2", "namespace": "default", "name": "long", "phase": "Resident",
         "residentBytes": 3 << 20, "kvGpuBytes": 64 * KI, "kvHostBytes": 1536 * KI},
    ]  # fmt: skip
    plain = rows(models, [], node_name="local", now_seconds=0.0)
    assert all(len(r) == 7 for r in plain)  # without -o wide: the columns as before
    wide = rows(models, [], node_name="local", now_seconds=0.0, wide=True)
    shown = {r[0]: dict(zip(WIDE_COLUMNS, r, strict=True)) for r in wide}
    assert shown["chat"]["KV"] == "64Ki/0" and shown["long"]["KV"] == "64Ki/1.5Mi"
    assert (shown["chat"]["HOST"], shown["chat"]["SWAP-INS"]) == ("5Mi", "2")
    assert shown["long"]["GPU"] == "<none>"
    assert table(wide, wide=True).splitlines()[0].split() == list(WIDE_COLUMNS)
