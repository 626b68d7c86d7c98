"""What the engine knows about each model, instance and region, and its state-file form.

The state file records configuration, epochs, layouts, which host-store copies are
committed and which instances were mapped; live chunks and sockets are never persisted
(after a restart they come back only through readopt).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.wire import KvMode, Peer, RegionKind, SwapOutMode
from modelswap_sidecar.allocators.base import Chunk
from modelswap_sidecar.engine.hoststore import StoredFile
from modelswap_sidecar.engine.states import EngineState

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    gpu: int
    kv_mode: KvMode = KvMode.DISCARD
    on_swap_out: SwapOutMode = SwapOutMode.HOST
    #: tiered KV pool (`kvCache`): sequences longer than this get host-tier blocks (None:
    #: no host tier); the host tier holds at most `kv_host_bytes`, in host-store files
    kv_offload_after_tokens: int | None = None
    kv_host_bytes: int = 0


@dataclass(slots=True)
class RegionRecord:
    tag: str
    size_bytes: int
    kind: RegionKind
    address: int
    chunks: list[Chunk] = field(default_factory=list)  # live, in address order
    weights_file: StoredFile | None = None
    kv_file: StoredFile | None = None

    @property
    def mapped_bytes(self) -> int:
        return sum(c.size_bytes for c in self.chunks)


#: a KV report's figures are counts; one past this is no count a process could hold
KV_REPORT_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class KvReport:
    """What a model process's KV session store said with its last heartbeat (the client's
    `KvSessionStore.report`): blocks held per tier and sessions now, counters since the
    process started. Zeros: no report."""

    sessions: int = 0
    device_blocks: int = 0
    host_blocks: int = 0
    #: the bytes of those blocks (the agent reports them as kvGpuBytes/kvHostBytes)
    device_bytes: int = 0
    host_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    tokens_reused: int = 0
    tokens_recomputed: int = 0

    @classmethod
    def from_doc(cls, doc: object) -> KvReport | None:
        """The report in a heartbeat's `kv` document; None when it is not one (not an
        object, or a known figure that is not a count in [0, 2^63)). Unknown keys are
        left out, missing ones are 0."""
        if not isinstance(doc, dict):
            return None
        figures: dict[str, int] = {}
        for name in cls.__dataclass_fields__:
            value = doc.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int):
                return None
            if not 0 <= value <= KV_REPORT_MAX:
                return None
            figures[name] = value
        return cls(**figures)

    def __add__(self, other: KvReport) -> KvReport:
        return KvReport(
            **{
                name: getattr(self, name) + getattr(other, name)
                for name in self.__dataclass_fields__
            }
        )

    def as_doc(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(slots=True)
class InstanceRecord:
    name: str
    regions: dict[str, RegionRecord] = field(default_factory=dict)
    peer: Peer | None = None
    pid: int = 0
    mapped: bool = False  # its clients map live chunks
    committed: bool = False  # its weights are complete in the host store
    #: what the client said its committed weights are (a layout fingerprint; opaque to
    #: the agent): handed back on attach so the client never binds bytes of another layout
    fingerprint: str = ""
    awaiting_readopt: bool = False
    #: the host tier of its KV pool: an agent-owned host-store file the client maps
    #: writable (never a weight copy); kept across swaps and client restarts
    kv_host_file: StoredFile | None = None
    last_heartbeat: float | None = None  # time.monotonic() of the last one; not persisted
    #: the KV report of its last heartbeat that carried one; not persisted
    kv_report: KvReport = field(default_factory=KvReport)
    heartbeat_late: bool = False  # logged as late, not heard from since
    #: time.monotonic() of its registration: what its silence counts from before its first
    #: heartbeat (`engine/heartbeats.py`); not persisted
    registered_at: float | None = None

    @property
    def live(self) -> bool:
        return self.peer is not None and not self.peer.closed

    def chunk_bytes(self) -> int:
        return sum(r.mapped_bytes for r in self.regions.values())


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What the clients said they copied in a swap-in: bytes over every instance, seconds
    of the slowest (they copy at once). `scaled`: a client's mapper paced its copies to an
    emulated link (sim) of `target_bytes_per_second`, so the rate is no real link's."""

    bytes: int = 0
    seconds: float = 0.0
    scaled: bool = False
    target_bytes_per_second: float | None = None

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def from_replies(cls, bodies: list[dict[str, Any]]) -> CopyReport:
        """Combine the `copy` documents of restore replies (absent from older clients)."""
        docs = [b["copy"] for b in bodies if isinstance(b.get("copy"), dict)]
        targets = [float(d["target_bytes_per_second"]) for d in docs if d.get("scaled")]
        return cls(
            sum(int(d.get("bytes", 0)) for d in docs),
            max((float(d.get("seconds", 0.0)) for d in docs), default=0.0),
            bool(targets),
            min(targets) if targets else None,
        )

    def as_doc(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "seconds": self.seconds,
            "bytes_per_second": self.bytes_per_second,
            "scaled": self.scaled,
            "target_bytes_per_second": self.target_bytes_per_second,
        }


