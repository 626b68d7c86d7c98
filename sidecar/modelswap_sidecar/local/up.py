"""`modelswap up`: one node without Kubernetes, in this process.

The same `Supervisor` as `modelswap node` runs the agent (`modelswap sidecar`, local mode:
sim GPUs, no fencing, the gateway on localhost) and `tritonserver`, each in a process
group of its own; a `FolderWatcher` thread plays the operator, pushing the folder's
ModelDeployments to the agent's control API and reloading a model whose source folder
changed. SIGINT (Ctrl-C) or SIGTERM stops the supervisor, which stops both children
(Triton's stubs with it) and removes Triton's shm regions; the run directory's transient
parts are removed last, so nothing is left. With `--dev` it prints how a developer's own
process attaches as a dev model (docs/LOCAL.md, "Developing a model outside Triton").
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.engine.hoststore import MEMORY_FILESYSTEMS, filesystem_of
from modelswap_sidecar.gpu.devices import choose_allocator_backend
from modelswap_sidecar.local.errors import AlreadyRunningError, LocalModeError
from modelswap_sidecar.local.manifests import read_folder
from modelswap_sidecar.local.rundir import pid_alive, read_json, write_json
from modelswap_sidecar.local.settings import MODELS_PREFIX, LocalSettings, agent_document
from modelswap_sidecar.local.sources import SourceWatch
from modelswap_sidecar.local.status import attach_call
from modelswap_sidecar.local.watcher import Applied, FolderWatcher
from modelswap_sidecar.supervisor.children import node_children
from modelswap_sidecar.supervisor.core import Supervisor
from modelswap_sidecar.supervisor.identity import SystemUsers
from modelswap_sidecar.supervisor.restarts import RestartPolicy
from modelswap_sidecar.supervisor.settings import AgentSettings as AgentChild
from modelswap_sidecar.supervisor.settings import RuntimeSettings, SupervisorSettings
from modelswap_sidecar.triton.naming import triton_model_name
from modelswap_sidecar.triton.process import TritonSettings, free_loopback_port, pick_ports

log = logging.getLogger(__name__)


def check_not_running(settings: LocalSettings) -> None:
    state = read_json(settings.run_dir.state_file)
    if state and isinstance(state.get("pid"), int) and state.get("running"):
        pid = int(state["pid"])
        if pid != os.getpid() and pid_alive(pid):
            raise AlreadyRunningError(
                f"modelswap up is already running in {settings.run_dir.root} (pid {pid}); "
                "stop it first, or pass another --run-dir"
            )


def _state_doc(
    settings: LocalSettings, base: dict[str, Any], applied: Applied | None, running: bool
) -> dict[str, Any]:
    doc = {**base, "running": running, "updatedAt": time.time()}
    if applied is not None:
        doc["pushes"] = applied.pushes
        doc["models"] = [
            {
                "uid": m.uid,
                "namespace": m.namespace,
                "name": m.name,
                "model": m.spec.get("model", {}).get("name") or m.name,
                "file": str(m.file),
                "appliedAt": applied.first_applied.get(m.uid),
                "outcome": applied.outcomes.get(m.uid),
                "dev": m.dev,
                "engineName": triton_model_name(m.uid),
                "weightsBytes": m.spec.get("model", {}).get("weightsBytes"),
                **(
                    {"reloads": applied.reloads[m.uid].to_dict()}
                    if m.uid in applied.reloads
                    else {}
                ),
            }
            for m in applied.models
        ]
        doc["problems"] = [str(p) for p in applied.problems]
    return doc


def dev_instructions(settings: LocalSettings, socket_path: Path) -> list[str]:
    """How a developer's process attaches as each dev model of the folder (as it is now;
    a dev model added later is logged when it is served, and `modelswap status` lists
    them all)."""
    models, _ = read_folder(settings.folder, settings.defaults, dev_loop=True)
    lines = [
        "  dev loop     on: your own process attaches as a dev model (docs/LOCAL.md,",
        '               "Developing a model outside Triton"):',
        f"                 export MODELSWAP_SOCKET={socket_path}",
    ]
    dev = [m for m in models if m.dev]
    for m in dev:
        weights = m.spec.get("model", {}).get("weightsBytes")
        lines.append(
            f"                 {m.namespace}/{m.name}: "
            f"{attach_call(triton_model_name(m.uid), weights)}"
        )
    if not dev:
        lines.append('               (no dev model yet: annotate one `modelswap.io/dev: "true"`)')
    return lines


def _announce(
    out: TextIO,
    settings: LocalSettings,
    gateway_url: str,
    control_url: str,
    socket_path: Path,
    *,
    grpc_address: str,
) -> None:
    pace = settings.pace_gbps
    paced = "" if pace is None else f", copies paced to {pace:g} GB/s (scaled)"
    reload = "on (a model whose files change is loaded again)" if settings.reload else "off"
    lines = [
        f"modelswap up: serving {settings.folder} (run dir {settings.run_dir.root})",
        f"  gateway      {gateway_url}   (KServe v2: /v2/models/<name>/infer, "
        "OpenAI: /v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings)",
        f"  gateway gRPC {grpc_address}   (Triton's gRPC API: tritonclient.grpc, "
        "perf_analyzer -i grpc; a bare model name, or <namespace>/<name>)",
        f"  control API  {control_url}   (token in {settings.run_dir.token_file})",
        f"  sim GPUs     {', '.join(f'{b >> 20}Mi' for b in settings.sim_gpu_bytes)}{paced}",
        f"  reload       {reload}",
        *(dev_instructions(settings, socket_path) if settings.dev else []),
        "  `modelswap status` shows the models; Ctrl-C stops everything.",
    ]
    out.write("\n".join(lines) + "\n")
    out.flush()


#: where a host store goes when the run dir is on disk
SHM = Path("/dev/shm")


def prepare_run_dir(settings: LocalSettings) -> str:
    run = settings.run_dir
    run.root.mkdir(parents=True, exist_ok=True)
    for path in run.transient():
        _remove(path)
    run.dev_models_file.unlink(missing_ok=True)  # the last run's: nobody is vouched for yet
    run.repository.mkdir(parents=True)
    _memory_backed_store(run.host_store)
    return run.write_token()


def _memory_backed_store(store: Path) -> None:
    """The host store must be memory-backed (a GPU backend's clients pin its files, which a
    disk filesystem refuses; and it is meant to be memory): on a run dir on disk, `store`
    is a link to a folder of its own in /dev/shm, removed with it."""
    if filesystem_of(store.parent) in MEMORY_FILESYSTEMS or not SHM.is_dir():
        return
    target = tempfile.mkdtemp(prefix="modelswap-local-store-", dir=SHM)  # 0700
    store.symlink_to(target, target_is_directory=True)


def _remove(path: Path) -> None:
    """Remove a run's folder, or the /dev/shm folder it links to and the link."""
    if path.is_symlink():
        shutil.rmtree(os.path.realpath(path), ignore_errors=True)
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def clean_run_dir(settings: LocalSettings) -> None:
    run = settings.run_dir
    for path in run.transient():
        _remove(path)
    for path in (run.token_file, run.supervisor_state, run.dev_models_file):
        path.unlink(missing_ok=True)


