"""Record the CUDA calls of one full swap cycle of each backend, on a GPU or on the fake.

    python3 tests/gpu/record_cycles.py --out DIR            # a GPU machine: the real driver
    python tests/gpu/record_cycles.py --fake --out DIR      # here: the fake cuda.bindings

Writes `DIR/cuda-vmm.json` and `DIR/managed.json` (the per-process `*.jsonl` files they
are combined from stay beside them, with each cycle's `*.log`); a cycle that failed writes
`DIR/<backend>.partial.json` instead, its calls up to the failure (a refused readopt export
is answered, so swap-out and close are recorded after it), and the script exits 1.
Each cycle runs in a fresh process with `tests/support/cuda_recorder.py` wrapped around
the bindings (`MODELSWAP_CUDA_WRAP`), so its first call is the backend's `cuInit`:

- cuda-vmm: this process is the agent (`CudaVmmAllocator`: create, export, release,
  readopt import), `_client_child.py` the model process (`CudaVmmMapper`): reserve;
  swap-in (create → export → import → map → set access → copy in → read back); swap-out
  (synchronize → unmap → release on both sides); swap-in again; readopt (the model process
  exports what is mapped at each address, the agent imports and checks it); swap-out;
  close both. 128 MiB in two 64 MiB chunks.
- managed: `test_gpu_backends.test_managed_prefetch_round_trip` (cudaMallocManaged,
  advise, copy in, prefetch to the GPU, to the host and back, read back, free), 256 MiB.

On the fake (`--fake`) the model process's side runs in a thread of the agent's process
under the role "client" (the fake is per process); `--facts FILE` first gives the fake the
device attributes and GPU count a recording saw, so the code takes the real run's paths.
Standard library and the repository only: nothing needs installing on a GPU machine.
tests/unit/test_cuda_replay.py replays the committed recordings (tests/data/cuda_recordings)
against the fake through this script.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCES = [str(ROOT / "api"), str(ROOT / "sidecar"), str(ROOT / "client"), str(ROOT)]
for _path in reversed(SOURCES):
    if _path not in sys.path:
        sys.path.insert(0, _path)

MIB = 1 << 20
VMM_MODEL_BYTES = 128 * MIB
VMM_CHUNK_BYTES = 64 * MIB
BACKENDS = ("cuda-vmm", "managed")
FAKE_TOTAL_BYTES = 1024 * MIB
#: a cycle takes seconds on a GPU; two of these fit run_on_device.sh's 60 s for the step,
#: so a hung cycle still leaves the other its time. The fake copies bytes in Python and
#: shares the CPUs with the rest of `make test`: it gets longer.
CYCLE_TIMEOUT_SECONDS = 28.0
FAKE_CYCLE_TIMEOUT_SECONDS = 120.0
WRAP_ENV = "MODELSWAP_CUDA_WRAP"  # modelswap_client.cuda_compat.WRAP_ENV (not imported here)


# --- the model process's side: a real child process, or a thread on the fake --------------


class _ThreadChild:
    """`_client_child.serve` in a thread recording as "client" (the fake is per process)."""

    def __init__(self, uuid: str) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(60)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(uuid, theirs), daemon=True)
        self.thread.start()

    def _run(self, uuid: str, sock: socket.socket) -> None:
        from tests.gpu._client_child import serve
        from tests.support.cuda_recorder import recorder

        try:
            with recorder().role("client"):
                serve(uuid, sock)
        except BaseException as e:
            self.error = e
            sock.close()  # the agent's next read sees the end instead of waiting it out

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # the side that failed has closed its end
            socket.send_fds(self.sock, [json.dumps({"op": "exit"}).encode()], [])
        self.thread.join(timeout=60)
        self.sock.close()
        if self.error is not None:
            raise RuntimeError(f"the model process's side failed: {self.error!r}") from self.error


def _ask(child: Any, body: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
    """One request/reply; fds in the reply are returned under "fds" (the caller closes them)."""
    socket.send_fds(child.sock, [json.dumps(body).encode()], fds or [])
    data, received, _flags, _addr = socket.recv_fds(child.sock, 1 << 16, 64)
    if not data:
        problem = getattr(child, "error", None)
        if problem is None:  # a real process: its traceback is in the cycle's log
            try:
                problem = f"exit {child.proc.wait(timeout=10)}"
            except subprocess.TimeoutExpired:
                problem = "closed its socket but has not exited"
        raise RuntimeError(f"the model process's side ended during {body['op']}: {problem}")
    reply: dict[str, Any] = json.loads(data)
    reply["fds"] = list(received)
    return reply


# --- the cycles ---------------------------------------------------------------------------


def cuda_vmm_cycle(*, fake: bool) -> None:
    """See the module doc. This process is the agent; raises on any mismatch."""
    from modelswap_sidecar.allocators.base import Location
    from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator
    from tests.gpu.test_gpu_roundtrip import Child, _model_file

    allocator = CudaVmmAllocator(gpus=[0], nvml=None, chunk_bytes=VMM_CHUNK_BYTES)
    loc = Location.device(0)
    uuid = allocator.gpus[0].uuid
    weights, expected = _model_file(VMM_MODEL_BYTES)
    if fake:
        child: Any = _ThreadChild(uuid)
    else:
        env = dict(os.environ, MODELSWAP_CUDA_RECORD_ROLE="client")
        child = Child(uuid, env)
    count = VMM_MODEL_BYTES // VMM_CHUNK_BYTES
    specs = [{"offset": i * VMM_CHUNK_BYTES, "bytes": VMM_CHUNK_BYTES} for i in range(count)]
    held: list[Any] = []
    readopt_error: str | None = None
    try:
        address = _ask(child, {"op": "reserve", "bytes": VMM_MODEL_BYTES})["address"]

        def swap_in() -> None:
            chunks = [allocator.create(loc, VMM_CHUNK_BYTES) for _ in range(count)]
            held.extend(chunks)
            fds = [allocator.export_fd(c) for c in chunks]
            msg = {"op": "map", "chunks": specs, "host_bytes": VMM_MODEL_BYTES}
            try:
                reply = _ask(child, msg, [*fds, weights])
            finally:
                for fd in fds:
                    os.close(fd)  # sent: the agent's copies go too
            if reply.get("sha256") != expected or reply.get("address") != address:
                raise AssertionError(f"swap-in read back wrong bytes or moved: {reply}")

        def swap_out() -> None:
            if _ask(child, {"op": "unmap"}).get("ok") is not True:
                raise AssertionError("swap-out failed")
            for chunk in list(held):
                allocator.release(chunk)
                held.remove(chunk)

        swap_in()
        swap_out()
        swap_in()
        reply = _ask(child, {"op": "export"})
        try:
            if "error" in reply:  # swap out and close all the same: the rest is recorded too
                readopt_error = reply["error"]
            elif [s["offset"] for s in reply["exported"]] != [s["offset"] for s in specs]:
                raise AssertionError(f"readopt exported {reply['exported']}, mapped {specs}")
            else:
                # a restarted agent holds only what it readopts: the old handles go first
                for chunk in list(held):
                    allocator.release(chunk)
                    held.remove(chunk)
                for spec, fd in zip(reply["exported"], reply["fds"], strict=True):
                    held.append(allocator.adopt_fd(loc, fd, int(spec["bytes"])))
        finally:
            for fd in reply["fds"]:
                os.close(fd)
        swap_out()
    finally:
        # it may have ended already, its exit status collected by `_ask`: nothing to stop
        with contextlib.suppress(ProcessLookupError):
            child.stop()
        os.close(weights)
        allocator.close()
    proc = getattr(child, "proc", None)
    if proc is not None and proc.returncode != 0:
        raise AssertionError(f"the model process exited {proc.returncode}")
    if readopt_error is not None:
        raise AssertionError(f"readopt: the model process could not export: {readopt_error}")


def managed_cycle(*, fake: bool) -> None:
    """See the module doc: the managed GPU test, as it is, recorded as "client"."""
    from tests.gpu.test_gpu_backends import test_managed_prefetch_round_trip

    test_managed_prefetch_round_trip()


CYCLES = {"cuda-vmm": cuda_vmm_cycle, "managed": managed_cycle}
ROLES = {"cuda-vmm": ("agent", "client"), "managed": ("client",)}


# --- the fake -----------------------------------------------------------------------------


class _Setter:
    """The one `MonkeyPatch` method `fake_cuda.api.install` uses."""

    def setitem(self, mapping: Any, key: Any, value: Any) -> None:
        mapping[key] = value


def install_fake(facts: dict[str, Any] | None) -> Any:
    """A fresh fake machine as `cuda.bindings`, given the recorded facts (attributes, GPUs)."""
    from tests.support.cuda_replay import apply_facts
    from tests.support.fake_cuda.api import install
    from tests.support.fake_cuda.world import FakeCuda

    facts = facts or {}
    fake = FakeCuda(
        major=int(facts.get("major", 13)),
        gpus=int(facts.get("gpus", 1)),
        total_bytes=FAKE_TOTAL_BYTES,
    )
    apply_facts(fake, facts)
    install(_Setter(), fake)  # type: ignore[arg-type]
    sys.modules["_modelswap_fake_cuda"] = fake  # type: ignore[assignment]
    return fake


# --- driver -------------------------------------------------------------------------------


def run_cycle(
    backend: str, *, fake: bool, facts_file: str | None, fake_fail: str | None = None
) -> int:
    """The body of one cycle's process (`--cycle`): the recorder is already configured.
    `fake_fail` names a call the fake answers with an error the first time (tests)."""
    if fake:
        facts = None
        if facts_file:
            from tests.support.cuda_replay import facts_of, load_recording

            facts = facts_of(load_recording(facts_file))
        fake_machine = install_fake(facts)
        if fake_fail:
            fake_machine.fail(fake_fail, code=1)  # CUDA_ERROR_INVALID_VALUE
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    role = "client" if backend == "managed" else "agent"
    from tests.support.cuda_recorder import recorder

    with recorder().role(role):
        CYCLES[backend](fake=fake)
    if fake and fake_machine.violations:
        print(f"fake CUDA rule violations: {fake_machine.violations}", file=sys.stderr)
        return 1
    return 0


def record(
    backend: str,
    out: Path,
    *,
    fake: bool,
    facts_file: str | None = None,
    timeout_seconds: float | None = None,
    fake_fail: str | None = None,
) -> Path:
    """Run one cycle in a fresh process under the recorder; combine its files into
    `out/<backend>.json`. Raises RuntimeError (with the log's tail) when the cycle failed."""
    from tests.support.cuda_recorder import RECORD_ENV, ROLE_ENV, WRAP_SPEC
    from tests.support.cuda_replay import combine

    out.mkdir(parents=True, exist_ok=True)
    prefix = out / backend
    for role in ROLES[backend]:
        Path(f"{prefix}.{role}.jsonl").unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*SOURCES, env.get("PYTHONPATH", "")])
    env[WRAP_ENV] = WRAP_SPEC
    env[RECORD_ENV] = str(prefix)
    env[ROLE_ENV] = "agent"
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.pop("MODELSWAP_FAKE_CUDA_GPUS", None)  # a fake comes only from --fake
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cycle", backend]
    if fake:
        cmd.append("--fake")
    if facts_file:
        cmd += ["--facts", facts_file]
    if fake_fail:
        cmd += ["--fake-fail", fake_fail]
    log_path = out / f"{backend}.log"
    limit = timeout_seconds or (FAKE_CYCLE_TIMEOUT_SECONDS if fake else CYCLE_TIMEOUT_SECONDS)
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            timeout=limit, check=False,
        )  # fmt: skip
    seconds = time.monotonic() - started
    files = {role: Path(f"{prefix}.{role}.jsonl") for role in ROLES[backend]}
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        partial = {role: str(p) for role, p in files.items() if p.exists()}
        if partial:  # the calls up to the failure, readable beside the log (never replayed)
            recording = combine(backend, partial)
            (out / f"{backend}.partial.json").write_text(json.dumps(recording, indent=1) + "\n")
        raise RuntimeError(f"{backend} cycle exited {proc.returncode} ({log_path}):\n{tail}")
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise RuntimeError(f"{backend} cycle recorded nothing into {missing}")
    recording = combine(backend, {role: str(p) for role, p in files.items()})
    target = out / f"{backend}.json"
    target.write_text(json.dumps(recording, indent=1) + "\n")
    print(f"{backend}: the cycle's process ran {seconds:.1f} s", file=sys.stderr)
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory for the recordings")
    parser.add_argument("--fake", action="store_true", help="the fake cuda.bindings, no GPU")
    parser.add_argument("--facts", help="(with --fake) a recording whose device facts to use")
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="default: all")
    parser.add_argument(
        "--timeout",
        type=float,
        help=f"seconds per cycle (default {CYCLE_TIMEOUT_SECONDS:.0f}, {FAKE_CYCLE_TIMEOUT_SECONDS:.0f} on the fake)",
    )
    parser.add_argument("--cycle", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--fake-fail", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cycle:
        return run_cycle(
            args.cycle, fake=args.fake, facts_file=args.facts, fake_fail=args.fake_fail
        )
    if not args.out:
        parser.error("--out is required")
    out = Path(args.out)
    failed = 0
    for backend in args.backend or BACKENDS:
        facts = args.facts
        if args.fake and facts is None:
            default = ROOT / "tests" / "data" / "cuda_recordings" / f"{backend}.json"
            facts = str(default) if default.exists() else None
        try:
            path = record(
                backend, out, fake=args.fake, facts_file=facts, timeout_seconds=args.timeout
            )
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"FAILED {backend}: {e}", file=sys.stderr)
            failed += 1
            continue
        calls = sum(len(c) for c in json.loads(path.read_text())["calls"].values())
        print(f"recorded {backend}: {calls} calls -> {path} (sha256 {_sha256(path)[:12]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
