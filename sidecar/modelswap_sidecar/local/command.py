"""`modelswap up` and `modelswap status`: local mode, one node without Kubernetes.

    modelswap up [-f DIR] [--run-dir D] [--model-root R] [--defaults FILE]
                 [--host H] [--port P] [--sim-gpu-bytes B ...] [--pace-gbps G]
                 [--allocator A] [--triton-binary T] [--dev] [--no-reload]
    modelswap status [--run-dir D] [-o wide]

`up` serves every ModelDeployment YAML file in DIR (default ./examples) through real
Triton and the agent (sim GPUs), with the gateway on localhost, applies edits to the
files while it runs, and reloads a model whose source folder (model.py, weights) changes.
With --dev, a model annotated `modelswap.io/dev: "true"` is served by your own process
(a script or a notebook attaches as it). Ctrl-C stops it and everything it started.
`status` prints the columns of `kubectl get md`. See docs/LOCAL.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from modelswap_api.defaults import BUILTIN_DEFAULTS, check_defaults
from modelswap_api.quantities import parse_bytes
from modelswap_sidecar.local.errors import LocalModeError

log = logging.getLogger(__name__)

DEFAULT_RUN_DIR = Path(".modelswap")
DEFAULT_FOLDER = Path("examples")
EXIT_BAD_SETTINGS = 2
EXIT_NOT_RUNNING = 1


def register_up(subparsers: Any) -> None:
    up = subparsers.add_parser(
        "up",
        help="run one node locally: agent + Triton + gateway, models from a YAML folder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("-f", "--folder", type=Path, default=DEFAULT_FOLDER, metavar="DIR")
    up.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    up.add_argument(
        "--model-root", type=Path, help="where /models/<x> sources are (default DIR/models)"
    )
    up.add_argument("--defaults", type=Path, help="local policy defaults (YAML)")
    up.add_argument("--host", default="127.0.0.1", help="the gateway's address")
    up.add_argument("--port", type=int, default=8080, help="the gateway's port (0: any free)")
    up.add_argument(
        "--sim-gpu-bytes",
        action="append",
        metavar="BYTES",
        help="capacity of one sim GPU (repeat for more; default 240Mi)",
    )
    up.add_argument(
        "--allocator",
        choices=("auto", "sim", "cuda-vmm"),
        default="auto",
        help="the agent's GPU memory backend (auto: cuda-vmm when a capable GPU is present)",
    )
    up.add_argument(
        "--pace-gbps",
        type=float,
        metavar="GBPS",
        help="sim GPUs only: pace every model's copies to an emulated link of this many GB/s "
        "(figures are then scaled, not link measurements; default unpaced)",
    )
    up.add_argument("--triton-binary", type=Path)
    up.add_argument(
        "--dev",
        action="store_true",
        help='the dev loop: models annotated modelswap.io/dev: "true" are served by your own '
        "process (a script or a notebook attaches as one), never by Triton",
    )
    up.add_argument(
        "--no-reload",
        dest="reload",
        action="store_false",
        help="do not reload a model whose source folder (model.py, weights) changes",
    )
    up.add_argument("--log-level", default="info")
    up.set_defaults(handler=run_up_command)


def register_status(subparsers: Any) -> None:
    status = subparsers.add_parser(
        "status",
        help="the models local mode serves (the columns of `kubectl get md`)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    status.add_argument(
        "-o",
        "--output",
        choices=("wide",),
        help="wide: also HOST, KV (GPU/host), SWAP-INS and GPU, as `kubectl get md -o wide`",
    )
    status.set_defaults(handler=run_status_command)


def _defaults(path: Path | None) -> dict[str, Any]:
    if path is None:
        return check_defaults(BUILTIN_DEFAULTS)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise LocalModeError(f"--defaults {path}: {e}") from e
    try:
        return check_defaults(loaded or {})
    except Exception as e:  # PolicyError/ValueError name the field
        raise LocalModeError(f"--defaults {path}: {e}") from e


def settings_from_args(args: argparse.Namespace) -> Any:
    from modelswap_sidecar.local.rundir import RunDir  # noqa: PLC0415 - keep `--help` quick
    from modelswap_sidecar.local.settings import (  # noqa: PLC0415
        DEFAULT_SIM_GPU_BYTES,
        LocalSettings,
    )
    from modelswap_sidecar.local.up import default_triton_binary  # noqa: PLC0415

    folder = args.folder.resolve()
    if not folder.is_dir():
        raise LocalModeError(f"-f {args.folder}: not a folder")
    try:
        gpus = tuple(parse_bytes(b) for b in args.sim_gpu_bytes or ()) or (DEFAULT_SIM_GPU_BYTES,)
    except ValueError as e:
        raise LocalModeError(f"--sim-gpu-bytes: {e}") from e
    pace = args.pace_gbps
    if pace is not None and not (math.isfinite(pace) and pace > 0):
        raise LocalModeError(f"--pace-gbps: {pace} is not a positive number of GB/s")
    if pace is not None and args.allocator == "cuda-vmm":
        raise LocalModeError("--pace-gbps: copy pacing emulates a link on sim GPUs only")
    triton = args.triton_binary or default_triton_binary(Path.cwd())
    if not triton.exists():
        raise LocalModeError(f"--triton-binary {triton}: not found (`make setup` installs it)")
    return LocalSettings(
        folder=folder,
        run_dir=RunDir(args.run_dir.resolve()),
        model_root=(args.model_root or folder / "models").resolve(),
        defaults=_defaults(args.defaults),
        triton_binary=triton.resolve(),
        gateway_host=args.host,
        gateway_port=args.port,
        sim_gpu_bytes=gpus,
        allocator=args.allocator,
        pace_gbps=pace,
        dev=bool(getattr(args, "dev", False)),  # a Namespace built by hand may lack them
        reload=bool(getattr(args, "reload", True)),
        log_level=args.log_level,
    )


def run_up_command(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from modelswap_sidecar.local.up import run_up  # noqa: PLC0415

    try:
        settings = settings_from_args(args)
        return run_up(settings)
    except (ValueError, LocalModeError) as e:
        sys.stderr.write(f"modelswap up: {e}\n")
        return EXIT_BAD_SETTINGS


def run_status_command(args: argparse.Namespace) -> int:
    from modelswap_api.terminal import printable  # noqa: PLC0415
    from modelswap_sidecar.local.rundir import RunDir, pid_alive, read_json  # noqa: PLC0415
    from modelswap_sidecar.local.status import (  # noqa: PLC0415
        dev_lines,
        explanations,
        reload_lines,
        rows,
        table,
    )

    run = RunDir(args.run_dir.resolve())
    state = read_json(run.state_file)
    if not state or not state.get("running") or not pid_alive(int(state.get("pid", 0))):
        sys.stderr.write(f"modelswap status: local mode is not running (in {run.root})\n")
        return EXIT_NOT_RUNNING
    try:
        token = Path(state["tokenFile"]).read_text().strip()
        response = httpx.get(
            f"{state['controlUrl']}/v1/models",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10.0,
        )
        response.raise_for_status()
    except (OSError, httpx.HTTPError) as e:
        sys.stderr.write(f"modelswap status: the agent does not answer (yet?): {e}\n")
        return EXIT_NOT_RUNNING
    models = response.json().get("models", [])
    wide = getattr(args, "output", None) == "wide"
    body = rows(
        models,
        state.get("models", []),
        node_name=str(state["nodeName"]),
        now_seconds=time.time(),
        wide=wide,
    )
    print(table(body, wide=wide))
    for line in explanations(models):
        print(line)
    local = state.get("models", [])
    for line in reload_lines(local, now_seconds=time.time()):
        print(line)
    for line in dev_lines(local, socket_path=str(state.get("agentSocket"))):
        print(line)
    for problem in state.get("problems", []):
        print(printable(f"skipped: {problem}"))
    print(f"gateway: {state['gatewayUrl']}")
    if state.get("gatewayGrpcAddress"):
        print(f"gateway gRPC: {state['gatewayGrpcAddress']}")
    return 0
