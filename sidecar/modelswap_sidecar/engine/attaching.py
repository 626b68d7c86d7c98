"""Attaching a client's regions (mapped, and restored from the host store when a copy
exists), its KV host tier, and committing its weights to the host store.

An attach holds the GPU's allocation lock and the model's operation lock, like a
swap-in (it may make room the same way); a commit holds the model's operation lock, except
one that comes in while a swap-out drains the model (it runs beside the drain, which waits
for it: see `commit`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from modelswap_api.wire import Message, Op, RegionKind, reply_to
from modelswap_sidecar.allocators.base import GRANULARITY_BYTES
from modelswap_sidecar.engine.errors import ProtocolViolation, WrongState
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, ModelRecord, RegionRecord
from modelswap_sidecar.engine.recovery import Recovery
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.table import ModelTable
from modelswap_sidecar.engine.transport import Transport, close_fd, request

S = EngineState
#: a client's fingerprint of its committed weights is opaque here, but bounded
MAX_FINGERPRINT_CHARS = 4096


class Attacher:
    """A client's attach and commit."""

    def __init__(
        self,
        *,
        table: ModelTable,
        ledger: GpuLedger,
        swapper: Swapper,
        recovery: Recovery,
        transport: Transport,
        store: HostStore,
        settings: EngineSettings,
        checkpoint: Callable[[str], None],
    ) -> None:
        self.table = table
        self.ledger = ledger
        self.swapper = swapper
        self.recovery = recovery
        self.transport = transport
        self.store = store
        self.settings = settings
        self.checkpoint = checkpoint

    def attach(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        specs = message.body.get("regions", [])
        layout: dict[str, RegionRecord] = {}
        for s in specs:
            size, address = int(s["bytes"]), int(s["address"])
            if size <= 0 or size % GRANULARITY_BYTES or address % GRANULARITY_BYTES:
                raise ProtocolViolation(f"region {s['tag']}: size/address not 2 MiB multiples")
            layout[str(s["tag"])] = RegionRecord(
                str(s["tag"]), size, RegionKind(s["kind"]), address
            )
        self.recovery.wait()
        with self.ledger.allocation_lock(m.config.gpu), m.lock:
            if inst.mapped:
                raise WrongState(f"instance {inst.name} of {m.name} is already attached")
            same = set(layout) == set(inst.regions) and all(
                (r.size_bytes, r.kind) == (inst.regions[t].size_bytes, inst.regions[t].kind)
                for t, r in layout.items()
            )
            with self.table.lock:
                if not same:  # a new layout: the old host copies do not fit it
                    for r in inst.regions.values():
                        for f in (r.weights_file, r.kv_file):
                            if f is not None:
                                self.store.delete(f)
                    inst.regions = layout
                    inst.committed = False
                else:
                    for t, r in layout.items():
                        inst.regions[t].address = r.address
            restored = inst.committed
            kv_fd = self._kv_host_tier(m, inst)  # before any mapping: HostStoreFull refuses
            try:
                self._bring_in_attached(m, inst)
            except BaseException:
                if kv_fd is not None:
                    close_fd(kv_fd)
                raise
        regions = [
            {"tag": t, "restored": restored and r.kind is RegionKind.WEIGHTS}
            for t, r in inst.regions.items()
        ]
        body: dict[str, Any] = {
            "restored": restored,
            "regions": regions,
            "state": str(m.state),
            "fingerprint": inst.fingerprint if restored else "",
        }
        if kv_fd is None:
            return reply_to(message, m.epoch, body)
        body["kv_pool"] = {
            "offload_after_tokens": m.config.kv_offload_after_tokens,
            "host_bytes": m.config.kv_host_bytes,
            "fd": 0,
        }
        return reply_to(message, m.epoch, body, [kv_fd])  # the fd is closed once sent

    def _kv_host_tier(self, m: ModelRecord, inst: InstanceRecord) -> int | None:
        """A writable fd of the instance's KV host-tier file (made on first attach), or
        None when the model's policy has no host tier."""
        size = m.config.kv_host_bytes
        if m.config.kv_offload_after_tokens is None or size <= 0:
            return None
        f = inst.kv_host_file
        if f is not None and f.size_bytes != size:  # the policy changed its size
            self.store.delete(f)
            inst.kv_host_file = f = None
        if f is None:
            rel = self.store.relpath(m.config.gpu, m.name, inst.name, "kv-host-tier", "kvhost")
            f = self.store.commit(self.store.stage(m.config.gpu, rel, size))
            with self.table.lock:
                inst.kv_host_file = f
                self.table.persist()
        return self.store.open_writable(f)

    def _bring_in_attached(self, m: ModelRecord, inst: InstanceRecord) -> None:
        """Map (and restore) a newly attached instance, whatever the model's state."""
        if m.state is S.SWAPPED_OUT:
            self.swapper.swap_in_locked(m)
        elif m.state in (S.DROPPED, S.FAILED):
            self.swapper.reload_locked(m)
        elif m.state in (S.RESIDENT, S.LOADING):
            self.swapper.bring_in(m, [inst], track_states=False)
            m.last_used = time.monotonic()
            if m.state is S.LOADING and all(i.committed for i in m.live_instances()):
                self.table.set_state(m, S.RESIDENT, "restored from the host store")
            else:
                self.table.persist()
        else:
            raise WrongState(f"model {m.name} is {m.state}")

    def commit(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        """Save the instance's weight regions to the host store, once. `fingerprint` (what
        the client says the bytes are) is kept with them; `replace` saves again over a
        committed copy (the client found it stale and loaded afresh under in_use(), so no
        swap-out runs in between)."""
        fingerprint = message.body.get("fingerprint", "")
        if not isinstance(fingerprint, str) or len(fingerprint) > MAX_FINGERPRINT_CHARS:
            raise ProtocolViolation(
                f"commit: fingerprint must be a string of at most {MAX_FINGERPRINT_CHARS} chars"
            )
        replace = bool(message.body.get("replace", False))
        # The committer is inside in_use() (the runtime loaded the weights there), so a
        # swap-out that is draining the model waits for this very request: waiting for its
        # operation lock here would hold both until the drain timed out. Such a commit runs
        # beside the drain instead (the swap-out waits for it before it goes on, then gives
        # way); any other commit takes the lock, and a swap-out that finds it counted here
        # is refused before it drains (`Swapper.swap_out_locked`).
        with self.table.lock:
            if inst.committed and not replace:  # nothing to save: no swap-out gives way
                return reply_to(message, m.epoch, {"committed": True})
            joined = m.draining
            m.commits += 1
            if joined:
                m.joined_commits += 1
                m.commit_joined_drain = True
        try:
            self.checkpoint("commit.received")
            if joined:
                return self._commit(m, inst, message, fingerprint, replace)
            with m.lock:
                return self._commit(m, inst, message, fingerprint, replace)
        finally:
            with self.table.commits_done:
                m.commits -= 1
                if joined:
                    m.joined_commits -= 1
                self.table.commits_done.notify_all()

    def _commit(
        self,
        m: ModelRecord,
        inst: InstanceRecord,
        message: Message,
        fingerprint: str,
        replace: bool,
    ) -> Message:
        """The commit itself, under the model's operation lock or beside a drain that
        cannot end before it does."""
        if inst.committed and not replace:
            return reply_to(message, m.epoch, {"committed": True})
        if not inst.mapped or inst.peer is None:
            raise WrongState(f"instance {inst.name} of {m.name} is not attached")
        weights = [r for r in inst.regions.values() if r.kind is RegionKind.WEIGHTS]
        stagings = []
        try:
            for r in weights:
                rel = self.store.relpath(m.config.gpu, m.name, inst.name, r.tag, "weights")
                stagings.append((r, self.store.stage(m.config.gpu, rel, r.size_bytes)))
            if stagings:
                body = {
                    "regions": [
                        {"tag": r.tag, "fd": n, "bytes": r.size_bytes}
                        for n, (r, _) in enumerate(stagings)
                    ]
                }
                request(
                    self.transport,
                    inst,
                    Op.SAVE,
                    m.epoch,
                    body,
                    fds=[st.fd for _, st in stagings],
                    timeout_seconds=self.settings.client_timeout_seconds,
                )
        except BaseException:
            for _, st in stagings:
                self.store.abort(st)
            raise
        self.checkpoint("commit.saved")
        committed = [(r, self.store.commit_replacing(st, r.weights_file)) for r, st in stagings]
        self.checkpoint("commit.renamed")
        with self.table.lock:
            for r, stored in committed:
                r.weights_file = stored
            inst.committed = True
            inst.fingerprint = fingerprint
            if m.state is S.LOADING and all(i.committed for i in m.live_instances()):
                self.table.set_state(m, S.RESIDENT, "loaded; weights saved to the host store")
            else:
                self.table.persist()  # after the data: the state file names whole copies only
        return reply_to(message, m.epoch, {"committed": True})
