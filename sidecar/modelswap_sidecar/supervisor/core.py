"""The supervisor: runs its children, restarts whichever dies, stops them all on SIGTERM.

    supervisor = Supervisor(specs, policy=RestartPolicy(), stop_grace_seconds=15.0)
    exit_code = supervisor.run()      # blocks in the main thread until stopped

- Each child runs in a session and process group of its own (`processes.spawn`).
- When a child exits, whatever is left of its group is killed (Triton's stubs outlive a
  killed Triton otherwise), its `cleanup` runs (Triton's shm regions), and it is restarted
  after the backoff `restarts.after_exit` decides, or the supervisor gives up: it stops the
  others and `run` returns 1.
- SIGHUP is forwarded to every child's group. SIGTERM (or SIGINT) is forwarded, then the
  supervisor waits up to `stop_grace_seconds` for every group to be gone, SIGKILLs what is
  left, reaps, runs the cleanups and `run` returns 0. A second SIGTERM/SIGINT kills at once.
- With `reap_orphans` (for `modelswap node`: PID 1, or a subreaper when not PID 1) every
  child of this process is reaped, orphans included, and anything of the subtree still
  alive at the end is killed. Without it only the children's leaders are waited for, so the
  class can run inside a process that has children of its own.

Signals are handled synchronously: the handlers do nothing, `signal.set_wakeup_fd` writes
each signal's number to a pipe, and the loop reads the pipe (`select`, with a timeout for
the next restart). `deliver(sig)` writes the same pipe, so another thread (or a caller that
keeps its own signal handlers) can ask for what a signal would do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from modelswap_sidecar.supervisor import processes
from modelswap_sidecar.supervisor.restarts import (
    GiveUp,
    RestartHistory,
    RestartPolicy,
    after_exit,
    give_up_note,
)
from modelswap_sidecar.supervisor.specs import ChildSpec, ExitStatus
from modelswap_sidecar.supervisor.state_file import ChildState, SupervisorState, write_state

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Exit status recorded for a child whose program could not be executed at all.
EXEC_FAILED = 127
_IDLE_WAKE_SECONDS = 0.5
_GROUP_POLL_SECONDS = 0.02
_KILL_WAIT_SECONDS = 5.0


@dataclass
class _Child:
    spec: ChildSpec
    popen: subprocess.Popen[bytes] | None = None
    #: Of the running leader; None when it is not running.
    pid: int | None = None
    #: Of the last start, kept after the leader exits until the whole group is gone.
    pgid: int | None = None
    started_seconds: float = 0.0
    starts: int = 0
    restart_at_seconds: float | None = None
    history: RestartHistory = field(default_factory=RestartHistory)
    last_exit: ExitStatus | None = None
    cleanup_due: bool = False

    @property
    def alive(self) -> bool:
        return self.pid is not None or self.pgid is not None


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """A handler, so the signal is caught (and written to the wakeup fd), not acted on."""


class Supervisor:
    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        policy: RestartPolicy | None = None,
        stop_grace_seconds: float = 15.0,
        state_file: Path | None = None,
        reap_orphans: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        names = [spec.name for spec in children]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must be unique: {names}")
        self._children = [_Child(spec) for spec in children]
        self._policy = policy or RestartPolicy()
        self._stop_grace_seconds = stop_grace_seconds
        self._state_file = state_file
        self._reap_orphans = reap_orphans
        self._clock = clock
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._exits: list[tuple[int, ExitStatus]] = []
        self._stopping = False
        self._gave_up: str | None = None
        self._ran = False
        self._finished = False

    # Reading it (any thread) ------------------------------------------------------------

    def restarts(self, name: str) -> int:
        """How many times child `name` was restarted (starts after its first)."""
        return max(0, self._child(name).starts - 1)

    def pid(self, name: str) -> int | None:
        return self._child(name).pid

    def state(self) -> SupervisorState:
        euid = os.geteuid()
        return SupervisorState(
            supervisor_pid=os.getpid(),
            updated_at_seconds=time.time(),
            stopping=self._stopping,
            children=tuple(
                ChildState(
                    name=c.spec.name,
                    pid=c.pid,
                    starts=c.starts,
                    restarts=max(0, c.starts - 1),
                    last_exit=c.last_exit,
                    uid=c.spec.run_as.uid if c.spec.run_as else euid,
                )
                for c in self._children
            ),
        )

    def deliver(self, sig: int) -> None:
        """Act as if the supervisor received `sig` (SIGTERM/SIGINT stop, SIGHUP is forwarded).

        Safe from any thread and from signal handlers.
        """
        if self._finished:
            return
        with contextlib.suppress(BlockingIOError):  # full: the loop has wakeups pending
            os.write(self._wake_w, bytes([sig]))

    def request_stop(self) -> None:
        self.deliver(signal.SIGTERM)

    # Running it (main thread) -----------------------------------------------------------

    def run(self, *, install_signal_handlers: bool = True) -> int:
        """Supervise until stopped: 0 after a stop, 1 after giving up on a child.

        `install_signal_handlers` needs the main thread; without it, signals are the
        caller's to `deliver`, and exits are noticed by polling every half second.
        """
        if self._ran:
            raise RuntimeError("a Supervisor runs once")
        self._ran = True
        try:
            with self._signal_handling(install_signal_handlers):
                if self._reap_orphans:
                    processes.become_subreaper()
                try:
                    for child in self._children:
                        self._run_cleanup(child)  # what an earlier run may have left
                        self._start(child)
                    code = self._supervise()
                finally:
                    self._shutdown()
        finally:
            self._finished = True
        return code

    def __del__(self) -> None:
        # Not closed when `run` returns: a late `deliver` from another thread must not
        # write to a file descriptor number that was reused meanwhile.
        for fd in (getattr(self, "_wake_r", None), getattr(self, "_wake_w", None)):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    @contextlib.contextmanager
    def _signal_handling(self, install: bool) -> Iterator[None]:
        if not install:
            yield
            return
        previous = {sig: signal.signal(sig, _ignore) for sig in HANDLED_SIGNALS}
        previous_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _supervise(self) -> int:
        while True:
            for sig in self._wait(self._timeout_seconds()):
                if sig == signal.SIGHUP:
                    log.info("forwarding SIGHUP to the children")
                    self._signal_running(signal.SIGHUP)
                elif sig in STOP_SIGNALS:
                    log.info("%s received: stopping the children", signal.Signals(sig).name)
                    self._begin_stop(sig)
                    return 0
            self._handle_exits()
            if self._gave_up is not None:
                log.error("giving up: %s", self._gave_up)
                self._begin_stop(signal.SIGTERM)
                return 1
            now = self._clock()
            for child in self._children:
                due = child.restart_at_seconds
                if due is not None and due <= now and child.pid is None:
                    self._start(child)

    def _timeout_seconds(self) -> float:
        now = self._clock()
        due = [c.restart_at_seconds for c in self._children if c.restart_at_seconds is not None]
        return max(0.0, min([_IDLE_WAKE_SECONDS, *(d - now for d in due)]))

    def _wait(self, timeout_seconds: float) -> list[int]:
        """Signals (numbers) that arrived, waiting up to `timeout_seconds` for the first."""
        readable, _, _ = select.select([self._wake_r], [], [], timeout_seconds)
        received: list[int] = []
        if readable:
            while True:
                try:
                    chunk = os.read(self._wake_r, 256)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                received.extend(chunk)
        return received

    # Starting and exits ----------------------------------------------------------------

    def _child(self, name: str) -> _Child:
        for child in self._children:
            if child.spec.name == name:
                return child
        raise KeyError(name)

    def _start(self, child: _Child) -> None:
        spec = child.spec
        child.restart_at_seconds = None
        child.starts += 1
        child.started_seconds = self._clock()
        try:
            popen = processes.spawn(spec)
        except OSError as e:
            log.error("cannot start %s (%s): %s", spec.name, spec.argv[0], e)
            child.last_exit = ExitStatus(code=EXEC_FAILED)
            self._decide(child)
            self._write_state()
            return
        child.popen, child.pid, child.pgid = popen, popen.pid, popen.pid
        who = spec.run_as.describe() if spec.run_as else f"uid {os.geteuid()}"
        log.info("started %s: pid %d as %s (start %d)", spec.name, popen.pid, who, child.starts)
        self._write_state()

    def _collect(self) -> None:
        """Reap what exited into `self._exits` (handled by `_handle_exits`)."""
        if self._reap_orphans:
            self._exits.extend(processes.reap())
            return
        for child in self._children:
            if child.pid is None:
                continue
            try:
                pid, status = os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = child.pid, 255 << 8  # reaped by someone else: status unknown
            if pid:
                self._exits.append((pid, ExitStatus.from_wait_status(status)))

    def _handle_exits(self) -> None:
        self._collect()
        while self._exits:
            pid, status = self._exits.pop(0)
            child = next((c for c in self._children if c.pid == pid), None)
            if child is None:
                log.debug("reaped orphan pid %d (%s)", pid, status.describe())
                continue
            self._exited(child, status)

    def _exited(self, child: _Child, status: ExitStatus) -> None:
        ran_seconds = self._clock() - child.started_seconds
        if child.popen is not None:
            child.popen.returncode = status.returncode  # reaped here, never by Popen
        child.popen, child.pid, child.last_exit = None, None, status
        level = logging.INFO if self._stopping else logging.WARNING
        log.log(level, "%s %s after %.1f s", child.spec.name, status.describe(), ran_seconds)
        child.cleanup_due = True
        self._finish_group(child)
        if not self._stopping:
            self._decide(child)
        self._write_state()

    def _decide(self, child: _Child) -> None:
        decision = after_exit(
            self._policy,
            child.history,
            started_seconds=child.started_seconds,
            exited_seconds=self._clock(),
        )
        if isinstance(decision, GiveUp):
            self._gave_up = f"{child.spec.name}: {decision.reason}"
            return
        child.history = decision.history
        child.restart_at_seconds = self._clock() + decision.delay_seconds
        # a warning, not a silent count: a crash a client caused counts towards giving up
        # on the whole node as any other does
        log.warning(
            "restarting %s in %.2f s (%s)",
            child.spec.name,
            decision.delay_seconds,
            give_up_note(self._policy, decision),
        )

    def _finish_group(self, child: _Child) -> None:
        """Kill what is left of the exited child's group, wait for it, then clean up."""
        pgid = child.pgid
        if pgid is not None:
            leftover = processes.group_members(pgid)
            if leftover:
                log.info(
                    "killing %d leftover process(es) of %s's group %d",
                    len(leftover),
                    child.spec.name,
                    pgid,
                )
                processes.signal_group(pgid, signal.SIGKILL)
                if not self._wait_gone(lambda: not processes.group_members(pgid)):
                    log.error("process group %d of %s survived SIGKILL", pgid, child.spec.name)
                self._collect()  # the last of them may be a zombie of ours still
            child.pgid = None
        self._run_cleanup(child)

    def _wait_gone(self, gone: Callable[[], bool]) -> bool:
        """Poll `gone` (reaping meanwhile) until true or `_KILL_WAIT_SECONDS` pass."""
        deadline = self._clock() + _KILL_WAIT_SECONDS
        while not gone():
            if self._clock() >= deadline:
                return False
            self._collect()
            time.sleep(_GROUP_POLL_SECONDS)
        return True

    def _run_cleanup(self, child: _Child) -> None:
        child.cleanup_due = False
        if child.spec.cleanup is None:
            return
        try:
            child.spec.cleanup()
        except Exception:
            log.exception("cleanup after %s failed", child.spec.name)

    # Stopping --------------------------------------------------------------------------

    def _signal_running(self, sig: int) -> None:
        for child in self._children:
            if child.pid is not None and child.pgid is not None:
                processes.signal_group(child.pgid, sig)

    def _begin_stop(self, sig: int) -> None:
        """Send the stop signal once (SIGINT stays SIGINT, else each child's stop_signal)."""
        self._stopping = True
        for child in self._children:
            child.restart_at_seconds = None
            if child.pid is not None and child.pgid is not None:
                send = sig if sig == signal.SIGINT else child.spec.stop_signal
                processes.signal_group(child.pgid, send)
        self._write_state()

    def _shutdown(self) -> None:
        """Wait out the grace period, SIGKILL what is left, reap, clean up."""
        if not self._stopping:  # an exception ended the loop
            self._begin_stop(signal.SIGTERM)
        deadline = self._clock() + self._stop_grace_seconds
        while any(c.alive for c in self._children):
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            if any(s in STOP_SIGNALS for s in self._wait(min(_GROUP_POLL_SECONDS, remaining))):
                log.warning("second stop signal: killing the children now")
                break
            self._handle_exits()  # each exit kills the rest of its group and cleans up
        late = [c for c in self._children if c.alive]
        for child in late:
            log.warning("%s still running: killing its group", child.spec.name)
            if child.pgid is not None:
                processes.signal_group(child.pgid, signal.SIGKILL)
        self._wait_gone(self._all_gone)
        for child in self._children:
            if child.alive:
                log.error("%s survived SIGKILL (pid %s)", child.spec.name, child.pid)
        if self._reap_orphans:
            self._kill_strays()
        for child in self._children:
            if child.cleanup_due:
                self._run_cleanup(child)
        self._write_state()

    def _all_gone(self) -> bool:
        self._handle_exits()
        return not any(c.alive for c in self._children)

    def _kill_strays(self) -> None:
        """Kill and reap any process still parented to us (one that left its group)."""
        me = os.getpid()
        strays = processes.children_of(me)
        if not strays:
            return
        log.warning("killing %d stray process(es): %s", len(strays), strays)
        for pid in strays:
            processes.kill_pid(pid, signal.SIGKILL)
        self._wait_gone(lambda: not processes.children_of(me))
        processes.reap()

    def _write_state(self) -> None:
        if self._state_file is None:
            return
        try:
            write_state(self._state_file, self.state())
        except OSError as e:
            log.warning("cannot write the supervisor state file %s: %s", self._state_file, e)
