"""Client heartbeats: each one recorded (and its process's overhead measured again), and
a watcher thread that logs clients whose heartbeats stopped and reports the ones silent
past `unresponsive_after_seconds` to the engine's owner (`Engine.on_unresponsive`).

The client library sends heartbeats from a thread of its own, beside the work it serves:
a process busy with a long request (its `in_use()` held, which a swap-out's drain waits
for) still sends them; a process that sends none for that long answers nothing at all
(stopped with SIGSTOP, or wedged). The engine itself never acts on silence: a closed
socket, not a silent one, is a dead client. Its owner (the agent) decides, and may end
the process (the runtime driver vouches for what it may end); its socket closing then
releases its memory as for any dead client (`ClientProtocol.client_gone`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from modelswap_api.wire import Message, reply_to
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, ModelRecord
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.table import ModelTable

log = logging.getLogger(__name__)

#: how often the watcher looks at most (it looks more often for short timeouts)
_MAX_WATCH_PERIOD_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Unresponsive:
    """A connected client that sent no heartbeat for `silent_seconds`."""

    model: str  # the engine's model name
    instance: str
    pid: int
    silent_seconds: float
    #: its weights are whole in the host store (the model is restored from there after it
    #: is ended); False: they exist only in its memory and in the model's source
    committed: bool
    state: EngineState


UnresponsiveListener = Callable[[Unresponsive], object]


class Heartbeats:
    def __init__(
        self,
        table: ModelTable,
        ledger: GpuLedger,
        timeout_seconds: float,
        unresponsive_after_seconds: float = 0.0,
    ) -> None:
        """`timeout_seconds`: a silent client is logged; `unresponsive_after_seconds`
        (0: never): it is reported to the listener (`on_unresponsive`), once per silence."""
        self.table = table
        self.ledger = ledger
        self.timeout_seconds = timeout_seconds
        self.unresponsive_after_seconds = unresponsive_after_seconds
        self._listener: UnresponsiveListener | None = None
        #: id(instance) -> the last_heartbeat value its current silence was reported at
        self._reported: dict[int, float] = {}
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="engine-heartbeats", daemon=True)

    def start(self) -> None:
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(timeout=5)

    def on_unresponsive(self, listener: UnresponsiveListener) -> None:
        """Call `listener` (on the watcher's thread) for each client silent past
        `unresponsive_after_seconds`, once per silence."""
        self._listener = listener

    def beat(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        """Record the client's heartbeat and refresh its process's overhead measurement
        (a CUDA context appears after the process registered)."""
        if inst.heartbeat_late:
            log.info("model %s instance %s (pid %d): heartbeats again", m.name, inst.name, inst.pid)
        inst.last_heartbeat = time.monotonic()
        inst.heartbeat_late = False
        self.ledger.remeasure(m.config.gpu, inst.pid)
        return reply_to(message, m.epoch)

    def period_seconds(self) -> float:
        """How often the watcher looks: a quarter of the shortest deadline it keeps."""
        deadlines = [self.timeout_seconds]
        if self.unresponsive_after_seconds > 0:
            deadlines.append(self.unresponsive_after_seconds)
        return min(max(min(deadlines) / 4, 0.05), _MAX_WATCH_PERIOD_SECONDS)

    def _watch(self) -> None:
        while not self._stop.wait(self.period_seconds()):
            self.check(time.monotonic())

    def check(self, now: float) -> list[Unresponsive]:
        """One look at every connected client (the watcher's, at `now`): log the late
        ones, report the unresponsive ones (silent since their last heartbeat, or since
        they registered when they sent none yet: a client that sends no heartbeats at all
        is reported too); those reported."""
        late: list[tuple[ModelRecord, InstanceRecord]] = []
        unresponsive: list[Unresponsive] = []
        with self.table.lock:
            seen: set[int] = set()
            for m in self.table.records():
                for i in m.instances.values():
                    # silent since its last heartbeat, or since it registered (a process
                    # stopped before its first heartbeat answers nothing either)
                    heard = i.last_heartbeat if i.last_heartbeat is not None else i.registered_at
                    if not i.live or heard is None:
                        continue
                    seen.add(id(i))
                    silent = now - heard
                    if (
                        i.last_heartbeat is not None
                        and not i.heartbeat_late
                        and silent > self.timeout_seconds
                    ):
                        i.heartbeat_late = True
                        late.append((m, i))
                    if (
                        0 < self.unresponsive_after_seconds < silent
                        and self._reported.get(id(i)) != heard
                    ):
                        self._reported[id(i)] = heard
                        unresponsive.append(
                            Unresponsive(m.name, i.name, i.pid, silent, i.committed, m.state)
                        )
            for key in set(self._reported) - seen:  # gone, or never beat again: forget it
                del self._reported[key]
        for m, i in late:
            log.warning(
                "model %s instance %s (pid %d): no heartbeat for %.1f s",
                m.name,
                i.name,
                i.pid,
                now - (i.last_heartbeat or now),
            )
        listener = self._listener
        for u in unresponsive:
            log.warning(
                "model %s instance %s (pid %d, %s): no heartbeat for %.1f s, past "
                "unresponsive_after_seconds (%g): it answers nothing",
                u.model,
                u.instance,
                u.pid,
                u.state,
                u.silent_seconds,
                self.unresponsive_after_seconds,
            )
            if listener is not None:
                try:
                    listener(u)
                except Exception:
                    log.exception("the unresponsive-client listener failed for %s", u.model)
        return unresponsive
