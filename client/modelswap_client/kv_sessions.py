"""Conversations' KV caches kept between turns: the prefix cache, keyed by session id.

    store = KvSessionStore(kv, namespace="team-a", model="tinyllama", max_sessions=8,
                           hold=att.in_use)
    with store.turn("user-42", ids, model) as turn:    # ids: the whole conversation so far
        out = model.generate(ids, cache=turn.cache, max_new_tokens=64)
        turn.keep(out)                                  # the answer is prefix next time

One store serves one model in one namespace (the caller scopes it: a session id of
another namespace or model never meets this store). A turn finds the session's cache and
keeps the longest prefix its token ids share with the new input (at least one input
token is left for the model to compute); `generate` then computes only the rest. What
the cache had lost — its bytes discarded by a swap-out (`kv: discard`, a drop) or its
host-tier blocks taken by another session — is computed again from the session's token
ids before the turn starts (`Turn.recomputed_tokens`), so a turn never reads stale K/V.

Room: at most `max_sessions` sessions; a new one evicts the least recently used. When a
tier has no free block for a growing turn, whole sessions are evicted, least recently
used first, until it has (the pool itself drops only host blocks when the host tier is
full; such a session recomputes its lost tail next turn). Turns run one at a time (the
store's lock), inside `hold()` (`att.in_use`), so no swap-out comes between the check and
the read of a cache's bytes.

Counters (`stats()`): hits, misses, evictions, tokens reused and recomputed, and the
blocks (and their bytes) held in each tier.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.wire import ErrorCode
from modelswap_client.errors import ClientError
from modelswap_client.kv_cache import PoolTensors, _torch
from modelswap_client.kvpool import KvPoolFull, Tier

__all__ = ["KvSessionStore", "KvStats", "Turn"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KvStats:
    """A store's counters (totals since it was made) and what it holds now."""

    namespace: str
    model: str
    sessions: int
    device_blocks: int  # HBM-tier blocks held by sessions
    host_blocks: int
    device_bytes: int  # the bytes of those blocks (`modelswap status`, kubectl's KV column)
    host_bytes: int
    hits: int  # turns whose session's cache was there, its prefix intact
    misses: int  # turns without a cache (new or evicted session) or with lost bytes
    evictions: int  # sessions evicted whole, or their host blocks taken by another
    tokens_reused: int  # prefix tokens a turn did not compute again
    tokens_recomputed: int  # cached tokens computed again because their bytes were lost

    def as_doc(self) -> dict[str, int]:
        """The figures a heartbeat carries to the agent (`Attachment.report_kv`)."""
        return {
            "sessions": self.sessions,
            "device_blocks": self.device_blocks,
            "host_blocks": self.host_blocks,
            "device_bytes": self.device_bytes,
            "host_bytes": self.host_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "tokens_reused": self.tokens_reused,
            "tokens_recomputed": self.tokens_recomputed,
        }


@dataclass(slots=True)
class _Session:
    cache: Any  # TieredKvCache
    #: the token ids the cache's positions hold (the first `cache.tokens` of them)
    token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Turn:
    """One turn of a session: `cache` holds `reused_tokens + recomputed_tokens` tokens of
    the input's prefix; pass it to `generate` (or a decode loop) with the whole input."""

    session_id: str
    cache: Any
    input_ids: list[int]
    reused_tokens: int
    recomputed_tokens: int
    _kept: list[int] | None = None

    def keep(self, output_ids: Any) -> None:
        """The sequence the turn ended with (`generate`'s output, batch 1, or a list of
        ids): its tokens the cache holds are the next turn's prefix. Without it, only
        the input's tokens are kept."""
        ids = _as_ids(output_ids)
        if ids[: len(self.input_ids)] != self.input_ids:
            raise ClientError(
                "the kept sequence does not start with the turn's input", ErrorCode.BAD_REQUEST
            )
        self._kept = ids


