"""`NodeBackend`: what the control API needs from the agent.

The control layer owns revisions, fencing, identity and generation checks and the grace
period for models missing from the set; the backend owns the models. The real agent
implements this; `InMemoryBackend` (`tests/support/memory_backend.py`) is the reference
for tests and for the operator's tests against a real control server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from modelswap_api.control import ActionResult, DesiredEntry, EntryResult, ModelInfo, NodeInfo


class NodeBackend(Protocol):
    async def converge(self, entries: Sequence[DesiredEntry]) -> Sequence[EntryResult]:
        """Make `entries` the targets for their uids; one result per entry, same order.

        Return promptly: loads, reloads and policy changes proceed in the background and
        show in `models()`. Outcome `applied` (taken as the target), `deferred` (taken, but
        it cannot act yet: no room, fenced, source pending — say why) or `conflict` (it can
        never be honoured as given, e.g. a GPU this node lacks). Uids not in `entries` are
        left alone: the control layer calls `unload` after their grace period.
        """
        ...

    async def unload(self, uid: str) -> None:
        """Unload a model dropped from the set; keep its host-store bytes. Idempotent."""
        ...

    async def forget(self, uid: str) -> bool:
        """Unload and delete everything held for `uid`, host-store bytes included.
        False when nothing was held."""
        ...

    def save_desired(self) -> asyncio.Future[None]:
        """Snapshot the desired entries as they are now, for a restarted agent to take back,
        and return at once: the caller holds the control lock, so the write runs outside
        it. The future is done once this snapshot (or a newer one) is saved; snapshots are
        saved in the order taken. The control layer calls it once per change (a set taken,
        a batch of unloads, a model forgotten), never per model."""
        ...

    async def node_info(self) -> NodeInfo:
        """Node name, agent version and GPUs (the control layer fills in revision and
        fencing)."""
        ...

    async def models(self) -> Sequence[ModelInfo]:
        """Every model held: desired, or dropped from the set with host bytes kept."""
        ...

    async def swap_in(self, uid: str) -> ActionResult:
        """Bring the model into HBM now (the policy may refuse); UnknownModelError."""
        ...

    async def swap_out(self, uid: str) -> ActionResult:
        """Swap the model out now (never a pinned one); UnknownModelError."""
        ...

    async def reload(self, uid: str, *, keep_host_copy: bool) -> ActionResult:
        """Load the model again from its source (its files changed): out of the runtime,
        its host copy kept or dropped, then loaded again; UnknownModelError."""
        ...
