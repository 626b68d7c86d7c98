"""Pushing each live node's desired set, under a term its agent accepts. A node's set is
pushed when it changed, when the last push failed, or every `push_interval_seconds`
(`turn_plan.plan_pushes`). The first turn first raises the term above every term the live
agents have seen (`terms`: a deleted leader Lease restarts at 0), and a push refused for
its revision raises it above that agent's, once, while this process still holds the Lease.
An entry the agent refuses (400 naming `entries[i]`) is left out, remembered for its
generation (its status says why) and the rest pushed again. `Pusher` owns the memo of what
it last sent each node and how that went, the refusals, and the term floor."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from modelswap_api.control import DesiredEntry, DesiredSet, Revision
from modelswap_operator import desired, terms
from modelswap_operator.agents import AgentAddress, AgentClients
from modelswap_operator.cache import Body, Snapshot
from modelswap_operator.errors import AgentError, AgentRefused, TermExhausted
from modelswap_operator.metrics import OperatorMetrics
from modelswap_operator.tokens import TokenSource
from modelswap_operator.turn_plan import Sent, plan_pushes

log = logging.getLogger(__name__)

#: Entries one push may leave out after the agent refused them, before it gives up.
MAX_REFUSED_PER_PUSH = 8
#: The agent's 409 reasons for a revision below the highest it has seen.
OUTRANKED_REASONS = frozenset({"OlderTerm", "OlderRevision"})


@dataclass(frozen=True)
class Refusal:
    uid: str
    generation: int
    namespace: str
    name: str
    field: str
    message: str


class Pusher:
    def __init__(
        self,
        *,
        agents: AgentClients,
        tokens: TokenSource,
        metrics: OperatorMetrics,
        term: Callable[[], int],
        confirm_leading: Callable[[], Awaitable[bool]] | None,
    ) -> None:
        """`term` answers the leader Lease's term; `confirm_leading` reads the Lease and
        answers whether this process still holds it (None: never raise the term after a
        refused push, only before the first)."""
        self.agents = agents
        self.tokens = tokens
        self.metrics = metrics
        self.term = term
        self.confirm_leading = confirm_leading
        self._counter = 0
        #: The term pushed under when above the Lease's (`terms`); raised before the first
        #: push above what the live agents have seen, and after a push they refuse for it.
        self._term_floor = 0
        self._terms_learned = False
        self._sent: dict[str, Sent] = {}
        #: (uid, generation) -> (field, message) of entries an agent refused.
        self._refused: dict[tuple[str, int], tuple[str, str]] = {}

    @property
    def current_term(self) -> int:
        """The term this leader's desired sets carry."""
        return max(self.term(), self._term_floor)

    @property
    def sent_sets(self) -> Mapping[str, Sent]:
        """Per node: the last set pushed and how it went."""
        return self._sent

    def sent(self, node: str) -> Sent | None:
        """The last set pushed to `node` and how it went (None: none yet)."""
        return self._sent.get(node)

    @property
    def refusals(self) -> Mapping[tuple[str, int], tuple[str, str]]:
        """(field, message) of each entry generation an agent refused."""
        return self._refused

    def keep(self, uids: Collection[str]) -> None:
        """Forget the refusals of models no longer known."""
        self._refused = {key: why for key, why in self._refused.items() if key[0] in uids}

    async def push_all(
        self,
        snap: Snapshot,
        live: set[str],
        entries: Mapping[str, list[DesiredEntry]],
        now: float,
        *,
        limit: int,
        interval_seconds: float,
    ) -> None:
        """Push every due set, `limit` at once; the first call learns the terms first."""
        semaphore = asyncio.Semaphore(limit)
        if not self._terms_learned:
            await self._learn_terms(snap, live, semaphore)

        async def one(node: str) -> None:
            async with semaphore:
                await self._push(snap.swapnodes[node], entries[node], now)

        due = plan_pushes(live, entries, self._sent, now, interval_seconds)
        await asyncio.gather(*(one(node) for node in due))

    async def _push(self, swapnode: Body, entries: list[DesiredEntry], now: float) -> None:
        node = str(swapnode["metadata"]["name"])
        for _ in range(MAX_REFUSED_PER_PUSH):
            refused = await self._push_once(swapnode, entries, now)
            if refused is None:
                return
            key = (refused.uid, refused.generation)
            self._refused[key] = (desired.relative_field(refused.field), refused.message)
            log.warning("node %s refused %s/%s: %s", node, refused.namespace, refused.name,
                        refused.message)  # fmt: skip
            entries = [e for e in entries if e.uid != refused.uid]

    async def _push_once(
        self, swapnode: Body, entries: list[DesiredEntry], now: float, *, outrank: bool = True
    ) -> Refusal | None:
        """One push. A push refused for its revision (the agent has seen a higher one:
        from before a leader Lease was deleted) raises the term above it, once, and is
        sent again (`_outrank`)."""
        address = AgentAddress.of(swapnode)
        node = str(swapnode["metadata"]["name"])
        previous = self._sent.get(node)
        if address is None:
            self._sent[node] = Sent(entries, now, ok=False, error="its SwapNode names no endpoint")
            return None
        self._counter += 1
        body = DesiredSet(
            revision=desired.revision(self.current_term, self._counter),
            entries=tuple(entries),
            node_name=node,
        )
        try:
            client = await self.agents.for_node(address, self.tokens())
            result = await client.put_desired(body)
        except AgentError as e:
            outcome = type(e).__name__.removeprefix("Agent").lower()
            self.metrics.pushes.labels(outcome).inc()
            if (
                outrank
                and isinstance(e, AgentRefused)
                and e.status == 409
                and e.reason in OUTRANKED_REASONS
                and await self._outrank(address, node, e)
            ):
                return await self._push_once(swapnode, entries, now, outrank=False)
            if isinstance(e, AgentRefused) and e.status == 400:
                entry = desired.refused_entry(e.field, entries)
                if entry is not None:
                    return Refusal(entry.uid, entry.generation, entry.namespace, entry.name,
                                   e.field or "", str(e))  # fmt: skip
            if previous is None or previous.error != str(e):
                log.warning("push to node %s failed: %s", node, e)
            self._sent[node] = Sent(entries, now, ok=False, error=str(e))
            return None
        self.metrics.pushes.labels("ok").inc()
        results = {r.uid: r for r in result.results}
        for r in result.results:
            self.metrics.entry_results.labels(r.outcome).inc()
        if previous is None or not desired.same_entries(previous.entries, entries):
            log.info("node %s: pushed %d models (revision %s)", node, len(entries), body.revision)
        self._sent[node] = Sent(entries, now, ok=True, results=results)
        return None

    async def _learn_terms(
        self, snap: Snapshot, live: set[str], semaphore: asyncio.Semaphore
    ) -> None:
        """Before this leader's first push: raise its term above every term the live
        nodes' agents have seen (`GET /v1/node`, side by side). A deleted leader Lease
        restarts `leaseTransitions` at 0, and pushes under it would all be refused. An
        agent that does not answer now is caught by `_outrank` at its first refusal."""

        async def seen(node: str) -> Revision | None:
            address = AgentAddress.of(snap.swapnodes[node])
            if address is None:
                return None
            async with semaphore:
                try:
                    client = await self.agents.for_node(address, self.tokens())
                    return (await client.node()).revision
                except AgentError as e:
                    log.info("node %s: cannot read the revision it has seen (%s)", node, e)
                    return None

        revisions = await asyncio.gather(*(seen(node) for node in sorted(live)))
        self._raise_term(revisions, "the agents have seen")
        self._terms_learned = True

    async def _outrank(self, address: AgentAddress, node: str, refusal: AgentRefused) -> bool:
        """After `node` refused a push for its revision: read the revision it has seen and,
        if this process still holds the leader Lease, raise the term above it. A deposed
        leader that has not noticed yet must not outrank its successor, hence the Lease
        read; answers whether the term went up (then the push is worth sending again)."""
        if self.confirm_leading is None:
            return False
        try:
            client = await self.agents.for_node(address, self.tokens())
            info = await client.node()
        except AgentError as e:
            log.warning("node %s refused a push (%s) and its revision cannot be read: %s",
                        node, refusal, e)  # fmt: skip
            return False
        if info.revision is None or not await self.confirm_leading():
            return False
        return self._raise_term([info.revision], f"node {node} has seen")

    def _raise_term(self, seen: list[Revision | None], what: str) -> bool:
        before = self.current_term
        try:
            term = terms.term_above(before, seen)
        except TermExhausted as e:
            log.error("cannot push above the revisions %s: %s", what, e)
            return False
        if term == before:
            return False
        self._term_floor = term
        log.info("pushing under term %d, above every term %s (the leader Lease's term is %d)",
                 term, what, self.term())  # fmt: skip
        return True
