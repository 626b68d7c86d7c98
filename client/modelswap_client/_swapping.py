"""Swap handling: the agent's requests (quiesce, save, unmap, map, restore, resume,
removed) dispatched against the attachment's state, epoch-checked."""

from __future__ import annotations

import logging
from typing import Any

from modelswap_api.wire import ErrorCode, Message, Op, Peer, error_reply, reply_to
from modelswap_client._copying import Copying
from modelswap_client._state import ClientState
from modelswap_client.errors import ClientError

log = logging.getLogger(__name__)


class Swapping(Copying):
    """Answers the agent's requests; the copies themselves are `Copying`'s."""

    def _handle(self, peer: Peer, message: Message) -> Message:
        if message.epoch < self.epoch and message.op is not Op.RESUME:
            message.close_fds()
            return error_reply(message, self.epoch, ErrorCode.STALE, "stale epoch")
        self.epoch = max(self.epoch, message.epoch)
        try:
            body: dict[str, Any] = {}
            if message.op is Op.QUIESCE:
                self._quiesce()
            elif message.op is Op.SAVE:
                with self._op_lock:
                    self._save(message)
            elif message.op is Op.UNMAP:
                with self._op_lock:
                    self.mapper.synchronize()
                    self._unmap_all()
                    self.kv_discarded = bool(message.body.get("kv_discarded"))
                    if message.body.get("dropped"):
                        self.dropped = True
                        self.restored = self.committed = False
                        self._drop_weight_sources()  # the host copies are deleted
                    self._set_state(ClientState.SWAPPED_OUT)
            elif message.op is Op.REMOVED:
                with self._op_lock:
                    self.mapper.synchronize()
                    self._unmap_all()
                    self._drop_weight_sources()
                    self._drop_kv_host_tier()  # its file is deleted: a KV pool over it is dead
                    with self._cond:
                        self._closing = True  # the agent closes the socket: no reconnect
                    self._heartbeat_stop.set()
                    self._set_state(ClientState.REMOVED)
            elif message.op is Op.MAP:
                with self._op_lock:
                    self._map(message)
                    self._set_state(ClientState.MAPPED)
            elif message.op is Op.RESTORE:
                with self._op_lock:
                    body = self._restore(message)
            elif message.op is Op.RESUME:
                with self._cond:
                    if self._state in (ClientState.DRAINING, ClientState.QUIESCED):
                        self._set_state(ClientState.RESIDENT)
            else:
                message.close_fds()
                return error_reply(message, self.epoch, ErrorCode.PROTOCOL, f"no {message.op}")
        except Exception as e:
            message.close_fds()
            log.warning("%s: %s failed: %s", self.model, message.op, e)
            return error_reply(message, self.epoch, ErrorCode.INTERNAL, f"{message.op}: {e}")
        return reply_to(message, self.epoch, body)

    def _quiesce(self) -> None:
        token = object()
        with self._cond:
            if self._state is not ClientState.RESIDENT:
                raise ClientError(f"cannot quiesce in state {self._state}", ErrorCode.WRONG_STATE)
            generation = self._generation
            self._drain_token = token
            self._state = ClientState.DRAINING
            self._cond.wait_for(
                lambda: (
                    self._in_use == 0
                    or self._drain_token is not token
                    or self._generation != generation
                )
            )
            if self._drain_token is not token or self._generation != generation:
                raise ClientError("swap-out was cancelled", ErrorCode.STALE)
        with self._op_lock:
            self.mapper.synchronize()
            for h in self._on_swap_out:
                h(self)
            self._set_state(ClientState.QUIESCED)
            with self._cond:
                self._drain_token = token
