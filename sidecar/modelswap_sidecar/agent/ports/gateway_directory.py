"""The gateway's `ModelDirectory` over the agent: routes from the desired entries,
residency from the engine, swap-ins through the actuator, request times for the policy.

- `lookup`/`routes`: every desired model the agent holds (not unloaded), under the name
  users call it (`spec.model.name`, else metadata.name) in its namespace; `decoupled` read
  once per model directory from its config.pbtxt (`model_transaction_policy`). A name not
  routed is `ModelNotKnownYetError` (503 + Retry-After) while the agent may still be told
  of it (`core.knowledge`: no desired set yet, or a saved entry not taken back yet) or
  holds it desired without a route; `UnknownModelError` (404) otherwise.
- `knows_desired`: the agent was told its desired set, or read the one it saved.
- `is_resident`: a request is answered without a swap-in (`model_states.answers_now`):
  Triton serves it and, for a model that maps memory through the client library, the
  engine holds it RESIDENT (or LOADING once a dropped model's swap-in has mapped fresh
  memory: the next request reloads its weights).
- `ensure_resident`: waits while a reload or a drop-style swap-out holds the model
  (`Actuator.held`: it drains and unloads it; `is_resident` is False meanwhile, so new
  requests queue; a removal holds nothing: the model is not desired, so they get 404) and for a
  model still loading, then `Actuator.swap_in` (policy admission, victims swapped out
  first, the engine's swap-in or a reload after a drop).
  The gateway calls it once per cold period; the actuator's per-model lock serialises it
  with the policy loop and manual swaps. A refusal raises `SwapInFailedError` with the
  actuator's reason.
- `record_request`: the model's last-request times (monotonic and wall), which the policy
  loop's idle rule reads; `request_started`/`request_finished`: its requests in flight,
  which the policy reads too (a model with requests in flight is not a victim). The
  gateway records a request at its receipt and again at its answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.instances import ROLLOUT_INTERRUPTS
from modelswap_sidecar.agent.core.isolation import each_record
from modelswap_sidecar.agent.core.knowledge import DesiredKnowledge
from modelswap_sidecar.agent.core.records import AgentModel, user_name_of
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import (
    ModelNotKnownYetError,
    SwapInFailedError,
    UnknownModelError,
)
from modelswap_sidecar.gateway.routing import resolve
from modelswap_sidecar.model_states import Serving, answers_now
from modelswap_sidecar.triton.config import read_model_config
from modelswap_sidecar.triton.errors import ModelConfigInvalid

log = logging.getLogger(__name__)

#: Serving states a request can wait out; any other (pending, deferred, failed, unloaded)
#: is refused at once with the agent's reason.
_WAITABLE = (Serving.LOADING,)
_SWAPPABLE = (Serving.LOADED, Serving.DROPPED)


#: How soon a client may ask again for a model the agent may still be told of.
_KNOWN_SOON_SECONDS = 1


def _waitable(model: AgentModel) -> bool:
    """A load under way, or a rollout's new instance waiting for the old one's release (no
    room for both: requests wait for it as for a swap-in, within the gateway's queue
    bounds, until the note is cleared once it serves)."""
    if model.serving in _WAITABLE:
        return True
    rollout = model.rollout
    return (
        model.serving in (Serving.PENDING, Serving.DEFERRED)
        and rollout is not None
        and rollout.reason == ROLLOUT_INTERRUPTS
    )


def user_name(model: AgentModel) -> str:
    """The name users call the model: `spec.model.name`, else its metadata name."""
    return user_name_of(model.entry)


def is_decoupled(model_dir: Path) -> bool:
    """Triton's `model_transaction_policy { decoupled: true }` in the model's config.pbtxt."""
    try:
        config = read_model_config(model_dir)
    except ModelConfigInvalid:
        return False
    return bool(config.model_transaction_policy.decoupled)


class AgentDirectory:
    """`gateway.directory.ModelDirectory` over an `Actuator`'s records."""

    def __init__(
        self,
        actuator: Actuator,
        *,
        knowledge: DesiredKnowledge | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        load_wait_seconds: float = 600.0,
    ) -> None:
        self.actuator = actuator
        #: None: the agent is taken to know its desired set (tests that push it first)
        self.knowledge = knowledge
        self.clock = clock
        self.wall_clock = wall_clock
        self.load_wait_seconds = load_wait_seconds
        self._decoupled: dict[Path, bool] = {}

    # -- routes ------------------------------------------------------------------------------

    def _served(self) -> list[AgentModel]:
        """The desired models held, one instance per ModelDeployment: while a changed model
        rolls out, the old instance until the new one answers (`reports.reported`)."""
        return [
            m
            for m in reports.reported(list(self.actuator.records.values()))
            if m.desired and m.serving not in (Serving.UNLOADING, Serving.UNLOADED)
        ]

    def _decoupled_of(self, model: AgentModel) -> bool:
        if model.resolved is None:
            return False
        folder = model.resolved.model_dir
        if folder not in self._decoupled:
            self._decoupled[folder] = is_decoupled(folder)
        return self._decoupled[folder]

    def route_of(self, model: AgentModel) -> ModelRoute:
        return ModelRoute(
            uid=model.uid,
            namespace=model.entry.namespace,
            name=user_name(model),
            triton_name=model.triton_name,
            decoupled=self._decoupled_of(model),
            max_queued=model.policy.max_queued,
            queue_timeout_seconds=model.policy.queue_timeout.seconds,
            max_tokens=model.policy.max_tokens,
            max_prompt_bytes=model.policy.max_prompt_bytes,
            shaping_wait_seconds=model.policy.batch_shaping.max_wait_milliseconds / 1000,
            shaping_edges_bytes=model.policy.batch_shaping.prompt_bytes_edges,
        )

    def routes(self, namespace: str | None) -> Sequence[ModelRoute]:
        """Routes of the served models; a model whose route cannot be made is left out (its
        fault noted, `isolation`) and the others stay routable."""
        served = [m for m in self._served() if namespace is None or m.entry.namespace == namespace]
        return each_record(served, "route requests to", self.route_of)

    def _routes_named(self, name: str) -> Sequence[ModelRoute]:
        """The routes users call `name`: a request's lookup makes only those (every route of
        a node with many models cost ~6 us each per request)."""
        named = [m for m in self._served() if user_name(m) == name]
        return each_record(named, "route requests to", self.route_of)

    def knows_desired(self) -> bool:
        return self.knowledge is None or self.knowledge.told

    def lookup(self, name: str, namespace: str | None) -> ModelRoute:
        try:
            return resolve(self._routes_named(name), name, namespace)
        except UnknownModelError:
            awaited = self.knowledge is not None and self.knowledge.awaits(name, namespace)
            if not awaited and not self._held_unrouted(name, namespace):
                raise
        where = f"{namespace}/{name}" if namespace else name
        raise ModelNotKnownYetError(
            f"model {where} is not known yet: the node is still taking its desired models",
            retry_after_seconds=_KNOWN_SOON_SECONDS,
        )

    def _held_unrouted(self, name: str, namespace: str | None) -> bool:
        """A desired model of that name is held but has no route (its fault noted)."""
        return any(
            user_name(m) == name and namespace in (None, m.entry.namespace) for m in self._served()
        )

    # -- residency ---------------------------------------------------------------------------

    def _model(self, uid: str) -> AgentModel:
        model = self.actuator.records.get(uid)
        if model is None or not model.desired:
            raise UnknownModelError(f"model {uid} is no longer served on this node")
        return model

    def is_resident(self, uid: str) -> bool:
        model = self.actuator.records.get(uid)
        if model is None or model.serving is not Serving.LOADED:
            return False
        if self.actuator.held(uid):  # an unload drains it: new requests wait in its queue
            return False
        state = self.actuator.engine_state(model) if model.attaches else None
        return answers_now(model.serving, attaches=model.attaches, engine_state=state)

    def swap_state(self, uid: str) -> str:
        model = self.actuator.records.get(uid)
        if model is None:
            return "unknown"
        if (holding := self.actuator.hold_state(uid)) is not None:
            return holding
        if model.serving is not Serving.LOADED or not model.attaches:
            return str(model.serving)
        state = self.actuator.engine_state(model)
        return str(state) if state is not None else str(model.serving)

    async def ensure_resident(self, uid: str) -> None:
        model = self._model(uid)
        deadline = self.clock() + self.load_wait_seconds
        while True:
            await self._wait_reload(model, deadline)
            await self._wait_loaded(model)
            if self.is_resident(uid):
                return
            result = await self.actuator.swap_in(model)
            # a reload took the model while this swap-in waited for its lock: wait for it
            reloading = self.actuator.held(uid) or model.serving is Serving.LOADING
            if result.outcome != "refused" or not reloading or self.clock() >= deadline:
                break
        if result.outcome == "refused":
            message = result.message or result.reason
            raise SwapInFailedError(
                f"{model.entry.namespace}/{user_name(model)} could not be swapped in: "
                f"{result.reason}: {message}"
            )
        if not self.is_resident(uid):
            raise SwapInFailedError(
                f"{model.entry.namespace}/{user_name(model)} is {self.swap_state(uid)} "
                f"after its swap-in ({result.reason})"
            )
        log.debug("model %s resident for the gateway (%s)", uid, result.reason)

    async def _wait_reload(self, model: AgentModel, deadline: float) -> None:
        """Wait while a reload or a drop-style swap-out holds the model (it drains, then
        unloads it; a reload's load is under way when the hold ends, a dropped model is
        swapped in again after it)."""
        while self.actuator.held(model.uid) and self.clock() < deadline:
            await self.actuator.changed(deadline - self.clock())

    async def _wait_loaded(self, model: AgentModel) -> None:
        deadline = self.clock() + self.load_wait_seconds
        # loads finish in the actuator's own task, which signals `changed` when they end
        while _waitable(model) and self.clock() < deadline:
            await self.actuator.changed(deadline - self.clock())
        if model.serving not in _SWAPPABLE:
            detail = f": {model.reason} {model.message}".rstrip() if model.reason else ""
            raise SwapInFailedError(
                f"{model.entry.namespace}/{user_name(model)} is {model.serving}{detail}"
            )

    def record_request(self, uid: str, at_seconds: float) -> None:
        model = self.actuator.records.get(uid)
        if model is None:
            return
        model.request_arrived(
            at_seconds, now_seconds=self.clock(), wall_now_seconds=self.wall_clock()
        )

    def request_started(self, uid: str) -> None:
        model = self.actuator.records.get(uid)
        if model is not None:
            model.active_requests += 1

    def request_finished(self, uid: str) -> None:
        model = self.actuator.records.get(uid)
        if model is not None:
            model.active_requests = max(model.active_requests - 1, 0)
            # a swap-in waiting for an idle model looks again, and so does an unload's drain
            if not model.active_requests or self.actuator.draining(uid):
                self.actuator.notify()
