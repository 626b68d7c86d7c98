"""The term a leader pushes its desired sets under (pure).

Agents order desired sets by (term, counter) and refuse anything below the highest revision
they have seen. The leader Lease's `leaseTransitions` gives each acquisition a new term only
while the Lease lives: a deleted Lease is re-created at 0, and the new leader's pushes
would all be refused (`OlderRevision 0/1 < 0/242`) while every model went unready. So a
leader pushes under the first term that is at least its Lease's and above every term the
agents report having seen (`GET /v1/node`). The term is the operator's own number from
then on; it need not fit the Lease's int32 field, only the control API's bound
(`MAX_REVISION_NUMBER`, 2^53 - 1, which JSON carries exactly).
"""

from __future__ import annotations

from collections.abc import Iterable

from modelswap_api.control import MAX_REVISION_NUMBER, Revision
from modelswap_operator.errors import TermExhausted


def term_above(term: int, seen: Iterable[Revision | None]) -> int:
    """The lowest term that is at least `term` and above the term of every revision in
    `seen` (None: an agent that has seen none). TermExhausted when that term would pass
    the control API's bound."""
    highest = max((revision.term for revision in seen if revision is not None), default=-1)
    wanted = max(term, highest + 1)
    if wanted > MAX_REVISION_NUMBER:
        raise TermExhausted(
            f"an agent has seen term {highest}: no term above it is within the control "
            f"API's bound ({MAX_REVISION_NUMBER}); reset that agent's revision state file"
        )
    return wanted
