"""Pure: the order in which models waiting for HBM are placed.

After a Triton restart every model it served must be loaded again, and each load claims
HBM until the budget is full; what is placed last waits for room. So the order decides who
waits: pinned models first (they may never be victims, so one placed after the budget is
full could only wait for loads to finish and its room to be freed by swap-outs), then by
`priority`, highest first (the victim order takes the lowest first, so the models the
policy would keep are the ones that get room); models equal on both keep the order they
were given (a stable sort), so the caller's own tie-break holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from modelswap_api.policy import EffectivePolicy

T = TypeVar("T")


def load_order(items: Iterable[T], policy_of: Callable[[T], EffectivePolicy]) -> list[T]:
    """`items` pinned first, then by priority (highest first); ties in the given order."""

    def key(item: T) -> tuple[bool, int]:
        policy = policy_of(item)
        return (not policy.pinned, -policy.priority)

    return sorted(items, key=key)
