"""The policy with its clock injected: what the agent's policy loop and the simulator hold.

The functions underneath take `now_seconds` explicitly; this only binds a clock to them
(`time.monotonic` in the agent, trace time in the simulator, a fake one in tests).
"""

from __future__ import annotations

from collections.abc import Callable

from modelswap_sidecar.policy.admission import admit
from modelswap_sidecar.policy.decisions import Admission, SwapOut
from modelswap_sidecar.policy.inputs import NodeView, PolicySettings
from modelswap_sidecar.policy.swapouts import plan_swap_outs

Clock = Callable[[], float]


class Policy:
    def __init__(self, settings: PolicySettings, clock: Clock) -> None:
        self.settings = settings
        self._clock = clock

    def swap_outs(self, node: NodeView) -> tuple[SwapOut, ...]:
        """Models to swap out now (idle ones, then relief above the high watermark)."""
        return plan_swap_outs(node, self._clock(), self.settings)

    def admit(self, node: NodeView, uid: str, *, waited_seconds: float | None = None) -> Admission:
        """Whether model `uid` may swap in now, after which victims; or wait, or refuse.
        `waited_seconds`: how long the caller has been asking (None: it will not ask again
        for a busy model to finish)."""
        return admit(node, uid, self._clock(), self.settings, waited_seconds=waited_seconds)
