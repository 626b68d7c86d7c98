"""Taking back the models a previous agent held (from its desired file), once Triton is
ready.

A model Triton still serves is held as loading until its clients have readopted their
memory (the engine then counts live instances; no swap may touch it before), then as
loaded; any other is loaded again by the policy loop (restored from the host store when
the engine kept a copy).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from modelswap_api.control import DesiredEntry
from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.loops import RuntimeWatch
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.triton.driver import TritonDriver
from modelswap_sidecar.triton.errors import TritonError

log = logging.getLogger(__name__)

#: How often a model held as adopting is looked at while its clients readopt.
_LOOK_SECONDS = 0.05


async def adopt(
    actuator: Actuator,
    driver: TritonDriver,
    watch: RuntimeWatch,
    *,
    saved_entries: Callable[[], Sequence[DesiredEntry]],
    policy_of: Callable[[DesiredEntry], EffectivePolicy],
) -> int:
    """The number of models adopted with their clients. `saved_entries` reads the desired
    file when Triton is first ready (an operator's push may have rewritten it by then);
    `policy_of` is the entry's effective policy (raises for one this agent cannot hold)."""
    await watch.first_ready.wait()
    try:
        index = await driver.repository_index()
    except TritonError as e:
        log.warning("cannot read Triton's repository index to adopt models: %s", e)
        index = {}
    engine = actuator.engine
    adopted: list[AgentModel] = []
    #: the instance of each uid the operator pushed before adoption ran: the current one
    pushed_first = {m.deployment_uid: m for m in actuator.records.values() if not m.superseded}
    for entry in saved_entries():
        try:  # a saved entry this agent cannot hold (an older agent took it) stays out
            model = AgentModel(entry=entry, policy=policy_of(entry))
        except Exception as e:
            log.warning("not adopting %s: %s", entry.uid, e)
            continue
        if model.uid in actuator.records:
            continue  # the operator pushed it first
        # Several instances of a uid were saved mid-rollout, the older ones first: each
        # earlier one (and any beside an instance the operator pushed first) serves on as
        # superseded until the backend's next take of the current one releases it.
        for held in actuator.records.values():
            if held.deployment_uid == entry.uid:
                held.superseded = held.superseded or pushed_first.get(entry.uid) is not held
        model.superseded = entry.uid in pushed_first
        try:
            model.gpu = engine.gpu_of(model.triton_name)
        except UnknownModel:
            model.gpu = None
        served = index.get(model.triton_name)
        readopts = served is not None and served.state == "READY" and model.gpu is not None
        if model.superseded and not readopts:
            log.info("not taking back %s: replaced, and Triton no longer serves it", model.uid)
            continue
        if readopts:
            model.serving = Serving.LOADING
            model.reason, model.message = "Adopting", "waiting for its clients to readopt"
            adopted.append(model)
        actuator.records[model.uid] = model  # keyed by instance (`instances`)
    if adopted:
        log.info("adopting %d model(s) held before this agent started", len(adopted))
    deadline = time.monotonic() + engine.readopt_grace_seconds + 5.0
    waiting = list(adopted)
    while waiting:
        for model in list(waiting):
            if _instances(actuator, model) > 0:
                model.serving = Serving.LOADED
                model.resident_since_seconds = time.monotonic()
                model.reason, model.message = "Adopted", ""
                waiting.remove(model)
                actuator.notify()
        if not waiting or time.monotonic() > deadline:
            break
        await asyncio.sleep(_LOOK_SECONDS)
    for model in waiting:  # no client came back: load it again (restored from the store)
        log.warning("model %s: no client readopted it; loading it again", model.uid)
        model.serving = Serving.PENDING
    actuator.notify()
    return len(adopted) - len(waiting)


def _instances(actuator: Actuator, model: AgentModel) -> int:
    """Live instances of `model` the engine counts (0: none, or no record)."""
    if not model.attaches:
        return 0
    try:
        return actuator.engine.status(model.triton_name).instances
    except UnknownModel:
        return 0
