"""The agent handler: what the agent asks of a model process (quiesce, save, unmap, map,
restore, resume, removed), epoch-checked and dispatched against the state gate, plus the
local side of an agent restart (roll back what the dead agent left unfinished, readopt).

Every memory step runs under one operation lock, so a close, a recovery and the agent's
requests never interleave their mapping changes.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from modelswap_api.wire import ErrorCode, Message, Op, Peer, RegionKind, error_reply, reply_to
from modelswap_client._copier import Copier
from modelswap_client._facts import AgentFacts
from modelswap_client._gate import ClientState, StateGate
from modelswap_client._hooks import Hooks
from modelswap_client._kvhost import KvHostTier
from modelswap_client.mappers.base import Mapper
from modelswap_client.regions import Regions

log = logging.getLogger(__name__)


class AgentHandler:
    """Answers the agent's requests (`handle`, the `Peer`'s handler); the copies are the
    copier's, the state the gate's, what the agent said goes to `facts`."""

    def __init__(
        self,
        model: str,
        mapper: Mapper,
        *,
        gate: StateGate,
        facts: AgentFacts,
        regions: Regions,
        copier: Copier,
        kv_host: KvHostTier,
        hooks: Hooks,
    ) -> None:
        self._model = model
        self._mapper = mapper
        self._gate = gate
        self._facts = facts
        self._regions = regions
        self._copier = copier
        self._kv_host = kv_host
        self._hooks = hooks
        self._op_lock = threading.RLock()

    def handle(self, peer: Peer, message: Message) -> Message:
        facts = self._facts
        if message.epoch < facts.epoch and message.op is not Op.RESUME:
            message.close_fds()
            return error_reply(message, facts.epoch, ErrorCode.STALE, "stale epoch")
        facts.advance(message.epoch)
        try:
            body: dict[str, Any] = {}
            if message.op is Op.QUIESCE:
                self._quiesce()
            elif message.op is Op.SAVE:
                with self._op_lock:
                    self._copier.save(message)
            elif message.op is Op.UNMAP:
                self._unmap(message)
            elif message.op is Op.REMOVED:
                self._removed()
            elif message.op is Op.MAP:
                with self._op_lock:
                    self._copier.map(message)
                    self._gate.set(ClientState.MAPPED)
            elif message.op is Op.RESTORE:
                body = self._restore(message)
            elif message.op is Op.RESUME:
                self._gate.resume()
            else:
                message.close_fds()
                return error_reply(message, facts.epoch, ErrorCode.PROTOCOL, f"no {message.op}")
        except Exception as e:
            message.close_fds()
            log.warning("%s: %s failed: %s", self._model, message.op, e)
            return error_reply(message, facts.epoch, ErrorCode.INTERNAL, f"{message.op}: {e}")
        return reply_to(message, facts.epoch, body)

    def _quiesce(self) -> None:
        token = self._gate.drain()
        with self._op_lock:
            self._mapper.synchronize()
            Hooks.run(self._hooks.swap_out)
            self._gate.quiesced(token)

    def _unmap(self, message: Message) -> None:
        with self._op_lock:
            self._mapper.synchronize()
            self._regions.unmap_all()
            self._facts.kv_discarded = bool(message.body.get("kv_discarded"))
            if message.body.get("kv_discarded") or message.body.get("dropped"):
                self._facts.kv_generation += 1  # counted before the memory is back
            if message.body.get("dropped"):
                self._facts.dropped = True
                self._facts.forget_weights()
                self._copier.drop_weight_sources()  # the host copies are deleted
            self._gate.set(ClientState.SWAPPED_OUT)

    def _removed(self) -> None:
        with self._op_lock:
            self._mapper.synchronize()
            self._regions.unmap_all()
            self._copier.drop_weight_sources()
            self._kv_host.drop()  # its file is deleted: a KV pool over it is dead
            # REMOVED is final: the agent closes the socket and nothing reconnects
            self._gate.set(ClientState.REMOVED)

    def _restore(self, message: Message) -> dict[str, Any]:
        with self._op_lock:
            if any(
                rd.get("fresh") and self._regions[rd["tag"]].kind is RegionKind.WEIGHTS
                for rd in message.body["regions"]
            ):  # weights mapped fresh (after a drop or a failure): the runtime reloads them
                self._facts.forget_weights()
            if any(
                rd.get("fresh") and self._regions[rd["tag"]].kind is RegionKind.KV
                for rd in message.body["regions"]
            ):  # KV mapped fresh (discard, drop, failure): every cache written before is gone
                self._facts.kv_generation += 1
            restored = self._copier.restore(message)
            was_out = self._gate.state is ClientState.MAPPED
            self._facts.dropped = False
            self._gate.set(ClientState.RESIDENT)
            if was_out:
                Hooks.run(self._hooks.swap_in)
            return {"regions": restored.regions, "copy": restored.copy}

    # -- registration ---------------------------------------------------------------------

    def registered(self, body: dict[str, Any]) -> None:
        """Take what the agent's registration reply says about this process's copies: a
        sim GPU's `paceBytesPerSecond` (the node's emulated link) paces the mapper, so no
        model code has to know it. Absent: the mapper keeps its own (a bench's client may
        pace by itself). Raises `MapperError` when the mapper cannot pace."""
        pace = body.get("paceBytesPerSecond")
        if pace is None:
            return
        with self._op_lock:  # no copy is in flight while the link changes
            self._mapper.pace(float(pace))
        log.debug("%s: copies paced to %.3g B/s (the agent's node setting)", self._model, pace)

    # -- agent restart --------------------------------------------------------------------

    def roll_back(self) -> None:
        """The agent died: undo what it left unfinished (waits for handlers still running
        for it). A drained model resumes; a mapped, unrestored swap-in is unmapped."""
        with self._op_lock:
            state = self._gate.state
            if state in (ClientState.DRAINING, ClientState.QUIESCED):
                self._gate.set(ClientState.RESIDENT)  # the swap-out never finished: resume
            elif state is ClientState.MAPPED:
                self._mapper.synchronize()
                self._regions.unmap_all()  # the restore never finished: back to swapped out
                self._gate.set(ClientState.SWAPPED_OUT)

    def readopt(self, peer: Peer, timeout_seconds: float) -> None:
        """Tell a restarted agent (on `peer`, registered) what this process holds: every
        mapped chunk re-exported when resident, layouts only otherwise. The memory stays
        as it is while the agent answers."""
        with self._op_lock:
            mapped = self._gate.state is ClientState.RESIDENT
            regions, fds = self._regions.export(mapped=mapped)
            try:
                reply = peer.request(
                    Op.READOPT,
                    {"state": "resident" if mapped else "swapped_out", "regions": regions},
                    self._facts.epoch,
                    fds,
                    timeout_seconds=timeout_seconds,
                )
            finally:
                for fd in fds:
                    os.close(fd)
            self._facts.advance(reply.epoch)
            self._facts.committed = bool(reply.body.get("committed", self._facts.committed))

    def release(self) -> None:
        """Detach: unmap every chunk, drop the host mappings, give the reservations back."""
        with self._op_lock:
            self._mapper.synchronize()
            self._regions.unmap_all()
            self._copier.drop_weight_sources()
            self._kv_host.drop()
            self._regions.free()
