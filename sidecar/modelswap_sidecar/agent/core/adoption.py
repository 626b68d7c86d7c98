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
from modelswap_sidecar.agent.core import lifecycle
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.instances import instance_key
from modelswap_sidecar.agent.core.loops import RuntimeWatch
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.triton.driver import TritonDriver
from modelswap_sidecar.triton.errors import TritonError
from modelswap_sidecar.triton.naming import triton_model_name

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
    `policy_of` is the entry's effective policy (raises for one this agent cannot hold).
    However it ends, the actuator is told (`Actuator.adoption_ended`): a client's swap-in
    of a name no record holds waits for that, then is refused."""
    try:
        return await _adopt(actuator, driver, watch, saved_entries, policy_of)
    finally:
        actuator.adoption_ended()


async def _adopt(
    actuator: Actuator,
    driver: TritonDriver,
    watch: RuntimeWatch,
    saved_entries: Callable[[], Sequence[DesiredEntry]],
    policy_of: Callable[[DesiredEntry], EffectivePolicy],
) -> int:
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
            policy = policy_of(entry)
            key = instance_key(entry.uid, entry.model_generation)
            name = triton_model_name(key)
        except Exception as e:
            log.warning("not adopting %s: %s", entry.uid, e)
            continue
        if key in actuator.records:
            continue  # the operator pushed it first
        # Several instances of a uid were saved mid-rollout, the older ones first: each
        # earlier one (and any beside an instance the operator pushed first) serves on as
        # superseded until the backend's next take of the current one releases it.
        for held in actuator.records.values():
            if held.deployment_uid == entry.uid:
                held.superseded = held.superseded or pushed_first.get(entry.uid) is not held
        superseded = entry.uid in pushed_first
        try:
            gpu: int | None = engine.gpu_of(name)
        except UnknownModel:
            gpu = None
        served = index.get(name)
        readopts = served is not None and served.state == "READY" and gpu is not None
        if superseded and not readopts:
            log.info("not taking back %s: replaced, and Triton no longer serves it", key)
            continue
        model = lifecycle.hold(actuator.records, entry, policy)  # keyed by instance
        model.superseded, model.gpu = superseded, gpu
        if readopts:
            lifecycle.adopting(model)
            adopted.append(model)
    if adopted:
        log.info("adopting %d model(s) held before this agent started", len(adopted))
    deadline = time.monotonic() + engine.readopt_grace_seconds + 5.0
    waiting = list(adopted)
    while waiting:
        for model in list(waiting):
            if model.serving is not Serving.LOADING:  # unloaded meanwhile: not ours to move
                waiting.remove(model)
            elif _instances(actuator, model) > 0:
                lifecycle.adopted(model, time.monotonic())
                waiting.remove(model)
                actuator.notify()
        if not waiting or time.monotonic() > deadline:
            break
        await asyncio.sleep(_LOOK_SECONDS)
    for model in waiting:  # no client came back: load it again (restored from the store)
        log.warning("model %s: no client readopted it; loading it again", model.uid)
        lifecycle.pending(model)
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
