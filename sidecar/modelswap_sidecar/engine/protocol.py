"""The client protocol: one request at a time from a client socket (register, heartbeat,
attach, commit, swap-in, readopt), and a client's socket closing."""

from __future__ import annotations

import logging

from modelswap_api.wire import Message, Op, Peer, RemoteError, error_reply, reply_to
from modelswap_sidecar.engine.attaching import Attaching
from modelswap_sidecar.engine.errors import (
    EngineError,
    NotVouched,
    ProtocolViolation,
    UnknownModel,
    WrongState,
)
from modelswap_sidecar.engine.records import InstanceRecord
from modelswap_sidecar.engine.states import EngineState

log = logging.getLogger(__name__)
S = EngineState


class Clients(Attaching):
    """Serves the clients' requests."""

    def handle(self, peer: Peer, message: Message) -> Message | None:
        """Serve one client request (runs on its own thread)."""
        try:
            if message.op is Op.REGISTER:
                return self._register(peer, message)
            binding = self._peers.get(id(peer))
            if binding is None:
                raise NotVouched("register first")
            m = self.model(binding[0])
            inst = m.instances[binding[1]]
            if message.op is Op.HEARTBEAT:
                return self._heartbeat(m, inst, message)
            if message.op is Op.ATTACH:
                return self._attach(m, inst, message)
            if message.op is Op.COMMIT:
                return self._commit(m, inst, message)
            if message.op is Op.SWAP_IN:  # decided by the agent (`on_client_swap_in`)
                self.client_swap_in(m.name)
                return reply_to(message, m.epoch, {"state": str(m.state)})
            if message.op is Op.READOPT:
                return self._readopt(m, inst, message)
            raise ProtocolViolation(f"agent does not serve {message.op}")
        except EngineError as e:
            message.close_fds()
            return error_reply(message, 0, e.code, str(e))
        except RemoteError as e:
            message.close_fds()
            return error_reply(message, 0, e.code, e.message)

    def _register(self, peer: Peer, message: Message) -> Message:
        model = str(message.body.get("model", ""))
        instance = str(message.body.get("instance", "0"))
        pid = peer.peer_pid()
        if not self.voucher.vouch(pid, model):
            log.warning("refused client pid %d naming model %r: not vouched for", pid, model)
            raise NotVouched(f"pid {pid} is not vouched for as model {model!r}")
        m = self.model(model)
        with m.lock, self._mut:
            inst = m.instances.get(instance)
            if inst is None:
                inst = m.instances[instance] = InstanceRecord(instance)
            if inst.live and inst.peer is not peer:
                raise WrongState(f"instance {instance} of {model} is already connected")
            inst.peer = peer
            inst.pid = pid
            inst.last_heartbeat = None
            self._peers[id(peer)] = (model, instance)
            if not self._pid_in_use(m.config.gpu, pid, [inst]):
                self.budgets[m.config.gpu].process_attached(pid, self._measure(m.config.gpu, pid))
            body = {"epoch": m.epoch, "state": str(m.state), "committed": inst.committed}
        return reply_to(message, m.epoch, body)

    def client_gone(self, peer: Peer) -> None:
        """A closed socket is a dead client: drop its handles, keep the host copies."""
        with self._mut:
            binding = self._peers.pop(id(peer), None)
        if binding is None:
            return
        try:
            m = self.model(binding[0])
        except UnknownModel:
            return
        with m.lock, self._mut:
            inst = m.instances.get(binding[1])
            if inst is None or inst.peer is not peer:
                return
            inst.peer = None
            self._detach_process(m.config.gpu, inst.pid, [inst])
            if inst.mapped:
                self.swapper.release_instance(m, inst)
                for r in inst.regions.values():  # its KV lived in HBM; a saved copy is stale
                    if r.kv_file is not None:
                        self.store.delete(r.kv_file)
                        r.kv_file = None
            if not any(i.mapped for i in m.instances.values()) and m.state in (
                S.RESIDENT,
                S.LOADING,
            ):
                complete = bool(m.instances) and all(i.committed for i in m.instances.values())
                m.state = S.SWAPPED_OUT if complete else S.LOADING
                m.reason = f"instance {inst.name} (pid {inst.pid}) exited"
            self.persist()
        log.info("model %s instance %s: client pid %d gone", m.name, inst.name, inst.pid)
