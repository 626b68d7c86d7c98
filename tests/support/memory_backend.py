"""`InMemoryBackend`: a `NodeBackend` that moves no bytes, for tests and the operator's.

It keeps the books a real agent keeps — models per GPU, HBM used against each GPU's
budget, host bytes kept after an unload — and changes state instantly. An entry that does
not fit its GPU is `deferred` (and retried on every later push); an entry naming a GPU the
node lacks is a `conflict`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from modelswap_api.control import (
    ActionResult,
    DesiredEntry,
    EntryResult,
    ModelInfo,
    NodeInfo,
    Outcome,
)
from modelswap_api.models import GpuStatus, Link
from modelswap_sidecar.control.errors import UnknownModelError
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import phase_of


@dataclass
class _Record:
    entry: DesiredEntry
    gpu: str
    state: EngineState
    host_bytes: int = 0
    swap_ins: int = 0
    swap_outs: int = 0

    @property
    def hbm_bytes(self) -> int:
        model = self.entry.spec.model
        kv = model.kv_cache_bytes.bytes if model.kv_cache_bytes else 0
        return model.weights_bytes.bytes + kv

    @property
    def pinned(self) -> bool:
        policy = self.entry.spec.swap_policy
        return bool(policy and policy.pinned)


class InMemoryBackend:
    def __init__(
        self, node_name: str, gpu_budgets: Mapping[str, int], agent_version: str = "test"
    ) -> None:
        self.node_name = node_name
        self.agent_version = agent_version
        self._budgets = dict(gpu_budgets)
        self._records: dict[str, _Record] = {}
        self.unloaded: list[str] = []  # every unload call, in order (for tests)

    def used_bytes(self, gpu: str) -> int:
        return sum(
            r.hbm_bytes
            for r in self._records.values()
            if r.gpu == gpu and r.state is EngineState.RESIDENT
        )

    async def converge(self, entries: Sequence[DesiredEntry]) -> Sequence[EntryResult]:
        return [self._converge_one(entry) for entry in entries]

    def _converge_one(self, entry: DesiredEntry) -> EntryResult:
        record = self._records.get(entry.uid)
        if entry.gpu is not None and entry.gpu not in self._budgets:
            return _result(entry, "conflict", "UnknownGpu", f"no GPU {entry.gpu} on this node")
        if record is not None and record.state is not EngineState.DROPPED:
            record.entry = entry
            return _result(entry, "applied", "Updated", f"{record.state} on {record.gpu}")
        candidate = _Record(entry=entry, gpu="", state=EngineState.RESIDENT)
        gpus = [entry.gpu] if entry.gpu else sorted(self._budgets)
        if record is not None and not entry.gpu:  # back to the GPU its host copy is kept for
            gpus.sort(key=lambda gpu: gpu != record.gpu)
        for gpu in gpus:
            if self.used_bytes(gpu) + candidate.hbm_bytes <= self._budgets[gpu]:
                candidate.gpu = gpu
                candidate.host_bytes = record.host_bytes if record else candidate.hbm_bytes
                self._records[entry.uid] = candidate
                origin = "host store" if record else "source"
                return _result(entry, "applied", "Loaded", f"loaded on {gpu} from the {origin}")
        return _result(
            entry, "deferred", "InsufficientHBM", f"{candidate.hbm_bytes} bytes fit on no GPU"
        )

    async def unload(self, uid: str) -> None:
        self.unloaded.append(uid)
        record = self._records.get(uid)
        if record is not None:
            record.state = EngineState.DROPPED

    async def forget(self, uid: str) -> bool:
        return self._records.pop(uid, None) is not None

    def save_desired(self) -> asyncio.Future[None]:
        """Nothing to save: nothing of this backend outlives the process."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def node_info(self) -> NodeInfo:
        gpus = tuple(
            GpuStatus(
                uuid=gpu,
                ordinal=ordinal,
                hbm_total_bytes=budget,
                hbm_free_bytes=budget - self.used_bytes(gpu),
                host_store_bytes=sum(r.host_bytes for r in self._records.values() if r.gpu == gpu),
                link=Link(kind="sim"),
            )
            for ordinal, (gpu, budget) in enumerate(sorted(self._budgets.items()))
        )
        return NodeInfo(node_name=self.node_name, agent_version=self.agent_version, gpus=gpus)

    async def models(self) -> Sequence[ModelInfo]:
        return [
            ModelInfo(
                uid=uid,
                namespace=r.entry.namespace,
                name=r.entry.name,
                generation=r.entry.generation,
                state=r.state.value,
                phase=phase_of(r.state),
                gpu=r.gpu,
                resident_bytes=r.hbm_bytes if r.state is EngineState.RESIDENT else 0,
                host_bytes=r.host_bytes,
                swap_ins=r.swap_ins,
                swap_outs=r.swap_outs,
            )
            for uid, r in sorted(self._records.items())
        ]

    async def swap_in(self, uid: str) -> ActionResult:
        record = self._record(uid)
        if record.state is EngineState.RESIDENT:
            return ActionResult(uid=uid, outcome="unchanged", reason="AlreadyResident")
        if self.used_bytes(record.gpu) + record.hbm_bytes > self._budgets[record.gpu]:
            return ActionResult(
                uid=uid, outcome="refused", reason="NoRoom", message=f"{record.gpu} is full"
            )
        record.state = EngineState.RESIDENT
        record.swap_ins += 1
        return ActionResult(uid=uid, outcome="completed", reason="SwappedIn")

    async def swap_out(self, uid: str) -> ActionResult:
        record = self._record(uid)
        if record.pinned:
            return ActionResult(uid=uid, outcome="refused", reason="Pinned")
        if record.state is not EngineState.RESIDENT:
            return ActionResult(uid=uid, outcome="unchanged", reason=record.state.value)
        record.state = EngineState.SWAPPED_OUT
        record.swap_outs += 1
        return ActionResult(uid=uid, outcome="completed", reason="SwappedOut")

    async def reload(self, uid: str, *, keep_host_copy: bool) -> ActionResult:
        record = self._record(uid)
        if not keep_host_copy:
            record.host_bytes = 0
        return ActionResult(uid=uid, outcome="completed", reason="Reloading")

    def _record(self, uid: str) -> _Record:
        record = self._records.get(uid)
        if record is None or record.state is EngineState.DROPPED:
            raise UnknownModelError(uid)
        return record


def _result(entry: DesiredEntry, outcome: Outcome, reason: str, message: str) -> EntryResult:
    return EntryResult(uid=entry.uid, outcome=outcome, reason=reason, message=message)