@dataclass(slots=True)
class ModelRecord:
    config: ModelConfig
    state: EngineState = EngineState.LOADING
    epoch: int = 0
    instances: dict[str, InstanceRecord] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    last_used: float = 0.0
    swap_ins: int = 0
    swap_outs: int = 0
    last_swap_in_seconds: float = 0.0
    last_swap_out_seconds: float = 0.0
    last_swap_in_copy: CopyReport = field(default_factory=CopyReport)
    kv_discarded: bool = False
    reason: str = ""
    #: commits received and not finished (table lock): a swap-out never starts draining
    #: while one waits, since its committer is inside `in_use()` and the drain waits on it
    commits: int = 0
    #: commits that came in while a swap-out drained the model and run beside it, without
    #: the operation lock the swap-out holds (table lock; `ModelTable.commits_done`)
    joined_commits: int = 0
    #: a swap-out is waiting for the model's in_use() work (table lock): a commit that
    #: comes in now joins it rather than wait for the operation lock
    draining: bool = False
    #: a commit came in during the current swap-out's drain: that swap-out gives way
    commit_joined_drain: bool = False

    @property
    def name(self) -> str:
        return self.config.name

    def live_instances(self) -> list[InstanceRecord]:
        return [i for i in self.instances.values() if i.live]

    def chunk_bytes(self) -> int:
        return sum(i.chunk_bytes() for i in self.instances.values())


def _stored(doc: dict[str, Any] | None) -> StoredFile | None:
    if not doc:
        return None
    return StoredFile(int(doc["gpu"]), str(doc["relpath"]), int(doc["size_bytes"]))


def _stored_doc(f: StoredFile | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"gpu": f.gpu, "relpath": f.relpath, "size_bytes": f.size_bytes}


def to_doc(models: dict[str, ModelRecord]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, m in models.items():
        out[name] = {
            "config": {
                "gpu": m.config.gpu,
                "kv_mode": str(m.config.kv_mode),
                "on_swap_out": str(m.config.on_swap_out),
                "kv_offload_after_tokens": m.config.kv_offload_after_tokens,
                "kv_host_bytes": m.config.kv_host_bytes,
            },
            "state": str(m.state),
            "epoch": m.epoch,
            "swap_ins": m.swap_ins,
            "swap_outs": m.swap_outs,
            "instances": {
                iname: {
                    "mapped": i.mapped,
                    "committed": i.committed,
                    "fingerprint": i.fingerprint,
                    "kv_host_file": _stored_doc(i.kv_host_file),
                    "regions": [
                        {
                            "tag": r.tag,
                            "size_bytes": r.size_bytes,
                            "kind": str(r.kind),
                            "address": r.address,
                            "weights_file": _stored_doc(r.weights_file),
                            "kv_file": _stored_doc(r.kv_file),
                        }
                        for r in i.regions.values()
                    ],
                }
                for iname, i in m.instances.items()
            },
        }
    return {"version": STATE_VERSION, "models": out}


def from_doc(doc: dict[str, Any]) -> dict[str, ModelRecord]:
    if doc.get("version") != STATE_VERSION:
        raise ValueError(f"unsupported state file version {doc.get('version')!r}")
    models: dict[str, ModelRecord] = {}
    for name, md in doc.get("models", {}).items():
        c = md["config"]
        offload = c.get("kv_offload_after_tokens")
        config = ModelConfig(  # a file from an older agent also names pinned/priority
            name,
            int(c["gpu"]),
            KvMode(c["kv_mode"]),
            SwapOutMode(c.get("on_swap_out", SwapOutMode.HOST)),
            None if offload is None else int(offload),
            int(c.get("kv_host_bytes", 0)),
        )
        m = ModelRecord(config, EngineState(md["state"]), int(md["epoch"]))
        m.swap_ins = int(md.get("swap_ins", 0))
        m.swap_outs = int(md.get("swap_outs", 0))
        for iname, idoc in md.get("instances", {}).items():
            inst = InstanceRecord(
                iname,
                mapped=bool(idoc["mapped"]),
                committed=bool(idoc["committed"]),
                fingerprint=str(idoc.get("fingerprint", "")),
                kv_host_file=_stored(idoc.get("kv_host_file")),
            )
            for rd in idoc["regions"]:
                inst.regions[rd["tag"]] = RegionRecord(
                    rd["tag"],
                    int(rd["size_bytes"]),
                    RegionKind(rd["kind"]),
                    int(rd["address"]),
                    weights_file=_stored(rd.get("weights_file")),
                    kv_file=_stored(rd.get("kv_file")),
                )
            m.instances[iname] = inst
        models[name] = m
    return models