def run_up(settings: LocalSettings, out: TextIO = sys.stdout) -> int:
    check_not_running(settings)
    backend = choose_allocator_backend(settings.allocator)  # auto: logs what it found
    if backend == "cuda-vmm" and settings.pace_gbps is not None:
        raise LocalModeError(
            "--pace-gbps: copy pacing emulates a link on sim GPUs only, and the allocator "
            "here is cuda-vmm (pass --allocator sim)"
        )
    if backend == "cuda-vmm":
        log.warning(
            "allocator cuda-vmm: model memory is GPU memory; the examples' models read it "
            "through host (numpy) views and need --allocator sim"
        )
    token = prepare_run_dir(settings)
    run = settings.run_dir
    ports = pick_ports(metrics=False)
    control_port = free_loopback_port()
    gateway_port = settings.gateway_port or free_loopback_port()
    grpc_port = free_loopback_port()  # the gateway's gRPC front (Triton's gRPC API)
    while grpc_port in (gateway_port, ports.http, ports.grpc, control_port):
        grpc_port = free_loopback_port()
    triton_url = f"127.0.0.1:{ports.http}"
    metrics_port = free_loopback_port()
    document = agent_document(
        settings,
        triton_url=triton_url,
        control_port=control_port,
        gateway_port=gateway_port,
        metrics_port=metrics_port,
        allocator=backend,
        grpc_port=grpc_port,
        triton_grpc_url=f"127.0.0.1:{ports.grpc}",
    )
    run.agent_settings.write_text(yaml.safe_dump(document, sort_keys=False))
    socket_path = settings_from_document(document).socket_path
    supervisor_settings = SupervisorSettings(
        agent=AgentChild(
            command=(
                sys.executable,
                "-m",
                "modelswap_api.cli",
                "sidecar",
                "--config",
                str(run.agent_settings),
            )
        ),
        runtime=RuntimeSettings(
            triton=TritonSettings(
                binary=settings.triton_binary,
                model_repository=run.repository,
                exit_timeout_seconds=5,
            ),
            ports=ports,
        ),
        stop_grace_seconds=settings.stop_grace_seconds,
        state_file=run.supervisor_state,
    )
    children = node_children(
        supervisor_settings, environ=dict(os.environ), euid=os.geteuid(), users=SystemUsers()
    )
    supervisor = Supervisor(
        children.specs,
        policy=RestartPolicy(),
        stop_grace_seconds=settings.stop_grace_seconds,
        state_file=run.supervisor_state,
        reap_orphans=False,
    )
    gateway_host = settings.gateway_host
    if gateway_host in ("0.0.0.0", ""):
        gateway_host = "127.0.0.1"
    gateway_url = f"http://{gateway_host}:{gateway_port}"
    grpc_address = f"{gateway_host}:{grpc_port}"
    control_url = f"http://127.0.0.1:{control_port}"
    base: dict[str, Any] = {
        "pid": os.getpid(),
        "startedAt": time.time(),
        "folder": str(settings.folder),
        "runDir": str(run.root),
        "nodeName": settings.node_name,
        "gatewayUrl": gateway_url,
        "gatewayGrpcAddress": grpc_address,
        "tritonGrpcAddress": f"127.0.0.1:{ports.grpc}",
        "controlUrl": control_url,
        "metricsUrl": f"http://127.0.0.1:{metrics_port}/metrics",
        "tritonUrl": f"http://{triton_url}",
        "tokenFile": str(run.token_file),
        "shmPrefix": children.shm_prefix,
        "agentSocket": str(socket_path),
        "dev": settings.dev,
    }

    def on_change(applied: Applied) -> None:
        write_json(run.state_file, _state_doc(settings, base, applied, running=True))

    watcher = FolderWatcher(
        settings.folder,
        settings.defaults,
        control_url=control_url,
        token=token,
        node_name=settings.node_name,
        poll_seconds=settings.poll_seconds,
        on_change=on_change,
        model_root=settings.model_root,
        models_prefix=MODELS_PREFIX,
        source_watch=(
            SourceWatch(
                settle_seconds=settings.reload_settle_seconds,
                max_delay_seconds=settings.reload_max_delay_seconds,
                min_interval_seconds=settings.reload_min_interval_seconds,
            )
            if settings.reload
            else None
        ),
        dev_models_file=run.dev_models_file if settings.dev else None,
    )
    write_json(run.state_file, _state_doc(settings, base, None, running=True))
    _announce(out, settings, gateway_url, control_url, socket_path, grpc_address=grpc_address)
    watcher.start()
    try:
        code = supervisor.run(install_signal_handlers=True)
    finally:
        watcher.stop()
        clean_run_dir(settings)
        write_json(run.state_file, _state_doc(settings, base, watcher.applied, running=False))
    log.info("modelswap up: stopped (status %d)", code)
    return code


def default_triton_binary(cwd: Path) -> Path:
    """`.venv-triton/bin/tritonserver` of this checkout (or of `cwd`), else on PATH."""
    here = Path(__file__).resolve().parents[3]
    for root in (cwd, here):
        candidate = root / ".venv-triton" / "bin" / "tritonserver"
        if candidate.exists():
            return candidate
    found = shutil.which("tritonserver")
    return Path(found) if found else cwd / ".venv-triton" / "bin" / "tritonserver"
