"""Client heartbeats: each one recorded (and its process's overhead measured again), and
a watcher thread that logs clients whose heartbeats stopped. Nothing else happens to a
silent client: a closed socket, not a silent one, is a dead client."""

from __future__ import annotations

import logging
import threading
import time

from modelswap_api.wire import Message, reply_to
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, ModelRecord
from modelswap_sidecar.engine.table import ModelTable

log = logging.getLogger(__name__)


class Heartbeats:
    def __init__(self, table: ModelTable, ledger: GpuLedger, timeout_seconds: float) -> None:
        self.table = table
        self.ledger = ledger
        self.timeout_seconds = timeout_seconds
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="engine-heartbeats", daemon=True)

    def start(self) -> None:
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(timeout=5)

    def beat(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        """Record the client's heartbeat and refresh its process's overhead measurement
        (a CUDA context appears after the process registered)."""
        if inst.heartbeat_late:
            log.info("model %s instance %s (pid %d): heartbeats again", m.name, inst.name, inst.pid)
        inst.last_heartbeat = time.monotonic()
        inst.heartbeat_late = False
        self.ledger.remeasure(m.config.gpu, inst.pid)
        return reply_to(message, m.epoch)

    def _watch(self) -> None:
        timeout = self.timeout_seconds
        while not self._stop.wait(min(max(timeout / 4, 0.05), 5.0)):
            now = time.monotonic()
            with self.table.lock:
                late = [
                    (m, i)
                    for m in self.table.records()
                    for i in m.instances.values()
                    if i.live
                    and i.last_heartbeat is not None
                    and not i.heartbeat_late
                    and now - i.last_heartbeat > timeout
                ]
                for _, i in late:
                    i.heartbeat_late = True
            for m, i in late:
                log.warning(
                    "model %s instance %s (pid %d): no heartbeat for %.1f s",
                    m.name,
                    i.name,
                    i.pid,
                    now - (i.last_heartbeat or now),
                )
