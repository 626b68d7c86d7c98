"""Recovery after an agent restart: load the state file, drop host-store files it does
not name, give clients a grace period to readopt their chunks, and settle each model's
state from what they readopted.

Until every instance readopted or the grace period ended, `wait` holds swap-ins,
swap-outs and attaches: before readopt the engine does not know which instances map
chunks. The waiter count has a lock of its own; everything else is under the table's.
"""

from __future__ import annotations

import logging
import threading
import time

from modelswap_api.wire import Message, RegionKind, reply_to
from modelswap_sidecar.engine.errors import EngineError
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, ModelRecord, RegionRecord, from_doc
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.table import ModelTable

log = logging.getLogger(__name__)
S = EngineState


class Recovery:
    def __init__(
        self,
        table: ModelTable,
        ledger: GpuLedger,
        swapper: Swapper,
        store: HostStore,
        settings: EngineSettings,
    ) -> None:
        self.table = table
        self.ledger = ledger
        self.swapper = swapper
        self.store = store
        self.grace_seconds = settings.readopt_grace_seconds
        self._recovered = threading.Event()
        self._recovered.set()
        self._waiters = 0
        self._waiters_lock = threading.Lock()

    # -- waiting it out ------------------------------------------------------------------

    def wait(self) -> None:
        """Block until every instance readopted or the grace period ended (no-op otherwise)."""
        if self._recovered.is_set():
            return
        with self._waiters_lock:
            self._waiters += 1
        try:
            self._recovered.wait(self.grace_seconds + 5)
        finally:
            with self._waiters_lock:
                self._waiters -= 1

    @property
    def recovering(self) -> bool:
        """After a restart, until every instance readopted or the grace period ended."""
        return not self._recovered.is_set()

    @property
    def waiters(self) -> int:
        """Operations (swap-in, swap-out, attach) held until recovery ends."""
        with self._waiters_lock:
            return self._waiters

    # -- the state file ------------------------------------------------------------------

    def recover(self) -> None:
        """Load the state file after a restart; clients then have a grace period to readopt."""
        doc = self.store.read_state()
        models = from_doc(doc) if doc is not None else {}
        named = {
            f.relpath
            for m in models.values()
            for i in m.instances.values()
            for f in [
                i.kv_host_file,
                *(x for r in i.regions.values() for x in (r.weights_file, r.kv_file)),
            ]
            if f is not None
        }
        for rel in self.store.remove_unnamed(named):
            log.info("host store: removed %s, which the state file does not name", rel)
        if doc is None:
            return
        awaiting = False
        for m in models.values():
            for inst in m.instances.values():
                for r in inst.regions.values():
                    if r.weights_file is not None and not self.store.adopt_existing(r.weights_file):
                        r.weights_file = None
                        inst.committed = False
                    if r.kv_file is not None and not self.store.adopt_existing(r.kv_file):
                        r.kv_file = None
                if inst.kv_host_file is not None and not self.store.adopt_existing(
                    inst.kv_host_file
                ):
                    inst.kv_host_file = None
                if inst.mapped:
                    inst.mapped = False
                    inst.awaiting_readopt = True
                    awaiting = True
        for m in [m for m in models.values() if m.state is S.DELETING]:
            # the agent died while removing it: finish (no client maps it any more, or
            # its clients are told when they readopt and find no model)
            self.swapper.discard_host_copies(m)
            for inst in m.instances.values():
                if inst.kv_host_file is not None:
                    self.store.delete(inst.kv_host_file)
            del models[m.name]
        with self.table.lock:
            self.table.replace_all(models)
            for m in models.values():
                if not any(i.awaiting_readopt for i in m.instances.values()):
                    self._resolve(m)
            self.table.persist()
        if awaiting:
            self._recovered.clear()
            t = threading.Thread(target=self._grace, name="readopt-grace", daemon=True)
            t.start()

    def _grace(self) -> None:
        deadline = time.monotonic() + self.grace_seconds
        while time.monotonic() < deadline and not self._recovered.is_set():
            self._recovered.wait(0.05)
        for m in self.table.records():
            with m.lock, self.table.lock:
                stale = [i for i in m.instances.values() if i.awaiting_readopt]
                for inst in stale:
                    inst.awaiting_readopt = False
                if stale:
                    self._resolve(m)
                    self.table.persist()
        self._recovered.set()

    def _resolve(self, m: ModelRecord) -> None:
        """Settle a model's state from what its clients readopted (recovery only)."""
        mapped = [i for i in m.instances.values() if i.mapped]
        unmapped_live = [i for i in m.live_instances() if not i.mapped]
        complete = bool(m.instances) and all(i.committed for i in m.instances.values())
        if not mapped and m.state in (S.DROPPED, S.FAILED):
            return  # nothing held either way; a swap-in reloads it
        if mapped:
            m.state = S.RESIDENT if all(i.committed for i in mapped) else S.LOADING
            if unmapped_live and m.state is S.RESIDENT:
                # the agent died between two instances' unmaps: finish that swap-out
                threading.Thread(target=self._finish_swap_out, args=(m.name,), daemon=True).start()
        else:
            m.state = S.SWAPPED_OUT if complete else S.LOADING
        m.reason = "recovered after an agent restart"

    def _finish_swap_out(self, name: str) -> None:
        try:
            self.wait()
            m = self.table.get(name)
            with m.lock:
                self.swapper.swap_out_locked(
                    m, "completing a swap-out interrupted by an agent restart"
                )
        except EngineError as e:
            log.warning("model %s: could not complete the interrupted swap-out: %s", name, e)

    # -- a client's readopt --------------------------------------------------------------

    def readopt(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        """Adopt the chunks a client still maps (it rolled back what the dead agent left
        unfinished first), and settle the model once its last instance readopted."""
        body = message.body
        try:
            with m.lock, self.table.lock:
                regions = {str(r["tag"]): r for r in body.get("regions", [])}
                for tag, rd in regions.items():
                    if tag not in inst.regions:
                        inst.regions[tag] = RegionRecord(
                            tag, int(rd["bytes"]), RegionKind(rd["kind"]), int(rd["address"])
                        )
                if body.get("state") in ("resident", "loading") and not inst.mapped:
                    for tag, rd in regions.items():
                        r = inst.regions[tag]
                        for c in rd.get("chunks", []):
                            fd = message.fds[int(c["fd"])]
                            r.chunks.append(self.ledger.adopt(m.config.gpu, fd, int(c["bytes"])))
                        if r.kv_file is not None:
                            self.store.delete(r.kv_file)
                            r.kv_file = None
                    inst.mapped = True
                inst.awaiting_readopt = False
                m.epoch = max(m.epoch, int(message.epoch)) + 1
                if not any(i.awaiting_readopt for i in m.instances.values()):
                    self._resolve(m)
                self.table.persist()
                if not any(
                    i.awaiting_readopt for mm in self.table.records() for i in mm.instances.values()
                ):
                    self._recovered.set()
                reply = {"state": str(m.state), "committed": inst.committed}
        finally:
            message.close_fds()
        return reply_to(message, m.epoch, reply)