def _as_ids(ids: Any) -> list[int]:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        if len(ids) != 1:
            raise ClientError(
                f"a session holds one sequence; got a batch of {len(ids)}", ErrorCode.BAD_REQUEST
            )
        ids = ids[0]
    return [int(i) for i in ids]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class KvSessionStore:
    def __init__(
        self,
        kv: PoolTensors,
        *,
        namespace: str,
        model: str,
        max_sessions: int,
        hold: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        if max_sessions <= 0:
            raise ValueError("max_sessions must be positive")
        self.kv = kv
        self.namespace = namespace
        self.model = model
        self.max_sessions = max_sessions
        self._hold = hold
        self._sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0
        self._reused = self._recomputed = 0
        #: (sessions, device blocks, host blocks) as the last turn left them: read by
        #: `stats` from other threads (a heartbeat) without waiting for a turn
        self._held = (0, 0, 0)

    # -- what it holds ---------------------------------------------------------------------

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def stats(self) -> KvStats:
        """The counters, and what the store held when its last turn ended (safe to call
        from any thread, during a turn too)."""
        sessions, device, host = self._held
        return KvStats(
            namespace=self.namespace,
            model=self.model,
            sessions=sessions,
            device_blocks=device,
            host_blocks=host,
            device_bytes=device * self.kv.pool.block_bytes,
            host_bytes=host * self.kv.pool.block_bytes,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            tokens_reused=self._reused,
            tokens_recomputed=self._recomputed,
        )

    def report(self) -> dict[str, int]:
        """`stats()` as a heartbeat carries it: `att.report_kv(store.report)`."""
        return self.stats().as_doc()

    def _count_held(self) -> None:
        pool = self.kv.pool
        device = host = 0
        for sid in self._sessions:
            for b in pool.blocks(sid) if pool.holds(sid) else ():
                if b.tier is Tier.HBM:
                    device += 1
                else:
                    host += 1
        self._held = (len(self._sessions), device, host)

    # -- turns -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def turn(self, session_id: str, input_ids: Any, model: Any) -> Iterator[Turn]:
        """A turn of `session_id` over `input_ids` (the whole conversation, batch 1), with
        `model` to compute again what the cache lost. The model stays resident for the
        body. On an exception the session is dropped (its cache may be half-written)."""
        ids = _as_ids(input_ids)
        if not ids:
            raise ClientError("a turn needs at least one input token", ErrorCode.BAD_REQUEST)
        with self._lock, self._hold():
            turn = self._begin(session_id, ids, model)
            try:
                yield turn
            except BaseException:
                self._drop(session_id)
                raise
            else:
                self._end(turn)
            finally:
                self._count_held()

    def forget(self, session_id: str) -> None:
        """Drop a session and give its blocks back (a conversation that ended)."""
        with self._lock:
            self._drop(session_id)
            self._count_held()

    def _begin(self, session_id: str, ids: list[int], model: Any) -> Turn:
        self._count_pool_evictions()
        session = self._sessions.get(session_id)
        if session is None:
            while len(self._sessions) >= self.max_sessions:
                self._evict_oldest(reason="max sessions")
            session = _Session(self.kv.cache(session_id, grow=self._grow))
            self._sessions[session_id] = session
        self._sessions.move_to_end(session_id)
        cache = session.cache
        # what the new input can use: the shared prefix, leaving one token to compute
        usable = min(_common_prefix(session.token_ids, ids), cache.tokens, len(ids) - 1)
        generation_lost = cache.generation != self.kv.generation()
        # a full host tier may have taken the tail's blocks
        valid = 0 if generation_lost else min(cache.tokens, self.kv.pool.tokens(session_id))
        reused = min(valid, usable)
        if generation_lost or reused == 0:
            cache.reset()  # nothing of it is used: give every block back
        else:
            cache.crop(reused)
        recomputed = usable - reused
        if recomputed:
            self._recompute(model, cache, ids, reused, usable)
        if session.token_ids and reused == usable and usable > 0:
            self._hits += 1
        else:
            self._misses += 1
        self._reused += reused
        self._recomputed += recomputed
        if recomputed:
            log.info(
                "%s/%s session %s: %d cached tokens computed again (%s)",
                self.namespace,
                self.model,
                session_id,
                recomputed,
                "KV discarded" if generation_lost else "host blocks taken",
            )
        session.token_ids = ids[:usable]
        return Turn(session_id, cache, ids, reused, recomputed)

    def _recompute(self, model: Any, cache: Any, ids: list[int], start: int, end: int) -> None:
        torch = _torch()
        tensor = torch.tensor([ids[start:end]], dtype=torch.long, device=self.kv.device)
        with torch.no_grad():
            model(input_ids=tensor, cache=cache, use_cache=True)

    def _end(self, turn: Turn) -> None:
        session = self._sessions.get(turn.session_id)
        if session is None:  # evicted during the turn: nothing to keep
            return
        cache = session.cache
        kept = turn._kept if turn._kept is not None else turn.input_ids
        if cache.lost or cache.tokens > len(kept):
            # the cache holds tokens nobody named (a decode loop's own): keep what is known
            cache.crop(min(cache.tokens, len(kept)))
        if cache.lost:
            self._drop(turn.session_id)
            return
        session.token_ids = kept[: cache.tokens]

    # -- room ------------------------------------------------------------------------------

    def _grow(self, session_id: str, tokens: int) -> object:
        """Grow a session's blocks; when a tier is full, evict the least recently used
        other session and try again."""
        while True:
            try:
                # a failed append keeps the blocks it placed; the retry adds only the rest
                added = self.kv.pool.append_tokens(session_id, tokens)
            except KvPoolFull as e:
                others = [s for s in self._sessions if s != session_id]
                if not others:
                    raise KvPoolFull(
                        f"{e}: this session alone needs more than the tiers hold (raise "
                        "spec.model.kvCacheBytes or kvCache.hostBytes)"
                    ) from e
                self._evict(others[0], reason=str(e))
                continue
            self._count_pool_evictions()
            return added

    def _count_pool_evictions(self) -> None:
        evicted = self.kv.pool.evicted
        while evicted:
            sid = evicted.pop(0)
            if sid in self._sessions:
                self._evictions += 1
                log.info("%s/%s session %s: host KV blocks taken", self.namespace, self.model, sid)

    def _evict_oldest(self, *, reason: str) -> None:
        self._evict(next(iter(self._sessions)), reason=reason)

    def _evict(self, session_id: str, *, reason: str) -> None:
        self._evictions += 1
        log.info("%s/%s session %s evicted (%s)", self.namespace, self.model, session_id, reason)
        self._drop(session_id)

    def _drop(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.cache.free()
