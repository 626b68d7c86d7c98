"""The transport to clients: requests to the clients of a model's instances, sent to all
of them at once and waited for together.

`Transport` is the one seam: start a request to one instance's client, or cut that client
off. `PeerTransport` sends over each instance's socket (`InstanceRecord.peer`); a test
passes a fake that answers from a script, so the swapper runs with no process or socket.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from modelswap_api.wire import ConnectionLost, Message, Op
from modelswap_sidecar.engine.records import InstanceRecord

log = logging.getLogger(__name__)


class Pending(Protocol):
    """A request in flight (`wire.PendingReply`)."""

    def wait(self, timeout_seconds: float | None = None) -> Message:
        """The reply, whose fds the caller then owns; raises `TimeoutError` or
        `ConnectionLost`."""
        ...


class Transport(Protocol):
    def start(
        self, inst: InstanceRecord, op: Op, epoch: int, body: dict[str, Any], fds: list[int] | None
    ) -> Pending:
        """Send `op` to `inst`'s client; raises `ConnectionLost` when it is not connected.
        The caller keeps (and closes) `fds`."""
        ...

    def disconnect(self, inst: InstanceRecord) -> None:
        """Cut `inst`'s client off (its socket closes; it is a dead client from then on)."""
        ...


class PeerTransport:
    """Requests over each instance's socket."""

    def start(
        self, inst: InstanceRecord, op: Op, epoch: int, body: dict[str, Any], fds: list[int] | None
    ) -> Pending:
        peer = inst.peer
        if peer is None:
            raise ConnectionLost("not connected")
        return peer.request_start(op, body, epoch, fds)

    def disconnect(self, inst: InstanceRecord) -> None:
        if inst.peer is not None:
            inst.peer.close()


@dataclass(slots=True)
class Replies:
    """Instances whose client answered ok (with the reply body), and (instance, why) for
    those that failed, timed out or are gone."""

    ok: list[tuple[InstanceRecord, dict[str, Any]]] = field(default_factory=list)
    failed: list[tuple[InstanceRecord, str]] = field(default_factory=list)

    @property
    def succeeded(self) -> list[InstanceRecord]:
        return [inst for inst, _ in self.ok]

    def why(self) -> str:
        return "; ".join(why for _, why in self.failed)


@dataclass(slots=True)
class Batch:
    """Requests sent to several instances at once; `failed` holds those never sent."""

    pending: list[tuple[InstanceRecord, Pending]] = field(default_factory=list)
    failed: list[tuple[InstanceRecord, str]] = field(default_factory=list)

    def wait(self, timeout_seconds: float, *, stop_at_failure: bool = False) -> Replies:
        """Every reply within one deadline (or up to the first failure)."""
        replies = Replies(failed=list(self.failed))
        if stop_at_failure and replies.failed:
            return replies
        deadline = time.monotonic() + timeout_seconds
        for inst, p in self.pending:
            try:
                reply = p.wait(max(deadline - time.monotonic(), 0.0))
            except (TimeoutError, ConnectionLost) as e:
                replies.failed.append((inst, f"instance {inst.name}: {e}"))
            else:
                reply.close_fds()
                if reply.ok:
                    replies.ok.append((inst, reply.body))
                else:
                    why = f"{reply.error_code}: {reply.error_message}"
                    replies.failed.append((inst, f"instance {inst.name}: {why}"))
            if stop_at_failure and replies.failed:
                break
        return replies


def send(
    transport: Transport,
    epoch: int,
    instances: list[InstanceRecord],
    op: Op,
    *,
    bodies: dict[str, dict[str, Any]] | None = None,
    fds: dict[str, list[int]] | None = None,
    stop_at_failure: bool = False,
) -> Batch:
    """Start `op` on every instance's client at once (each its own body and fds, by
    instance name; or up to the first that cannot be sent); the caller keeps (and closes)
    the fds."""
    batch = Batch()
    for inst in instances:
        try:
            body = (bodies or {}).get(inst.name, {})
            batch.pending.append(
                (inst, transport.start(inst, op, epoch, body, (fds or {}).get(inst.name)))
            )
        except ConnectionLost as e:
            batch.failed.append((inst, f"instance {inst.name}: {e}"))
            if stop_at_failure:
                break
    return batch


def broadcast(
    transport: Transport,
    epoch: int,
    instances: list[InstanceRecord],
    op: Op,
    timeout_seconds: float,
    *,
    bodies: dict[str, dict[str, Any]] | None = None,
    fds: dict[str, list[int]] | None = None,
) -> Replies:
    """Send `op` to every instance at once and wait for all replies."""
    return send(transport, epoch, instances, op, bodies=bodies, fds=fds).wait(timeout_seconds)


def request(
    transport: Transport,
    inst: InstanceRecord,
    op: Op,
    epoch: int,
    body: dict[str, Any],
    *,
    fds: list[int],
    timeout_seconds: float,
) -> Message:
    """One request to one client, waited for; an error reply raises `RemoteError`."""
    reply = transport.start(inst, op, epoch, body, fds).wait(timeout_seconds)
    if not reply.ok:
        reply.close_fds()
        reply.raise_for_error()
    return reply


def close_fd(fd: int) -> None:
    """Close an fd the engine opened to hand a client (sent, or never sent)."""
    try:
        os.close(fd)
    except OSError:
        log.warning("closing fd %d failed", fd)
