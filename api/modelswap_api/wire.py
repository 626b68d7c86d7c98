"""Wire types shared by the agent and the client library: error codes and messages.

Standard library only: the client library imports this module inside model processes
(Triton python-backend stubs) whose environment has none of our other dependencies.

The client protocol (DESIGN.md §3) runs over a Unix `SOCK_SEQPACKET` socket. Every packet
is one UTF-8 JSON object; file descriptors travel beside it as `SCM_RIGHTS`, at most
`MAX_FDS_PER_PACKET` per packet. A message with more fds sends the first batch with its
JSON and the rest in `fds` continuation packets right after it (the sender holds its send
lock across them, and a socket has one reader, so they arrive in order). A truncated
control message (`MSG_CTRUNC`) closes what did arrive and raises `ProtocolError`; so does a
packet with fewer fds than its message announces for it (each packet carries
`min(MAX_FDS_PER_PACKET, still due)`), and a continuation that has not arrived within
`CONTINUATION_TIMEOUT_SECONDS` (a peer that announces fds and stops would otherwise hold
its reader for ever).

A message is `{"op", "id", "epoch", "body"}`; a reply is op `reply` with `re` = the
request's id, `ok`, and either a `body` or an `error` `{code, message}`. Either side sends
requests: the client registers, attaches regions, commits loaded weights, asks for a
swap-in, readopts and sends heartbeats; the agent asks the client to quiesce, save, unmap,
map, restore and resume. Every reply carries the model's epoch; a request for an older
epoch than the receiver knows is answered `Stale` and otherwise ignored. Body fields that
refer to fds hold indexes into the message's fd list.
"""

from __future__ import annotations

import array
import contextlib
import enum
import json
import logging
import math
import os
import queue
import select
import socket
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
#: Linux's SCM_MAX_FD is 253 fds per control message.
_log = logging.getLogger(__name__)

MAX_FDS_PER_PACKET = 253
#: Biggest JSON packet either side sends or accepts.
MAX_PACKET_BYTES = 1 << 20
#: Longest wait for an `fds` continuation packet (they are sent back to back).
CONTINUATION_TIMEOUT_SECONDS = 5.0

# This module and the client library run in Triton's python-backend stubs, under the
# container's system Python: 3.10 in Triton 24.xx releases, 3.12 in 25.xx. `enum.StrEnum`
# is 3.11+, so 3.10 gets an equivalent: `str()`, `format()` and f-strings give the value
# (a plain `(str, Enum)` gives `Op.REGISTER` there on 3.11+). The client imports it here.
if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:

    class StrEnum(str, enum.Enum):
        """`enum.StrEnum` of Python 3.11, for Python 3.10."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, format_spec: str) -> str:
            return str.__format__(str(self), format_spec)


class ErrorCode(StrEnum):
    """Machine-readable error codes carried in agent replies (control API and client socket)."""

    BAD_REQUEST = "BadRequest"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    CONFLICT = "Conflict"
    STALE = "Stale"
    NO_CAPACITY = "NoCapacity"
    HOST_STORE_FULL = "HostStoreFull"
    NOT_VOUCHED = "NotVouched"
    BAD_SOURCE = "BadSource"
    INTERNAL = "Internal"
    PROTOCOL = "Protocol"
    TIMEOUT = "Timeout"
    CLIENT_GONE = "ClientGone"
    ROLLED_BACK = "RolledBack"
    WRONG_STATE = "WrongState"
    MODEL_FAILED = "ModelFailed"
    REMOVED = "Removed"
    BUSY = "Busy"  # a connection's requests past its limit of waiting ones


class Op(StrEnum):
    # client → agent
    #: {model, instance, pid, version} → {epoch, state, committed, paceBytesPerSecond?}
    #: (paceBytesPerSecond: the sim GPU's emulated link; the client paces its copies to it)
    REGISTER = "register"
    #: {regions: [{tag, bytes, kind, address}]} → {restored, fingerprint, regions: [{tag,
    #: restored}], kv_pool?: {offload_after_tokens, host_bytes, fd}} (fd: a writable host-store file
    #: for the KV pool's host tier)
    ATTACH = "attach"
    #: {fingerprint, replace?} weights loaded: the agent sends SAVE for the weights (again
    #: over a committed copy only with replace), keeps the fingerprint, then answers
    COMMIT = "commit"
    SWAP_IN = "swap_in"  # in_use() on a swapped-out model → {epoch}
    READOPT = "readopt"  # {state, epoch, regions: [... chunks: [{offset, bytes, fd}]]}
    HEARTBEAT = "heartbeat"
    # agent → client
    QUIESCE = "quiesce"  # drain in_use(), synchronize, run swap-out handlers
    SAVE = "save"  # {regions: [{tag, fd, bytes}]} copy device → host file fds (writable)
    UNMAP = "unmap"  # {kv_discarded, dropped: bool} unmap every region, drop handles
    MAP = "map"  # {regions: [{tag, chunks: [{offset, bytes, fd}]}]}
    RESTORE = "restore"  # {regions: [{tag, fd, bytes} | {tag, fresh: true}]}
    RESUME = "resume"  # swap-out rolled back, or swap-in finished: {state}
    REMOVED = "removed"  # the model was deleted: unmap everything, detach for good
    # both
    REPLY = "reply"
    FDS = "fds"  # continuation packet carrying more fds of the previous message


class RegionKind(StrEnum):
    WEIGHTS = "weights"  # written once after load, kept in the host store, read-only there
    KV = "kv"  # saved on swap-out when the policy says `preserve`
    SCRATCH = "scratch"  # never saved


class KvMode(StrEnum):
    DISCARD = "discard"
    PRESERVE = "preserve"


class SwapOutMode(StrEnum):
    """`swapPolicy.onSwapOut`: keep the weights in the host store, or unload (drop) them."""

    HOST = "host"
    DROP = "drop"


class ProtocolError(Exception):
    """A malformed or truncated packet; the connection should be closed."""


class RemoteError(Exception):
    """The peer answered a request with an error."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(slots=True)
