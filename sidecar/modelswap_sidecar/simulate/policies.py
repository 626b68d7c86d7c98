"""What each simulated policy decides, and what its swaps cost.

- `modelswap` (default and tuned): the agent's own policy, `modelswap_sidecar.policy`
  (`admit` for a request to a swapped-out model, `plan_swap_outs` for idle and pressure
  swap-outs), fed a `NodeView` of one GPU built from the simulator's state. Swap-ins copy
  the weights (and a preserved KV cache) over the GPU's host→device link; swap-outs unmap
  (weights stay clean in the host store) and copy only a preserved KV cache back;
  `onSwapOut: drop` models come back by a cold load.
- Baselines, calibrated from published behaviour, never tuned against modelswap:
  `dedicated` (one GPU per model, always resident); `keepalive` (Ollama: a model unloads
  after `idleAfterSeconds`, default 300, of idleness; a request for an unloaded model loads
  it cold, unloading the least recently used idle models when it does not fit, else
  waiting for one to become idle); `lru` (ModelMesh: the same without the timer); and
  `sleepwake` (vLLM level-1 sleep: the same LRU choice, but a sleeping model's weights are
  copied to host memory and woken one allocation at a time at `bytesPerSecond`, default
  15 GB/s, plus `wakeFixedSeconds`).

Models that unload to cold storage (keepalive, lru) leave no process behind, so their
per-process overhead is charged only while loaded; the others keep their process (and its
CUDA context) while out, so it comes off the GPU's budget as in the agent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from modelswap_sidecar.policy.admission import admit
from modelswap_sidecar.policy.decisions import AdmissionOutcome
from modelswap_sidecar.policy.inputs import (
    GpuView,
    ModelView,
    NodeView,
    PolicySettings,
    Residency,
)
from modelswap_sidecar.policy.swapouts import plan_swap_outs
from modelswap_sidecar.simulate.gpu import GpuShape
from modelswap_sidecar.simulate.state import INFINITY, GpuState, ModelState

Outcome = Literal["admit", "wait", "refuse"]
Link = Literal["h2d", "d2h", "cold", "none"]

_RESIDENT = Residency.RESIDENT
_OUT = Residency.SWAPPED_OUT
_LEAVING = Residency.SWAPPING_OUT


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reason: str
    victims: tuple[ModelState, ...] = ()
    #: a wait: ask again at this time even if nothing on the GPU changes before then
    ask_again_at: float = INFINITY


@dataclass(frozen=True, slots=True)
class Transfer:
    """A swap's cost: `fixed_seconds` off the link, then `bytes` over `link` (FIFO per GPU
    and direction) at `bytes_per_second`."""

    fixed_seconds: float
    bytes: int
    bytes_per_second: float
    link: Link


class SimPolicy:
    """The interface the engine calls. Subclasses decide; the engine keeps the state."""

    name: str
    kind: str
    #: one model per GPU (the GPU count is the catalogue's size)
    dedicated = False
    #: a swapped-out model keeps a warm copy (host memory): False means it goes cold
    keeps_host_copy = True
    #: one admission at a time per GPU, held until its swap-in is done (victims' swap-outs
    #: included), the next one asked only then: the agent's `Actuator._admission_lock`
    serial_admissions = False

    def __init__(self, name: str, shape: GpuShape) -> None:
        self.name = name
        self.shape = shape

    def budget_bytes(self, hosted_models: int) -> int:
        """HBM for models on a GPU hosting `hosted_models` models (overheads taken off)."""
        return self.shape.budget_bytes(hosted_models)

    def loaded_overhead_bytes(self) -> int:
        """Bytes charged per loaded model beside its own (a process that exists only
        while the model is loaded)."""
        return 0

    def admit(self, gpu: GpuState, model: ModelState, now: float) -> Decision:
        raise NotImplementedError

    def swap_outs(self, gpu: GpuState, now: float) -> tuple[ModelState, ...]:
        """Models to swap out now (idle or pressure); none by default."""
        return ()

    def idle_deadline(self, gpu: GpuState, model: ModelState, now: float) -> float:
        """When `swap_outs` may next want `model` out (INFINITY: not by itself)."""
        return INFINITY

    def swap_in(self, model: ModelState) -> Transfer:
        return self.cold_load(model)

    def swap_out(self, model: ModelState) -> Transfer:
        return Transfer(self.shape.swap_out_fixed_seconds, 0, 1.0, "none")

    def leaves_cold(self, model: ModelState) -> bool:
        """Whether a swapped-out `model` must be loaded cold to come back."""
        return not self.keeps_host_copy

    def cold_load(self, model: ModelState) -> Transfer:
        shape = self.shape
        return Transfer(
            shape.cold_start_seconds, model.weights_bytes, shape.cold_load_bytes_per_second, "cold"
        )


class Modelswap(SimPolicy):
    """The agent's policy module over one GPU's view."""

    kind = "modelswap"
    # the agent admits and swaps in one model per GPU at a time (a second admission before
    # the first one's bytes are charged would be granted the same room or the same victim)
    serial_admissions = True

    def __init__(self, name: str, shape: GpuShape, settings: PolicySettings) -> None:
        super().__init__(name, shape)
        self.settings = settings

    def view(self, gpu: GpuState) -> NodeView:
        gpu_view = GpuView(
            gpu=gpu.id,
            budget_bytes=max(gpu.budget_bytes, 0),
            host_to_device_bytes_per_second=self.shape.host_to_device_bytes_per_second,
        )
        models = tuple(
            ModelView(
                uid=m.name,
                gpu=gpu.id,
                weights_bytes=m.weights_bytes,
                kv_cache_bytes=m.kv_cache_bytes,
                residency=m.residency,
                policy=m.policy,
                resident_since_seconds=m.resident_since,
                last_request_seconds=m.last_request,
                active_requests=m.running + m.queued,
            )
            for m in gpu.models
        )
        return NodeView(gpus=(gpu_view,), models=models)

    def admit(self, gpu: GpuState, model: ModelState, now: float) -> Decision:
        asked_at = model.asked_at if model.asked_at is not None else now
        answer = admit(
            self.view(gpu), model.name, now, self.settings, waited_seconds=now - asked_at
        )
        if answer.outcome is AdmissionOutcome.WAIT:
            # at the end of the busy-victim wait the answer changes with nothing else
            # happening on the GPU
            give_up_at = asked_at + self.settings.busy_victim_wait_seconds
            again = give_up_at if give_up_at > now else INFINITY
            return Decision("wait", answer.reason, ask_again_at=again)
        if answer.outcome is AdmissionOutcome.REFUSE:
            return Decision("refuse", answer.reason)
        by_name = {m.name: m for m in gpu.models}
        return Decision("admit", answer.reason, tuple(by_name[v.uid] for v in answer.victims))

    def swap_outs(self, gpu: GpuState, now: float) -> tuple[ModelState, ...]:
        decisions = plan_swap_outs(self.view(gpu), now, self.settings)
        by_name = {m.name: m for m in gpu.models}
        out = tuple(by_name[d.uid] for d in decisions)
        going = {m.name for m in out}
        left = sum(
            m.hbm_bytes
            for m in gpu.models
            if m.residency is not _OUT and m.residency is not _LEAVING and m.name not in going
        )
        high = math.floor(max(gpu.budget_bytes, 0) * self.settings.high_watermark_fraction)
        gpu.over_high = left > high
        return out

    def idle_deadline(self, gpu: GpuState, model: ModelState, now: float) -> float:
        if model.residency is not _RESIDENT or model.policy.pinned or model.running + model.queued:
            return INFINITY
        since = model.resident_since if model.resident_since is not None else now
        young_until = since + (model.policy.min_resident.seconds or 0.0)
        if gpu.over_high:  # pressure takes any idle model once it is no longer young
            return max(young_until, now)
        idle_after = model.policy.idle_after.seconds
        if idle_after is None:
            return INFINITY
        last = model.last_request if model.last_request is not None else since
        return max(young_until, max(last, since) + idle_after)

    def swap_in(self, model: ModelState) -> Transfer:
        if model.cold:
            return self.cold_load(model)
        restored = model.weights_bytes + (
            model.kv_cache_bytes if model.policy.kv == "preserve" else 0
        )
        return Transfer(
            self.shape.swap_in_fixed_seconds,
            restored,
            self.shape.host_to_device_bytes_per_second,
            "h2d",
        )

    def swap_out(self, model: ModelState) -> Transfer:
        saved = model.kv_cache_bytes if model.policy.kv == "preserve" else 0
        if model.policy.on_swap_out == "drop" or not saved:
            return Transfer(self.shape.swap_out_fixed_seconds, 0, 1.0, "none")
        return Transfer(
            self.shape.swap_out_fixed_seconds,
            saved,
            self.shape.device_to_host_bytes_per_second,
            "d2h",
        )

    def leaves_cold(self, model: ModelState) -> bool:
        return model.policy.on_swap_out == "drop"


class Dedicated(SimPolicy):
    """One GPU per model, loaded before the trace starts and never swapped."""

    kind = "dedicated"
    dedicated = True

    def admit(self, gpu: GpuState, model: ModelState, now: float) -> Decision:
        return Decision("admit", "Fits")


class LeastRecentlyUsed(SimPolicy):
    """Unload (or sleep) least recently used idle models when a loading one does not fit;
    wait for one to become idle when none is; optionally unload after an idle timeout."""

    def __init__(
        self,
        name: str,
        shape: GpuShape,
        *,
        kind: str,
        idle_after_seconds: float | None = None,
        warm_bytes_per_second: float | None = None,
        wake_fixed_seconds: float = 0.0,
    ) -> None:
        super().__init__(name, shape)
        self.kind = kind
        self.idle_after_seconds = idle_after_seconds
        #: sleep/wake: the weights go to host memory and back at this rate (one allocation
        #: at a time); None: they are unloaded to cold storage
        self.warm_bytes_per_second = warm_bytes_per_second
        self.wake_fixed_seconds = wake_fixed_seconds
        self.keeps_host_copy = warm_bytes_per_second is not None

    def budget_bytes(self, hosted_models: int) -> int:
        return self.shape.budget_bytes(hosted_models if self.keeps_host_copy else 0)

    def loaded_overhead_bytes(self) -> int:
        return 0 if self.keeps_host_copy else self.shape.per_process_overhead_bytes

    def admit(self, gpu: GpuState, model: ModelState, now: float) -> Decision:
        overhead = self.loaded_overhead_bytes()
        need = model.hbm_bytes + overhead
        if need > gpu.budget_bytes:
            return Decision("refuse", "LargerThanBudget")
        charged = [m for m in gpu.models if m.residency is not _OUT]
        deficit = sum(m.hbm_bytes + overhead for m in charged) + need - gpu.budget_bytes
        if deficit <= 0:
            return Decision("admit", "Fits")
        idle = sorted(
            (m for m in charged if m.residency is _RESIDENT and not m.running + m.queued),
            key=lambda m: (m.last_request if m.last_request is not None else -INFINITY, m.index),
        )
        victims: list[ModelState] = []
        freed = 0
        for m in idle:
            if freed >= deficit:
                break
            victims.append(m)
            freed += m.hbm_bytes + overhead
        if freed >= deficit:
            return Decision("admit", "LeastRecentlyUsed", tuple(victims))
        return Decision("wait", "NoIdleModel")

    def swap_outs(self, gpu: GpuState, now: float) -> tuple[ModelState, ...]:
        if self.idle_after_seconds is None:
            return ()
        return tuple(m for m in gpu.models if self.idle_deadline(gpu, m, now) <= now)

    def idle_deadline(self, gpu: GpuState, model: ModelState, now: float) -> float:
        if self.idle_after_seconds is None:
            return INFINITY
        if model.residency is not _RESIDENT or model.running + model.queued:
            return INFINITY
        marks = [t for t in (model.last_request, model.resident_since) if t is not None]
        return (max(marks) if marks else now) + self.idle_after_seconds

    def swap_in(self, model: ModelState) -> Transfer:
        if model.cold or self.warm_bytes_per_second is None:
            return self.cold_load(model)
        return Transfer(
            self.wake_fixed_seconds, model.weights_bytes, self.warm_bytes_per_second, "h2d"
        )

    def swap_out(self, model: ModelState) -> Transfer:
        if self.warm_bytes_per_second is None:
            return super().swap_out(model)
        # level-1 sleep copies the weights to host memory each time (no clean copy is kept)
        return Transfer(0.0, model.weights_bytes, self.warm_bytes_per_second, "d2h")
