"""Settings of `modelswap up`, read once from the command line into a frozen dataclass,
and the agent's settings document built from them (pure).

    folder              the ModelDeployment YAML folder (-f, default ./examples)
    runDir              --run-dir, default ./.modelswap
    modelRoot           --model-root: where `/models/<x>` sources live on this machine;
                        default `<folder>/models`
    defaults            --defaults FILE: local policy defaults (the shape of
                        modelswap_api.defaults.BUILTIN_DEFAULTS, which is the default)
    gateway             --host 127.0.0.1, --port 8080 (0: any free port)
    simGpuBytes         --sim-gpu-bytes 240Mi (repeat for more sim GPUs): one sim GPU that
                        holds two of the three example models, so they compete
    allocator           --allocator auto|sim|cuda-vmm (auto: cuda-vmm when a driver and a
                        GPU with VMM + POSIX-fd handles are present, else sim)
    paceGBps            --pace-gbps G: every sim GPU's `gpus[].paceGBps` (models' copies
                        paced to an emulated G GB/s link; sim only); default unpaced
    dev                 --dev: the dev loop: models annotated `modelswap.io/dev: "true"`
                        are served by a developer's own process (the agent's `dev`
                        section); default off
    reload              --no-reload turns it off: a served model whose source folder
                        changes (model.py, weights) is loaded again (`local/sources.py`)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelswap_sidecar.local.rundir import RunDir

MIB = 1 << 20
#: One sim GPU: room for both real examples (embed 87Mi, tinyllama 3Mi), or for the pinned
#: toy chat model and one more of examples/toy (not all three, under the high watermark:
#: the toy models compete for it).
DEFAULT_SIM_GPU_BYTES = 240 * MIB
#: Mounted sources are written `/models/<x>` in the examples.
MODELS_PREFIX = "/models"


@dataclass(frozen=True, kw_only=True)
class LocalSettings:
    folder: Path
    run_dir: RunDir
    model_root: Path
    defaults: Mapping[str, Any]
    triton_binary: Path
    node_name: str = "local"
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    sim_gpu_bytes: tuple[int, ...] = (DEFAULT_SIM_GPU_BYTES,)
    #: "auto" | "sim" | "cuda-vmm"; `run_up` resolves auto before writing the agent's file.
    allocator: str = "auto"
    #: Every sim GPU's emulated link (`gpus[].paceGBps`, GB/s); None: unpaced.
    pace_gbps: float | None = None
    #: The dev loop (`--dev`): dev models attach from a developer's own process.
    dev: bool = False
    #: Reload a served model whose source folder changed (`--no-reload`: never).
    reload: bool = True
    #: A changed source folder is reloaded once it has been quiet this long (an editor
    #: writes a file in several steps) ...
    reload_settle_seconds: float = 1.0
    #: ... or this long after its first unreloaded change, if it never goes quiet.
    reload_max_delay_seconds: float = 10.0
    #: A model is reloaded at most once per this many seconds.
    reload_min_interval_seconds: float = 2.0
    host_store_bytes: int = 4 << 30
    pool_chunk_bytes: int = 32 * MIB
    #: How often the folder is looked at for edits.
    poll_seconds: float = 1.0
    #: A model whose file is gone is unloaded this long after (the operator's grace).
    unload_grace_seconds: float = 5.0
    #: Interval of the agent's policy loop.
    policy_interval_seconds: float = 0.25
    stop_grace_seconds: float = 15.0
    log_level: str = "info"


def agent_document(
    settings: LocalSettings,
    *,
    triton_url: str,
    control_port: int,
    gateway_port: int,
    metrics_port: int,
    allocator: str = "sim",
    grpc_port: int = 0,
    triton_grpc_url: str | None = None,
) -> dict[str, Any]:
    """The agent's settings (see `agent/settings/document.py`) for local mode. `allocator` is the
    resolved backend: sim GPUs from `sim_gpu_bytes`, or cuda-vmm over every capable GPU.
    `grpc_port` (with `triton_grpc_url`, Triton's gRPC host:port): the gateway's gRPC front;
    0: none."""
    grpc = {"grpcPort": grpc_port} if grpc_port and triton_grpc_url else {}
    triton_grpc = {"grpcUrl": triton_grpc_url} if grpc else {}
    run = settings.run_dir
    pace = {} if settings.pace_gbps is None else {"paceGBps": settings.pace_gbps}
    gpus = (
        [
            {"uuid": f"sim-gpu-{i}", "capacityBytes": b, **pace}
            for i, b in enumerate(settings.sim_gpu_bytes)
        ]
        if allocator == "sim"
        else []
    )
    return {
        "nodeName": settings.node_name,
        "localMode": True,
        "allocator": allocator,
        "gpus": gpus,
        "poolChunkBytes": settings.pool_chunk_bytes,
        "hostStore": {"dir": str(run.host_store), "capacityBytes": settings.host_store_bytes},
        "socketDir": str(run.socket_dir),
        "stateDir": str(run.agent_state),
        "sourceCache": {"dir": str(run.source_cache), "capacityBytes": 4 << 30},
        "modelRoots": {MODELS_PREFIX: str(settings.model_root)},
        "control": {
            "host": "127.0.0.1",
            "port": control_port,
            "tokenFile": str(run.token_file),
            "graceSeconds": settings.unload_grace_seconds,
        },
        "metrics": {"host": "127.0.0.1", "port": metrics_port},
        "gateway": {"host": settings.gateway_host, "port": gateway_port, **grpc},
        "triton": {
            "url": triton_url,
            **triton_grpc,
            "repository": str(run.repository),
            "supervisorStateFile": str(run.supervisor_state),
            "loadTimeoutSeconds": 120,
        },
        "policy": {"intervalSeconds": settings.policy_interval_seconds},
        "logLevel": settings.log_level,
        "jsonLogs": False,
        **({"dev": {"modelsFile": str(run.dev_models_file)}} if settings.dev else {}),
    }