class Message:
    op: Op
    msg_id: int
    epoch: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    #: fds received (owned by the receiver) or to send (still owned by the sender)
    fds: list[int] = field(default_factory=list)
    # replies only
    re: int = 0
    ok: bool = True
    error_code: ErrorCode | None = None
    error_message: str = ""

    def raise_for_error(self) -> None:
        if not self.ok:
            raise RemoteError(self.error_code or ErrorCode.INTERNAL, self.error_message)

    def close_fds(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def reply_to(
    request: Message, epoch: int, body: dict[str, Any] | None = None, fds: list[int] | None = None
) -> Message:
    return Message(Op.REPLY, 0, epoch, body or {}, fds or [], re=request.msg_id)


def error_reply(request: Message, epoch: int, code: ErrorCode, message: str) -> Message:
    return Message(
        Op.REPLY,
        0,
        epoch,
        {},
        [],
        re=request.msg_id,
        ok=False,
        error_code=code,
        error_message=message,
    )


def _encode(message: Message, nfds: int) -> bytes:
    doc: dict[str, Any] = {
        "op": str(message.op),
        "id": message.msg_id,
        "epoch": message.epoch,
        "body": message.body,
        "nfds": nfds,
    }
    if message.op in (Op.REPLY, Op.FDS):
        doc["re"] = message.re
    if message.op is Op.REPLY:
        doc["ok"] = message.ok
        if not message.ok:
            doc["error"] = {"code": str(message.error_code), "message": message.error_message}
    data = json.dumps(doc, separators=(",", ":")).encode()
    if len(data) > MAX_PACKET_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_PACKET_BYTES}")
    return data


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # `1e999`: no field of the protocol takes it
        raise ValueError(f"number out of range: {text[:32]}")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _integer(doc: dict[str, Any], key: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if type(value) is not int:
        raise ValueError(f"{key}: expected an integer")
    return value


def _decode(data: bytes) -> tuple[Message, int]:
    """A packet as a Message; ProtocolError for anything malformed (not JSON or not UTF-8,
    nested past the interpreter's recursion limit, a non-finite number, a non-integer where
    an integer belongs), so a bad packet never escapes as another exception."""
    try:
        doc = json.loads(data, parse_float=_finite_float, parse_constant=_refuse_constant)
        if not isinstance(doc, dict):
            raise ValueError("expected an object")
        op = Op(doc["op"])
        body = doc.get("body", {})
        if not isinstance(body, dict):
            raise ValueError("body: expected an object")
        message = Message(op, _integer(doc, "id"), _integer(doc, "epoch", 0), body)
        if op in (Op.REPLY, Op.FDS):
            message.re = _integer(doc, "re")
        if op is Op.REPLY:
            message.ok = bool(doc["ok"])
            if not message.ok:
                error = doc.get("error", {})
                message.error_code = ErrorCode(error.get("code", ErrorCode.INTERNAL))
                message.error_message = str(error.get("message", ""))
        nfds = _integer(doc, "nfds", 0)
        if nfds < 0:
            raise ValueError("nfds: must be 0 or more")
        return message, nfds
    except RecursionError as e:
        raise ProtocolError("malformed packet: nested too deeply") from e
    except (ValueError, KeyError, TypeError, OverflowError) as e:
        raise ProtocolError(f"malformed packet: {str(e)[:200]}") from e


def _check_batch(received: int, nfds: int, before: int) -> None:
    """A packet of a message announcing `nfds` fds, `before` of them already received,
    carries the next `min(MAX_FDS_PER_PACKET, still due)`; fewer means none are coming."""
    due = min(MAX_FDS_PER_PACKET, nfds - before)
    if received != due:
        raise ProtocolError(
            f"a packet of a message announcing {nfds} fds carries {received}, not {due}"
        )


class Channel:
    """One end of a client-protocol socket: thread-safe sends, one reader.

    `send` never closes the fds it sends. `recv` returns None at end of stream; the fds of
    a returned message belong to the caller.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._next_id = 1
        self._id_lock = threading.Lock()

    def next_id(self) -> int:
        with self._id_lock:
            value = self._next_id
            self._next_id += 1
            return value

    def send(self, message: Message) -> None:
        fds = list(message.fds)
        data = _encode(message, len(fds))
        with self._send_lock:
            first, rest = fds[:MAX_FDS_PER_PACKET], fds[MAX_FDS_PER_PACKET:]
            self._sendmsg(data, first)
            while rest:
                batch, rest = rest[:MAX_FDS_PER_PACKET], rest[MAX_FDS_PER_PACKET:]
                cont = Message(Op.FDS, 0, message.epoch, {}, re=message.msg_id)
                self._sendmsg(_encode(cont, len(batch)), batch)

    def _sendmsg(self, data: bytes, fds: list[int]) -> None:
        ancillary = []
        if fds:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = self.sock.sendmsg([data], ancillary)
        if sent != len(data):
            raise ProtocolError(f"short send: {sent} of {len(data)} bytes")

    def _recv_packet(self) -> tuple[bytes, list[int]] | None:
        fd_bytes = socket.CMSG_SPACE(MAX_FDS_PER_PACKET * array.array("i").itemsize)
        data, ancdata, flags, _ = self.sock.recvmsg(MAX_PACKET_BYTES, fd_bytes)
        fds: list[int] = []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(payload[: len(payload) - (len(payload) % arr.itemsize)])
                fds.extend(arr)
        if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"truncated packet (flags {flags:#x}): fds or data lost")
        if not data and not fds:
            return None
        return data, fds

    def _recv_continuation(self) -> tuple[bytes, list[int]] | None:
        ready, _, _ = select.select([self.sock], [], [], CONTINUATION_TIMEOUT_SECONDS)
        if not ready:
            raise ProtocolError(f"no fds continuation within {CONTINUATION_TIMEOUT_SECONDS:g} s")
        return self._recv_packet()

    def recv(self) -> Message | None:
        packet = self._recv_packet()
        if packet is None:
            return None
        data, fds = packet
        try:
            message, nfds = _decode(data)
        except BaseException:
            for fd in fds:  # a malformed packet's fds are closed, not leaked
                os.close(fd)
            raise
        try:
            _check_batch(len(fds), nfds, 0)
            while len(fds) < nfds:
                more = self._recv_continuation()
                if more is None:
                    raise ProtocolError("stream ended inside a multi-packet message")
                _check_batch(len(more[1]), nfds, len(fds))
                fds.extend(more[1])
                cont, _ = _decode(more[0])
                if cont.op is not Op.FDS or cont.re != message.msg_id:
                    raise ProtocolError(f"expected fds continuation, got {cont.op}")
            if len(fds) != nfds:
                raise ProtocolError(f"expected {nfds} fds, received {len(fds)}")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        message.fds = fds
        return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class ConnectionLost(Exception):  # noqa: N818 - reads as the event
    """The peer closed the socket (or died) before answering."""


RequestHandler = Callable[["Peer", Message], "Message | None"]


@dataclass(frozen=True, slots=True)
class PeerLimits:
    """What one connection may make its receiving side do (see `Peer`); `names` are the
    settings behind the two limits, as a refusal names them."""

    max_handlers: int
    max_waiting: int
    names: tuple[str, str] = ("max_handlers", "max_waiting")


class PendingReply:
    """A request in flight; `wait` returns its reply (whose fds the caller then owns)."""

    def __init__(self, peer: Peer, msg_id: int) -> None:
        self._peer = peer
        self.msg_id = msg_id
        self._done = threading.Event()
        self._reply: Message | None = None
        self._lost = False

    def _finish(self, reply: Message | None) -> None:
        self._reply = reply
        self._lost = reply is None
        self._done.set()

    def wait(self, timeout_seconds: float | None = None) -> Message:
        if not self._done.wait(timeout_seconds):
            self._peer._forget(self.msg_id)
            if self._done.is_set() and self._reply is not None:  # raced with the reply
                self._reply.close_fds()
            raise TimeoutError(f"no reply to request {self.msg_id} in {timeout_seconds} s")
        if self._lost or self._reply is None:
            raise ConnectionLost(f"{self._peer.name}: connection lost")
        return self._reply


class Peer:
    """Requests and replies over a `Channel`, both ways, with one reader thread.

    Incoming requests run `handler` on handler threads (a request may wait on the
    requests it sends back; their replies are read by the reader thread, never behind a
    handler); its returned message is sent as the reply (and the reply's fds closed after
    sending), an exception becomes an `Internal` error reply. `on_close` runs once when the
    stream ends. Handler threads are kept and reused once idle: starting a thread per
    request cost a swap-in's round trips ~0.2 ms each, more while another thread's
    `MAP_POPULATE` holds the mmap lock the new stack needs.

    `limits` bounds what one connection can make this side do (the agent passes them; a
    client trusts its agent and passes none): at most `max_handlers` handler threads, and
    at most `max_waiting` requests waiting for one; a request past that is answered `Busy`
    by the reader at once, naming the limit.
    """

    def __init__(
        self,
        sock: socket.socket,
        handler: RequestHandler,
        on_close: Callable[[Peer], None] | None = None,
        name: str = "peer",
        limits: PeerLimits | None = None,
    ) -> None:
        self.channel = Channel(sock)
        self.name = name
        self._handler = handler
        self._on_close = on_close
        self._limits = limits
        self._pending: dict[int, PendingReply] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        # requests for a handler thread; every queued request is owed either an idle worker
        # (counted in `_idle`), a new one, or (at `max_handlers`) the next worker to finish
        # (counted in `_waiting`); `_idle` and `_waiting` are never both above zero
        self._work: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._idle = 0
        self._workers = 0
        self._waiting = 0
        self._refused = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        self._reader.start()

    def peer_pid(self) -> int:
        """The connected process's pid, from `SO_PEERCRED` (set when it connected)."""
        creds = self.channel.sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
        )
        pid, _uid, _gid = struct.unpack("3i", creds)
        return int(pid)

    def request_start(
        self,
        op: Op,
        body: dict[str, Any] | None = None,
        epoch: int = 0,
        fds: list[int] | None = None,
    ) -> PendingReply:
        msg_id = self.channel.next_id()
        pending = PendingReply(self, msg_id)
        with self._lock:
            if self._closed:
                raise ConnectionLost(f"{self.name}: connection closed")
            self._pending[msg_id] = pending
        try:
            self.channel.send(Message(op, msg_id, epoch, body or {}, fds or []))
        except OSError as e:
            self._forget(msg_id)
            raise ConnectionLost(f"{self.name}: send failed: {e}") from e
        return pending

    def request(
        self,
        op: Op,
        body: dict[str, Any] | None = None,
        epoch: int = 0,
        fds: list[int] | None = None,
        timeout_seconds: float | None = None,
    ) -> Message:
        """Send a request and wait for its reply (raises `RemoteError` for error replies)."""
        reply = self.request_start(op, body, epoch, fds).wait(timeout_seconds)
        if not reply.ok:
            reply.close_fds()
            reply.raise_for_error()
        return reply

    def _forget(self, msg_id: int) -> None:
        with self._lock:
            self._pending.pop(msg_id, None)

    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self.channel.recv()
                except OSError:
                    break
                except ProtocolError as e:  # this connection only; the others go on
                    _log.warning("%s: closing the connection: %s", self.name, e)
                    break
                except Exception as e:  # never a dead reader thread with a traceback
                    _log.error("%s: closing the connection: %s", self.name, type(e).__name__)
                    break
                if message is None:
                    break
                if message.op is Op.REPLY:
                    with self._lock:
                        pending = self._pending.pop(message.re, None)
                    if pending is None:
                        message.close_fds()  # the requester gave up (timeout)
                    else:
                        pending._finish(message)
                    continue
                self._dispatch(message)
        finally:
            self.close()

    def _dispatch(self, message: Message) -> None:
        limits = self._limits
        with self._lock:
            spawn = refuse = False
            if self._idle > 0:
                self._idle -= 1
            elif limits is None or self._workers < limits.max_handlers:
                spawn = True
                self._workers += 1
            elif self._waiting < limits.max_waiting:
                self._waiting += 1
            else:
                refuse = True
                self._refused += 1
            if not refuse:  # queued under the lock, so `close` finds every waiting one
                self._work.put(message)
        if refuse:
            assert limits is not None
            self._refuse(message, limits)
            return
        if spawn:
            threading.Thread(target=self._worker, name=f"{self.name}-handler", daemon=True).start()

    def _refuse(self, message: Message, limits: PeerLimits) -> None:
        """Answer `Busy` from the reader: the connection already has `max_handlers`
        requests handled and `max_waiting` more waiting."""
        message.close_fds()
        handlers, waiting = limits.names
        why = (
            f"{limits.max_handlers} requests handled and {limits.max_waiting} waiting on this "
            f"connection ({handlers}={limits.max_handlers}, {waiting}={limits.max_waiting})"
        )
        if self._refused == 1:  # once per connection: a flood must not flood the log too
            _log.warning("%s: refusing requests: %s", self.name, why)
        with contextlib.suppress(OSError, ProtocolError):
            self.channel.send(error_reply(message, message.epoch, ErrorCode.BUSY, why))

    def _worker(self) -> None:
        while True:
            message = self._work.get()
            if message is None:
                return
            self._serve(message)
            with self._lock:
                if self._closed:
                    self._workers -= 1
                    return
                if self._waiting > 0:  # a queued request is this worker's: take it
                    self._waiting -= 1
                else:
                    self._idle += 1

    def _serve(self, message: Message) -> None:
        try:
            reply = self._handler(self, message)
        except RemoteError as e:
            message.close_fds()
            reply = error_reply(message, message.epoch, e.code, e.message)
        except Exception as e:
            message.close_fds()
            reply = error_reply(message, message.epoch, ErrorCode.INTERNAL, repr(e))
        if reply is None:
            return
        reply.re = message.msg_id
        try:
            with contextlib.suppress(OSError):
                self.channel.send(reply)
        finally:
            reply.close_fds()  # a reply's fds are the sender's: sent (duplicated) or not

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
            idle, self._idle = self._idle, 0
            self._workers -= idle
            waiting, self._waiting = self._waiting, 0
        for _ in range(waiting):  # queued with no worker owed (so no idle one takes them)
            with contextlib.suppress(queue.Empty):
                queued = self._work.get_nowait()
                if queued is not None:
                    queued.close_fds()
        for _ in range(idle):  # busy workers see `_closed` when they finish
            self._work.put(None)
        self.channel.close()
        for p in pending:
            p._finish(None)
        if self._on_close is not None:
            self._on_close(self)
