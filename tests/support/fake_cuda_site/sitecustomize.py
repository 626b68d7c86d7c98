"""Installs the fake `cuda.bindings` (tests/support/fake_cuda) into a child process.

Put this folder first on the child's `PYTHONPATH` together with the repository root and
set `MODELSWAP_FAKE_CUDA_GPUS=<n>` (optionally `MODELSWAP_FAKE_CUDA_MAJOR`,
`MODELSWAP_FAKE_CUDA_TOTAL_MIB`): the child then sees a fresh fake machine with n GPUs
whose UUIDs match the parent's fake (they are derived from the ordinal). Without the
variable it does nothing. Used by tests whose agent runs the link probe child.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class _Setter:
    """The one `MonkeyPatch` method `install` uses, without pytest in the child."""

    def setitem(self, mapping: Any, key: Any, value: Any) -> None:
        mapping[key] = value


def _install() -> None:
    gpus = os.environ.get("MODELSWAP_FAKE_CUDA_GPUS")
    if not gpus:
        return
    from tests.support.fake_cuda.api import install
    from tests.support.fake_cuda.world import MIB, FakeCuda

    fake = FakeCuda(
        major=int(os.environ.get("MODELSWAP_FAKE_CUDA_MAJOR", "13")),
        gpus=int(gpus),
        total_bytes=int(os.environ.get("MODELSWAP_FAKE_CUDA_TOTAL_MIB", "64")) * MIB,
    )
    install(_Setter(), fake)  # type: ignore[arg-type]
    sys.modules["_modelswap_fake_cuda"] = fake  # type: ignore[assignment]


_install()
