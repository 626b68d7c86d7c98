"""Model processes that answer nothing (issue 26, item 6): ended, then loaded again.

The engine reports a connected client that sent no heartbeat for
`policy.unresponsiveAfterSeconds` (`Engine.on_unresponsive`, from its heartbeat watcher).
The client library sends heartbeats from a thread of its own every 5 s, also while the
process serves a long request (`in_use()` held: what a swap-out's drain waits for, bounded
by `policy.drainTimeoutSeconds`), so a silent one answers nothing at all: stopped
(SIGSTOP), or wedged. Left alone it holds its memory, and every swap-out that would free
it waits out the drain and rolls back, so each swap-in that needs its room fails for as
long as it stays so.

The agent ends it with SIGKILL, through the runtime driver (`TritonVoucher.kill`: only a
stub of that model under the current Triton, checked through a pidfd). Nothing else is
released here: its memory is released when its socket closes, which the kernel does only
after the process's mappings are gone, so a stopped process's memory is never handed to
another model while it could resume. From there it is a model whose process died: a
swap-out waiting on it goes on without it (its chunks released), and the policy loop loads
the model again (`Actuator.reload_gone`, reason `ProcessUnresponsive`), its new stub
restored from the host copy.

No bytes are lost by it. A committed instance's weights are whole in the host store (the
host copy is written once and only read after). An instance that never committed (its
weights were being loaded, or were being saved when it stopped) holds only what the
model's source holds: the reload reads the source again and commits then, as after any
crash. Its KV in HBM is lost as in any crash (a stopped process cannot save it). A process
the driver does not vouch for (local mode's dev-loop process, which may hold bytes nowhere
else) is never killed: it is logged and keeps its memory until its socket closes.

Where the agent runs under another uid than the runtime and holds no CAP_KILL (the chart's
node pod), the kill is refused: the agent then asks Triton, which owns its stubs, to unload
the model (Triton's Python backend kills a stub that does not answer its health check; one
that holds a request in flight waits for it) and the same path follows once it is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.engine.heartbeats import Unresponsive
from modelswap_sidecar.triton.errors import TritonError
from modelswap_sidecar.triton.stubs import KillOutcome, process_state

log = logging.getLogger(__name__)

Kill = Callable[[int, str], KillOutcome]


class UnresponsiveRuntimes:
    def __init__(self, actuator: Actuator, kill: Kill) -> None:
        """`kill(pid, engine model name)`: the runtime driver's (`TritonVoucher.kill`)."""
        self.actuator = actuator
        self.kill = kill
        self._loop: asyncio.AbstractEventLoop | None = None
        #: every outcome, in order (model, pid, outcome): what the tests and logs read
        self.outcomes: list[tuple[str, int, KillOutcome]] = []

    def listen(self) -> None:
        """Take the engine's reports (call once, from the agent's event loop)."""
        self._loop = asyncio.get_running_loop()
        self.actuator.engine.on_unresponsive(self.on_unresponsive)

    def on_unresponsive(self, client: Unresponsive) -> KillOutcome:
        """On the engine's heartbeat watcher thread: end the process, or say why not."""
        # a copy taken at once (the loop may add or drop records meanwhile)
        records = list(self.actuator.records.values())
        model = next((m for m in records if m.triton_name == client.model), None)
        what = (
            f"model {model.uid if model else client.model} instance {client.instance} "
            f"(pid {client.pid}, process state {process_state(client.pid) or '?'})"
        )
        if model is not None and model.dev:
            outcome = KillOutcome.NOT_A_STUB  # the developer's own process: never ours to end
        else:
            outcome = self.kill(client.pid, client.model)
        self.outcomes.append((client.model, client.pid, outcome))
        silent = f"no heartbeat for {client.silent_seconds:.1f} s"
        if outcome is KillOutcome.KILLED:
            kept = (
                "its weights are whole in the host store"
                if client.committed
                else "it had not committed its weights: they are loaded from the source again"
            )
            log.warning("%s answered nothing (%s): killed; %s", what, silent, kept)
            self._note(model, client, f"{silent}, past policy.unresponsiveAfterSeconds: killed")
        elif outcome is KillOutcome.NOT_PERMITTED and model is not None:
            log.warning(
                "%s answered nothing (%s); the agent may not signal it (another uid): asking "
                "Triton to unload the model",
                what,
                silent,
            )
            self._note(model, client, f"{silent}: unloaded from Triton to end it")
            self._on_loop(
                lambda: self.actuator.spawn(self._unload(model), f"unload-frozen-{model.uid}")
            )
        elif outcome is KillOutcome.GONE:
            log.info("%s answered nothing (%s) and is gone already", what, silent)
        else:
            log.error(
                "%s answered nothing (%s) and was not killed: not a runtime process the "
                "agent may end (a dev-loop process, or no longer that model's stub); its "
                "memory stays held until its connection closes",
                what,
                silent,
            )
        return outcome

    def _note(self, model: AgentModel | None, client: Unresponsive, what: str) -> None:
        """Say why when the model is loaded again (`Actuator.reload_gone`)."""
        if model is None:
            return
        note = f"its runtime process (pid {client.pid}) answered nothing ({what})"
        self._on_loop(lambda: self.actuator.ended_runtimes.__setitem__(model.uid, note))

    def _on_loop(self, call: Callable[[], object]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(call)

    async def _unload(self, model: AgentModel) -> None:
        """Triton ends its stubs on unload; its sockets closing then make the model one
        whose processes died (`Actuator.reload_gone` loads it again)."""
        async with self.actuator.lock_of(model.uid):
            try:
                await self.actuator.loader.unload_dead(model)
            except TritonError as e:
                log.warning("model %s: unloading it to end its frozen process: %s", model.uid, e)
