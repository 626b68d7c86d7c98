"""`modelswap node [--config FILE] [flags] [-- AGENT COMMAND…]`: PID 1 of the node container.

Runs the agent and `tritonserver` side by side, each in its own process group and, when
started as root, under its own uid; restarts whichever dies; forwards SIGHUP, SIGTERM and
SIGINT; removes a dead Triton's /dev/shm regions; reaps every orphan; on SIGTERM stops both
(SIGKILL after the grace period) and exits 0. Exits 1 after giving up on a crash-looping
child, 2 on bad settings. See docs/NODE.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from modelswap_sidecar.supervisor.children import node_children
from modelswap_sidecar.supervisor.core import Supervisor
from modelswap_sidecar.supervisor.errors import IdentityError, SettingsError
from modelswap_sidecar.supervisor.identity import SystemUsers
from modelswap_sidecar.supervisor.settings import (
    SettingsOverrides,
    SupervisorSettings,
    build_settings,
    read_file,
)

log = logging.getLogger(__name__)

EXIT_BAD_SETTINGS = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "node",
        help="run a GPU node: supervise the agent and tritonserver (the node container's PID 1)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help="settings file (YAML or JSON)")
    parser.add_argument("--agent-user", help="user (name or uid) of the agent, when root")
    parser.add_argument("--runtime-user", help="user (name or uid) of tritonserver, when root")
    parser.add_argument("--tritonserver", help="the tritonserver executable (name or path)")
    parser.add_argument("--model-repository", type=Path, help="Triton's model repository")
    parser.add_argument("--triton-http-port", type=int)
    parser.add_argument("--triton-grpc-port", type=int)
    parser.add_argument("--triton-metrics-port", type=int, help="omit: Triton's metrics off")
    parser.add_argument("--shm-prefix", help="Triton's python-backend shm region prefix")
    parser.add_argument("--stop-grace-seconds", type=float)
    parser.add_argument("--state-file", type=Path, help="where to write the supervisor state")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "agent_command",
        nargs="*",
        metavar="AGENT_COMMAND",
        help="the agent's command line, after `--` (default: modelswap sidecar)",
    )
    parser.set_defaults(handler=run)


def settings_from_args(args: argparse.Namespace) -> SupervisorSettings:
    data = read_file(args.config) if args.config is not None else {}
    overrides = SettingsOverrides(
        agent_command=tuple(args.agent_command) or None,
        agent_user=args.agent_user,
        runtime_user=args.runtime_user,
        triton_binary=args.tritonserver,
        model_repository=args.model_repository,
        http_port=args.triton_http_port,
        grpc_port=args.triton_grpc_port,
        metrics_port=args.triton_metrics_port,
        shm_prefix=args.shm_prefix,
        stop_grace_seconds=args.stop_grace_seconds,
        state_file=args.state_file,
    )
    return build_settings(data, overrides)


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=args.log_level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    try:
        settings = settings_from_args(args)
        children = node_children(
            settings, environ=dict(os.environ), euid=os.geteuid(), users=SystemUsers()
        )
    except (SettingsError, IdentityError) as e:
        print(f"modelswap node: {e}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    for note in children.notes:
        log.warning("%s", note)
    log.info(
        "supervising the agent (%s) and tritonserver (%s, shm prefix %s)",
        " ".join(children.agent.argv),
        settings.runtime.triton.binary,
        children.shm_prefix,
    )
    supervisor = Supervisor(
        children.specs,
        policy=settings.restart,
        stop_grace_seconds=settings.stop_grace_seconds,
        state_file=settings.state_file,
        reap_orphans=True,
    )
    code = supervisor.run()
    log.info("supervisor exiting with status %d", code)
    return code
