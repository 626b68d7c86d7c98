"""What the agent holds per model: the desired entry, its effective policy, where it was
placed, and where it stands in the runtime.

`serving` is the agent's own view (`model_states.Serving`: is the model loaded in Triton,
or why not), moved only by `lifecycle`; the engine keeps the memory states
(`EngineState`). A model that cannot attach to the client library (a non-python backend)
is served with `onSwapOut: drop` semantics: swap-out unloads it from Triton and swap-in
loads it again from its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modelswap_api.control import DesiredEntry
from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.agent.core.instances import RolloutNote, instance_key, model_generation_of
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.sources.resolver import ResolvedSource
from modelswap_sidecar.triton.naming import triton_model_name

UNSUPPORTED_RUNTIME = "UnsupportedRuntime"
#: The reason of a model the runtime serves and that attaches: where its bytes are after
#: that is the engine's to say (`reports.model_info`).
LOADED = "Loaded"
#: `runtime_backend` of a dev model (local mode's dev loop): a developer's own process
#: serves it, outside Triton.
DEV_RUNTIME = "dev"
#: The reason of a dev model once registered with the engine.
DEV_MODEL = "DevModel"


def user_name_of(entry: DesiredEntry) -> str:
    """The name users call the model: `spec.model.name`, else its metadata name. The
    gateway routes by it and every per-model metric's `model` label carries it."""
    return entry.spec.model.name or entry.name


def answers(model: AgentModel) -> bool:
    """The instance answers requests (after a swap-in if needed): desired and loaded in the
    runtime (or dropped, reloaded on the next request)."""
    return model.desired and model.serving in (Serving.LOADED, Serving.DROPPED)


@dataclass
class AgentModel:
    entry: DesiredEntry
    policy: EffectivePolicy
    serving: Serving = Serving.PENDING
    #: In the operator's current set (False once unloaded past the grace period).
    desired: bool = True
    gpu: int | None = None  # ordinal, once placed
    #: False for runtimes that cannot map memory through the client library.
    attaches: bool = True
    #: The Triton backend (or platform) of the loaded model's config.pbtxt.
    runtime_backend: str = "python"
    resolved: ResolvedSource | None = None
    reason: str = ""
    message: str = ""
    #: When the model last became resident (monotonic seconds), for minResident.
    resident_since_seconds: float | None = None
    #: Last request seen (monotonic seconds): Triton's `last_inference`, or a swap-in.
    last_request_seconds: float | None = None
    #: Gateway requests admitted and not yet answered (the policy spares a busy victim).
    active_requests: int = 0
    last_request_wall_seconds: float | None = None
    failed_at_seconds: float | None = None
    failed_generation: int | None = None
    #: Swaps recorded at the source (`Actuator._on_swap`), as counted in the metrics.
    swap_ins: int = 0
    swap_outs: int = 0
    #: Work on this record that raised unexpectedly, by what it was (`isolation`): while
    #: any is set the model is reported Failed with reason `AgentError`.
    faults: dict[str, str] = field(default_factory=dict)
    #: An entry of a later model generation of its ModelDeployment arrived: this instance
    #: serves until the new one answers, then is drained and released (`instances`).
    superseded: bool = False
    #: Set on every instance of a ModelDeployment while a changed model rolls out.
    rollout: RolloutNote | None = None
    #: Derived once from the UID and model generation, so a record that exists has them.
    _key: str = field(init=False, repr=False)
    _triton_name: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """ValueError for a UID that is not a UUID: such a record is never made, so no
        loop, report or route over the records can trip over it later."""
        self._key = instance_key(self.entry.uid, self.entry.model_generation)
        self._triton_name = triton_model_name(self._key)

    @property
    def uid(self) -> str:
        """The instance's key (`instances.instance_key`): what the records, the engine,
        Triton and the policy name it by; the ModelDeployment's own uid for model
        generation 1. Reports to the operator carry `deployment_uid`."""
        return self._key

    @property
    def deployment_uid(self) -> str:
        return self.entry.uid

    @property
    def model_generation(self) -> int:
        """The model generation this instance holds (fixed: a new one is a new record)."""
        return model_generation_of(self.entry.model_generation)

    @property
    def triton_name(self) -> str:
        return self._triton_name

    @property
    def weights_bytes(self) -> int:
        return self.entry.spec.model.weights_bytes.bytes

    @property
    def kv_cache_bytes(self) -> int:
        kv = self.entry.spec.model.kv_cache_bytes
        return kv.bytes if kv is not None else 0

    @property
    def hbm_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes

    @property
    def drops(self) -> bool:
        """Swap-out unloads the model from the runtime: a runtime that cannot attach gets
        `onSwapOut: drop` semantics. (A python-backend model with `onSwapOut: drop` stays
        loaded: the engine drops its memory and host copy, and it reloads from its source
        on the next request.)"""
        return not self.attaches

    @property
    def dev(self) -> bool:
        """A dev model (local mode's dev loop): not in Triton; a developer's process
        attaches as it, and comes and goes as that process does."""
        return self.runtime_backend == DEV_RUNTIME

    def request_arrived(
        self, at_wall_seconds: float, *, now_seconds: float, wall_now_seconds: float
    ) -> bool:
        """A request to the model was seen at `at_wall_seconds` (wall clock: the gateway's
        mark, or Triton's `last_inference`): the last-request marks move to it, never
        back (the gateway and Triton's statistics both tell; the later one wins). Its
        monotonic mark is `now_seconds` less how long ago that was. False: an earlier
        mark, nothing moved."""
        previous = self.last_request_wall_seconds
        if previous is not None and previous >= at_wall_seconds:
            return False
        self.last_request_wall_seconds = at_wall_seconds
        self.last_request_seconds = now_seconds - max(wall_now_seconds - at_wall_seconds, 0.0)
        return True

    def loaded_reason(self) -> tuple[str, str]:
        """(reason, message) once the runtime serves the model: a runtime that cannot
        attach is reported as such, since swaps reload it from its source."""
        if self.dev:
            return DEV_MODEL, (
                f"served by a developer's process outside Triton: it attaches as model "
                f"{self.triton_name!r} through the agent's socket (local mode, --dev)"
            )
        if self.attaches:
            return LOADED, ""
        return UNSUPPORTED_RUNTIME, (
            f"the {self.runtime_backend} backend cannot map modelswap memory: served with "
            "onSwapOut: drop semantics (swap-out unloads it, swap-in reloads it from "
            "spec.model.source)"
        )
