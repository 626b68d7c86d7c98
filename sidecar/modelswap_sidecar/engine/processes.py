"""Per-process overhead (charged once per runtime process, measured by the allocator)
and client heartbeats."""

from __future__ import annotations

import logging
import time

from modelswap_api.wire import Message, reply_to
from modelswap_sidecar.allocators.base import Location
from modelswap_sidecar.engine.records import InstanceRecord, ModelRecord
from modelswap_sidecar.engine.registry import Registry

log = logging.getLogger(__name__)


class Processes(Registry):
    """The runtime processes behind the instances: their overhead and heartbeats."""

    def _pid_in_use(self, gpu: int, pid: int, ignore: list[InstanceRecord]) -> bool:
        """Whether another live instance on `gpu` runs in process `pid` (overhead is per
        process, however many instances it serves)."""
        with self._mut:
            return any(
                i.live and i.pid == pid and all(i is not x for x in ignore)
                for m in self._models.values()
                if m.config.gpu == gpu
                for i in m.instances.values()
            )

    def _detach_process(self, gpu: int, pid: int, ignore: list[InstanceRecord]) -> None:
        if not self._pid_in_use(gpu, pid, ignore):
            self.budgets[gpu].process_detached(pid)

    def _measure(self, gpu: int, pid: int) -> int | None:
        """The allocator's measurement of `pid`'s overhead on `gpu` (None: not measured)."""
        with self._mut:
            mapped = sum(
                i.chunk_bytes()
                for m in self._models.values()
                if m.config.gpu == gpu
                for i in m.instances.values()
                if i.live and i.pid == pid
            )
        try:
            measured = self.allocator.process_overhead_bytes(
                Location.device(gpu), [pid], {pid: mapped}
            )
        except Exception as e:  # a measurement never breaks registration
            log.warning("GPU %d: measuring pid %d's overhead failed: %s", gpu, pid, e)
            return None
        return measured.get(pid)

    def _heartbeat(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        """Record the client's heartbeat and refresh its process's overhead measurement
        (a CUDA context appears after the process registered)."""
        if inst.heartbeat_late:
            log.info("model %s instance %s (pid %d): heartbeats again", m.name, inst.name, inst.pid)
        inst.last_heartbeat = time.monotonic()
        inst.heartbeat_late = False
        self.budgets[m.config.gpu].set_measured(inst.pid, self._measure(m.config.gpu, inst.pid))
        return reply_to(message, m.epoch)

    def _watch_heartbeats(self) -> None:
        """Log clients whose heartbeats stopped; nothing else (a closed socket, not a
        silent one, is a dead client)."""
        timeout = self.settings.heartbeat_timeout_seconds
        while not self._stop.wait(min(max(timeout / 4, 0.05), 5.0)):
            now = time.monotonic()
            with self._mut:
                late = [
                    (m, i)
                    for m in self._models.values()
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
