"""The client protocol: each request from a client socket (register, heartbeat, attach,
commit, swap-in, readopt) dispatched to the object that serves it, and a client's socket
closing. Requests run on their connection's handler threads (`wire.Peer`, bounded by
`EngineSettings.max_handlers_per_connection`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from modelswap_api.wire import Message, Op, Peer, RemoteError, error_reply, reply_to
from modelswap_sidecar.engine.attaching import Attacher
from modelswap_sidecar.engine.errors import (
    EngineError,
    NotVouched,
    ProtocolViolation,
    UnknownModel,
    WrongState,
)
from modelswap_sidecar.engine.heartbeats import Heartbeats
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, KvReport, ModelRecord
from modelswap_sidecar.engine.recovery import Recovery
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.table import ModelTable
from modelswap_sidecar.engine.vouching import Voucher

log = logging.getLogger(__name__)
S = EngineState


class ClientProtocol:
    """Serves the clients' requests. A client's own swap-in goes to `swap_in(name)`,
    the decider the engine was built with (`core.SwapInDecider`)."""

    def __init__(
        self,
        *,
        table: ModelTable,
        ledger: GpuLedger,
        attacher: Attacher,
        recovery: Recovery,
        heartbeats: Heartbeats,
        store: HostStore,
        voucher: Voucher,
        swap_in: Callable[[str], None],
        pace_bytes_per_second: Mapping[int, float] | None = None,
    ) -> None:
        self.table = table
        self.ledger = ledger
        self.attacher = attacher
        self.recovery = recovery
        self.heartbeats = heartbeats
        self.store = store
        self.voucher = voucher
        self.swap_in = swap_in
        self.pace_bytes_per_second = dict(pace_bytes_per_second or {})

    def handle(self, peer: Peer, message: Message) -> Message | None:
        """Serve one client request (on one of its connection's handler threads)."""
        try:
            if message.op is Op.REGISTER:
                return self._register(peer, message)
            binding = self.table.binding(peer)
            if binding is None:
                raise NotVouched("register first")
            m = self.table.get(binding[0])
            inst = m.instances[binding[1]]
            if message.op is Op.HEARTBEAT:
                self._take_kv_report(m, inst, message)
                return self.heartbeats.beat(m, inst, message)
            if message.op is Op.ATTACH:
                return self.attacher.attach(m, inst, message)
            if message.op is Op.COMMIT:
                return self.attacher.commit(m, inst, message)
            if message.op is Op.SWAP_IN:  # the engine's decider (the agent's)
                self.swap_in(m.name)
                return reply_to(message, m.epoch, {"state": str(m.state)})
            if message.op is Op.READOPT:
                return self.recovery.readopt(m, inst, message)
            raise ProtocolViolation(f"agent does not serve {message.op}")
        except EngineError as e:
            message.close_fds()
            return error_reply(message, 0, e.code, str(e))
        except RemoteError as e:
            message.close_fds()
            return error_reply(message, 0, e.code, e.message)

    @staticmethod
    def _take_kv_report(m: ModelRecord, inst: InstanceRecord, message: Message) -> None:
        """Keep the KV report a heartbeat carries (the model's `modelswap_kv_*` metrics);
        one that is not a report is dropped and the last one kept: the heartbeat itself
        is still answered."""
        doc = message.body.get("kv")
        if doc is None:
            return
        report = KvReport.from_doc(doc)
        if report is None:
            log.debug("model %s instance %s: a heartbeat's kv report is not one", m.name, inst.name)
            return
        inst.kv_report = report

    def _register(self, peer: Peer, message: Message) -> Message:
        model = str(message.body.get("model", ""))
        instance = str(message.body.get("instance", "0"))
        pid = peer.peer_pid()
        if not self.voucher.vouch(pid, model):
            log.warning("refused client pid %d naming model %r: not vouched for", pid, model)
            raise NotVouched(f"pid {pid} is not vouched for as model {model!r}")
        m = self.table.get(model)
        with m.lock, self.table.lock:
            inst = m.instances.get(instance)
            if inst is None:
                inst = m.instances[instance] = InstanceRecord(instance)
            if inst.live and inst.peer is not peer:
                raise WrongState(f"instance {instance} of {model} is already connected")
            inst.peer = peer
            inst.pid = pid
            inst.last_heartbeat = None
            inst.registered_at = time.monotonic()
            self.table.bind(peer, model, instance)
            self.ledger.process_attached(m.config.gpu, pid, inst)
            body: dict[str, Any] = {
                "epoch": m.epoch,
                "state": str(m.state),
                "committed": inst.committed,
            }
            pace = self.pace_bytes_per_second.get(m.config.gpu, 0.0)
            if pace > 0:  # the node's emulated link: the client's sim mapper paces to it
                body["paceBytesPerSecond"] = pace
        return reply_to(message, m.epoch, body)

    def client_gone(self, peer: Peer) -> None:
        """A closed socket is a dead client: drop its handles, keep the host copies."""
        binding = self.table.unbind(peer)
        if binding is None:
            return
        try:
            m = self.table.get(binding[0])
        except UnknownModel:
            return
        with m.lock, self.table.lock:
            inst = m.instances.get(binding[1])
            if inst is None or inst.peer is not peer:
                return
            inst.peer = None
            self.ledger.process_detached(m.config.gpu, inst.pid, [inst])
            if inst.mapped:
                self.ledger.release_instance(m.config.gpu, inst)
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
            self.table.persist()
        log.info("model %s instance %s: client pid %d gone", m.name, inst.name, inst.pid)
