"""`modelswap sidecar`: the node agent (the design card's sidecar), one asyncio process.

    modelswap sidecar --config /etc/modelswap/agent.yaml [--node-name N]
        [--control-port P] [--metrics-port P] [--triton-url HOST:PORT]
        [--triton-pid-file F] [--state-dir D] [--log-level LEVEL]
        [--advertise-host HOST] [--holder-identity NAME]

The flags override the file's keys (see `settings.py`). The node supervisor runs this as
its agent child; local mode and tests run it directly. In a cluster the per-pod values
(node name, pod IP, pod name) come as flags, because one settings file (a ConfigMap) serves
every node: the chart writes `--node-name $(NODE_NAME) --advertise-host $(POD_IP)
--holder-identity $(POD_NAME)` into the container's arguments, and the kubelet expands
them from the downward API — the agent itself reads no environment.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from modelswap_api.logs import configure_logging
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import load_settings

log = logging.getLogger(__name__)

_OVERRIDES = {
    "node_name": "nodeName",
    "control_port": "control.port",
    "metrics_port": "metrics.port",
    "triton_url": "triton.url",
    "triton_pid_file": "triton.pidFile",
    "state_dir": "stateDir",
    "log_level": "logLevel",
    "advertise_host": "kube.advertiseHost",
    "holder_identity": "kube.holderIdentity",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sidecar",
        help="run the node agent (engine, policy loop, Triton driver, control API)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help="settings YAML")
    parser.add_argument("--node-name")
    parser.add_argument("--control-port", type=int)
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--triton-url", help="host:port of Triton's HTTP endpoint")
    parser.add_argument("--triton-pid-file", help="file holding the current Triton's pid")
    parser.add_argument("--state-dir")
    parser.add_argument("--log-level")
    parser.add_argument(
        "--advertise-host", help="kube.advertiseHost: the address in the SwapNode (the pod IP)"
    )
    parser.add_argument(
        "--holder-identity", help="kube.holderIdentity: the node Lease's holder (the pod name)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    overrides = {key: getattr(args, attr) for attr, key in _OVERRIDES.items()}
    try:
        settings = load_settings(args.config, overrides)
    except SettingsError as e:
        sys.stderr.write(f"modelswap sidecar: {e}\n")
        return 2
    configure_logging(settings.log_level.upper(), json_lines=settings.json_logs)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per request
    from modelswap_sidecar.agent.running import serve  # noqa: PLC0415 - heavy imports

    return serve(settings)
