"""Whether the agent knows which models it is to serve, before it holds them.

A started agent holds no model until it is told its desired set: by a push (the operator,
or local mode's folder watcher), or by the set a previous agent saved (`desired.json`),
which it takes back only once Triton is ready (`adoption`). Until then a name the gateway
does not route may well be one of its models: the gateway answers it 503 + Retry-After and
`/v2/health/ready` 503, never 404 (a client such as the OpenAI SDK does not retry a 404).
"""

from __future__ import annotations

from collections.abc import Iterable

from modelswap_api.control import DesiredEntry
from modelswap_sidecar.agent.core.records import user_name_of


class DesiredKnowledge:
    """Told or not, and the saved entries not taken back yet (by namespace and user name)."""

    def __init__(self) -> None:
        self._told = False
        self._saved: set[tuple[str, str]] = set()

    @property
    def told(self) -> bool:
        return self._told

    def read_saved(self, entries: Iterable[DesiredEntry], *, found: bool) -> None:
        """The set a previous agent saved, read at start; `found`: the file existed (an
        empty saved set still tells the agent it serves nothing)."""
        self._saved = {(e.namespace, user_name_of(e)) for e in entries}
        self._told = self._told or found

    def pushed(self) -> None:
        """A desired set was taken: it is the agent's word from now on."""
        self._told = True
        self._saved.clear()

    def adopted(self) -> None:
        """The saved set was taken back (each entry held, or left out with its reason)."""
        self._saved.clear()

    def awaits(self, name: str, namespace: str | None) -> bool:
        """`name` (in `namespace`, None: any) may still come: the set is not known yet, or
        a saved entry carries the name and is not taken back yet."""
        if not self._told:
            return True
        return any(n == name and namespace in (None, ns) for ns, n in self._saved)
