"""What an engine is given: its settings, and the checkpoints where it calls its
`checkpoint` hook (fault tests stop it there)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Where the engine calls `checkpoint`: after each step that leaves something for a crash
#: to find (a fault test kills the agent there), and where a test holds an operation while
#: another comes (`commit.received`).
CHECKPOINTS = (
    "commit.received",  # a commit counted (a swap-out now refuses), the lock not yet taken
    "commit.saved",  # the client wrote the weights into staging files; nothing renamed
    "commit.renamed",  # weight files in place; the state file does not name them yet
    "swap_out.drain_overdue",  # the drain passed its timeout; its listener not yet told
    "swap_out.quiesced",  # every instance drained; nothing saved or unmapped
    "swap_out.kv_saved",  # preserved KV written into staging files; nothing renamed
    "swap_out.unmapped",  # every client unmapped; chunks not yet released
    "swap_in.allocated",  # chunks created and exported; nothing sent to clients
    "swap_in.mapped",  # clients mapped the chunks; nothing restored
    "attach.allocated",  # the same two steps when a client attaches to a resident model
    "attach.mapped",
)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    client_timeout_seconds: float = 60.0  # one client round trip (map, restore, save, unmap)
    drain_timeout_seconds: float = 60.0  # quiesce: how long in_use() work may hold a swap-out
    #: after `drain_timeout_seconds`, how long a drain whose overdue listener was told (the
    #: gateway ended the model's requests) waits for the work to leave before it rolls back
    drain_end_grace_seconds: float = 10.0
    readopt_grace_seconds: float = 10.0  # after a restart, how long clients have to readopt
    reserve_bytes: dict[int, int] = field(default_factory=dict)  # per GPU
    #: per GPU: the emulated link (bytes/s) a sim GPU's clients pace their copies to, told
    #: to each client in its registration reply; absent or 0: copies run at machine speed.
    #: Only the sim allocator's GPUs get one (the agent's settings refuse it elsewhere).
    pace_bytes_per_second: dict[int, float] = field(default_factory=dict)
    #: the estimate per runtime process, used when the allocator measures nothing
    overhead_bytes_per_process: int = 0
    #: a client silent for this long is logged
    heartbeat_timeout_seconds: float = 30.0
    #: a client that sent no heartbeat for this long answers nothing at all (a process
    #: busy with a long request still sends them: see `engine/heartbeats.py`): it is
    #: reported to `Engine.on_unresponsive`, whose listener (the agent) may end its
    #: process; 0: never reported. Clients send one every 5 s.
    unresponsive_after_seconds: float = 0.0
    # The client socket's limits (`engine/server.py`): what connections that are not (yet)
    # model processes can make the agent hold. A model process opens one connection per
    # instance it serves (and one per retry while it is refused, until the deadline below).
    #: open connections in all; more are closed when accepted
    max_connections: int = 256
    #: open connections from one process (`SO_PEERCRED` pid); more are closed when accepted
    max_connections_per_process: int = 16
    #: threads serving one connection's requests at once (replies to the agent's own
    #: requests are read beside them, never behind a busy one)
    max_handlers_per_connection: int = 4
    #: requests on one connection waiting for a handler; more are answered `Busy`. Every
    #: `in_use()` caller of a swapped-out model sends its own `swap_in` (each waits on the
    #: first one's swap), so a runtime's concurrency per instance is allowed for
    max_waiting_requests_per_connection: int = 256
    #: a connection that has not registered this long after it was accepted is closed
    register_timeout_seconds: float = 10.0


def no_checkpoint(name: str) -> None:
    """The default `checkpoint`: nothing."""
