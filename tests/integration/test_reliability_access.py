"""Access within the trust model (issue 12, deliverable 5; DESIGN.md §1), the engine agent
(`tests.support.engine_agent`: a real Engine and EngineServer, non-dumpable as the agent
is) and a process under the runtime's uid, which is not the agent's:

- the runtime's uid cannot open the host store or the pool: not by path, not through
  `/proc/<agent pid>/fd`, and it cannot read `/proc/<agent pid>/mem` (or maps, environ);
- the store is 0700 and each weight copy 0600, the socket has no access for other uids;
- a client naming another model gets no fd, an unvouched process cannot register, and no
  client holds a writable fd or mapping of a weight copy, across swaps.

The agent runs as root here (this machine's Python lives under /root, which other uids
cannot read, so the agent cannot run under a uid of its own); the runtime's tries are shell
commands under `RUNTIME_UID`. The uid switch needs root; elsewhere the tests skip, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine_procs import (
    AgentProc,
    ClientProc,
    Procs,
    file_mappings,
    memfd_mappings,
    open_files,
    shm_procs,
)
from tests.support.reliability import record

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to the agent's and the runtime's "
                       "uids needs root (the node's supervisor starts them as root does here)"),
]  # fmt: skip

MIB = 1 << 20
RUNTIME_UID = 61_002
REGIONS = [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]]


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-access-") as p:
        p.workdir.chmod(0o755)  # as the node's socket folder: only the store's own modes guard it
        yield p


def loaded(procs: Procs, agent: AgentProc, model: str, seed: int) -> ClientProc:
    client = procs.client(agent, model)
    client.ok(cmd="attach", model=model, socket=agent.socket, regions=REGIONS)
    client.ok(cmd="fill", tag="w", seed=seed)
    client.ok(cmd="commit")
    return client


_TRY = {
    "list": 'ls -- "$1" >/dev/null 2>&1',
    "read": 'head -c 1 -- "$1" >/dev/null 2>&1',
    "write": '( : >> "$1" ) 2>/dev/null',
}


def attempts_as_runtime(todo: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Each (kind, target) tried by a process under `RUNTIME_UID`: "allowed" or "refused".
    The tries are shell commands: this machine's Python lives under /root, which other uids
    cannot read."""
    answers: dict[str, str] = {}
    for name, (kind, target) in todo.items():
        tried = subprocess.run(
            ["/bin/sh", "-c", _TRY[kind], "try", target],
            user=RUNTIME_UID,
            group=RUNTIME_UID,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            timeout=30,
            check=False,
        )
        answers[name] = "allowed" if tried.returncode == 0 else "refused"
    return answers


def test_the_runtime_uid_cannot_reach_the_store_the_pool_or_the_agents_memory(
    procs: Procs,
) -> None:
    agent = procs.agent(["64M"], ["m:0"])
    client = loaded(procs, agent, "m", 1)
    agent.ok(cmd="swap_out", model="m")  # a weight copy in the store, chunks in the pool
    store = procs.workdir / "store"
    files = [p for p in store.rglob("*") if p.is_file()]
    assert files, "nothing in the host store to try"
    agent_fds = sorted(os.listdir(f"/proc/{agent.pid}/fd"), key=int)
    memfds = [n for n in agent_fds if os.readlink(f"/proc/{agent.pid}/fd/{n}").startswith("/memfd:")]  # fmt: skip
    assert memfds, "the agent holds no pool chunk to try"
    todo: dict[str, tuple[str, str]] = {
        "list the host store": ("list", str(store)),
        "list /proc/<agent>/fd": ("list", f"/proc/{agent.pid}/fd"),
        "read /proc/<agent>/mem": ("read", f"/proc/{agent.pid}/mem"),
        "read /proc/<agent>/maps": ("read", f"/proc/{agent.pid}/maps"),
        "read /proc/<agent>/environ": ("read", f"/proc/{agent.pid}/environ"),
    }
    for path in files:
        todo[f"read store file {path.relative_to(store)}"] = ("read", str(path))
        todo[f"write store file {path.relative_to(store)}"] = ("write", str(path))
    for n in agent_fds:
        todo[f"open /proc/<agent>/fd/{n}"] = ("read", f"/proc/{agent.pid}/fd/{n}")
    answers = attempts_as_runtime(todo)
    # the same tries succeed where the runtime's uid may read (the refusals are real ones)
    assert attempts_as_runtime(
        {"passwd": ("read", "/etc/passwd"), "self": ("list", "/proc/self/fd")}
    ) == {"passwd": "allowed", "self": "allowed"}
    allowed = {name for name, answer in answers.items() if answer == "allowed"}
    assert allowed == set(), f"the runtime's uid could: {sorted(allowed)}"
    assert client.ok(cmd="hash", tag="w")["sha256"]  # and the model itself still serves
    for name, answer in sorted(answers.items()):
        if name.startswith(("read store file", "write store file", "open /proc/<agent>/fd/")):
            continue
        record("access", check=f"runtime uid: {name}", outcome=answer)
    record("access", check=f"runtime uid: open each of the {len(files)} host-store files "
           "for reading and writing", outcome="all refused")  # fmt: skip
    record("access", check=f"runtime uid: open each of the agent's {len(agent_fds)} fds "
           f"({len(memfds)} pool chunks) through /proc", outcome="all refused")  # fmt: skip


