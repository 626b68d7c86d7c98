"""What the agent has told an attachment: the epoch it is at and what its memory holds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AgentFacts:
    """Written by whoever reads the agent's answer (attach, commit, swap requests,
    readopt); read through `Attachment`'s properties of the same names."""

    #: the highest epoch seen; requests carry it, and an agent request below it is stale
    epoch: int = 0
    #: the regions' bytes came from the host store (no load from the model source needed)
    restored: bool = False
    #: the weights are saved in the host store
    committed: bool = False
    #: what the committed weights are, as the client said when it committed them (a
    #: layout fingerprint, `modelswap_client.torch`); "" when unknown or not committed
    fingerprint: str = ""
    #: the last swap-out discarded the KV cache
    kv_discarded: bool = False
    #: how many times the KV regions' bytes were lost (a discard, a drop, a KV region
    #: mapped fresh); a KV cache written at an older count holds nothing valid
    kv_generation: int = 0
    #: the last swap-out dropped the model (onSwapOut: drop): the next swap-in maps fresh
    #: memory and the runtime reloads from the source (see `restored`)
    dropped: bool = False

    def forget_weights(self) -> None:
        """The weight regions were mapped fresh (a drop, a failure): nothing is restored
        or committed any more."""
        self.restored = self.committed = False
        self.fingerprint = ""

    def advance(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)