def test_the_store_and_socket_have_tight_modes(
    procs: Procs,
) -> None:
    agent = procs.agent(["64M"], ["m:0"])
    loaded(procs, agent, "m", 1)
    agent.ok(cmd="swap_out", model="m")
    store = procs.workdir / "store"
    assert store.stat().st_mode & 0o777 == 0o700
    for path in store.rglob("*"):
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {mode:o}"
    sock = Path(agent.socket).stat()
    assert sock.st_mode & 0o007 == 0, f"socket mode {sock.st_mode & 0o777:o}"
    record("access", check="host store 0700, each file and folder in it 0600/0700, agent-owned",
           outcome="held")  # fmt: skip
    record("access", check=f"client socket mode {sock.st_mode & 0o777:o}: nothing for other uids",
           outcome="held")  # fmt: skip


def test_another_models_client_gets_no_fd_and_weight_copies_are_never_writable(
    procs: Procs,
) -> None:
    agent = procs.agent(["64M"], ["a:0", "b:0"])
    owner = loaded(procs, agent, "a", 1)
    intruder = procs.client(agent, "b")  # vouched for b only
    answer = intruder.call(cmd="attach", model="a", socket=agent.socket, regions=REGIONS)
    assert answer["ok"] is False and answer["code"] == "NotVouched"
    store = str(procs.workdir / "store")
    assert memfd_mappings(intruder.pid) == []
    assert not [t for _, t, _ in open_files(intruder.pid) if t.startswith(("/memfd:", store))]
    record("access", check="a client vouched for model b attaches as model a",
           outcome=f"refused ({answer['code']}); it holds no fd and maps no chunk")  # fmt: skip

    writable: list[str] = []
    for _ in range(3):
        agent.ok(cmd="swap_out", model="a")
        owner.ok(cmd="hash", tag="w")  # swapped in by use: the weight copy mapped from the store
        for client in (owner, intruder):
            writable += [t for _, t, flags in open_files(client.pid)
                         if t.startswith(store) and flags & 0o3]  # fmt: skip
            writable += [p for perms, p in file_mappings(client.pid, store) if "w" in perms]
    assert writable == []
    record("access", check="clients' fds and mappings of weight copies across 3 swap cycles",
           outcome="none writable")  # fmt: skip


def test_a_connection_from_an_unvouched_process_gets_nothing(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0"])
    loaded(procs, agent, "m", 1)
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)) as sock:
        sock.settimeout(10)
        sock.connect(agent.socket)
        sock.send(b'{"op":"register","id":1,"body":{"model":"m","instance":"x","pid":1}}')
        reply: dict[str, Any] = json.loads(sock.recv(1 << 20))
    assert reply["ok"] is False and reply["error"]["code"] == "NotVouched", reply
    record("access", check="a process the runtime did not vouch for registers as a model",
           outcome=f"refused ({reply['error']['code']})")  # fmt: skip
