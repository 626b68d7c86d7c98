"""`modelswap operator`: the control plane (one leader among its replicas).

    modelswap operator [--kubeconfig PATH] [--namespace NS ... | --all-namespaces]
        [--operator-namespace NS] [--identity NAME] [--grace-seconds S]
        [--dead-node-retention-seconds S] [--defaults FILE] [--token-secret NAME]
        [--leader-lease NAME]
        [--leader-lease-seconds S] [--leader-renew-seconds S]
        [--node-lease-namespace NS] [--credentials-opt-in [--credentials-namespace NS ...]]
        [--http-port P] [--allow-plain-http]
        [--log-level LEVEL] [--plain-logs]

Each flag falls back to an environment variable (`MODELSWAP_` + the flag's name in upper
case with `_`, e.g. `MODELSWAP_GRACE_SECONDS`; the chart sets `MODELSWAP_IDENTITY` from the
pod name and `MODELSWAP_OPERATOR_NAMESPACE` from the pod's namespace; the namespace lists
fall back to comma-separated `MODELSWAP_NAMESPACES` and `MODELSWAP_CREDENTIALS_NAMESPACES`).
`--credentials-opt-in` limits the reading of models' credentialsSecretRef Secrets to the
`--credentials-namespace` namespaces (none listed: no namespace). `--grace-seconds`
must equal the agents' `control.graceSeconds`. Exit status: 0 after SIGTERM/SIGINT, 1 when
leadership was lost (the pod restarts and stands by), 2 for invalid settings.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import yaml

from modelswap_api.defaults import BUILTIN_DEFAULTS, check_defaults
from modelswap_api.errors import PolicyError
from modelswap_api.logs import configure_logging
from modelswap_operator.errors import SettingsError
from modelswap_operator.handlers import configure
from modelswap_operator.handlers import register as register_handlers
from modelswap_operator.login import connection_info
from modelswap_operator.runtime import Runtime
from modelswap_operator.settings import OperatorSettings

log = logging.getLogger(__name__)
ENV_PREFIX = "MODELSWAP_"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the operator (ModelDeployments -> node agents, status, routing)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster)")
    parser.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        help="serve ModelDeployments of this namespace (repeatable)",
    )
    parser.add_argument(
        "--all-namespaces",
        action="store_true",
        help="serve every namespace (the default when no --namespace)",
    )
    parser.add_argument("--operator-namespace", help="for the leader Lease and token Secret")
    parser.add_argument("--identity", help="this replica's name (the pod name)")
    parser.add_argument("--grace-seconds", type=float, help="= the agents' control.graceSeconds")
    parser.add_argument(
        "--dead-node-retention-seconds",
        type=float,
        help="delete a SwapNode this long after its node's Lease ran out (600)",
    )
    parser.add_argument("--defaults", type=Path, help="cluster policy defaults (YAML)")
    parser.add_argument("--token-secret", help="Secret holding the agents' control token")
    parser.add_argument("--leader-lease", help="name of the leader Lease")
    parser.add_argument("--leader-lease-seconds", type=int, help="leader Lease duration (15)")
    parser.add_argument("--leader-renew-seconds", type=float, help="leader Lease renewals (5)")
    parser.add_argument("--node-lease-namespace", help="where agents keep their node Leases")
    parser.add_argument(
        "--credentials-opt-in",
        action="store_true",
        help="read credentialsSecretRef Secrets only in the --credentials-namespace namespaces",
    )
    parser.add_argument(
        "--credentials-namespace",
        action="append",
        dest="credential_namespaces",
        help="a namespace opted in to source credentials (repeatable; with --credentials-opt-in)",
    )
    parser.add_argument("--http-port", type=int, help="/healthz, /readyz, /metrics (0: none)")
    parser.add_argument(
        "--allow-plain-http",
        action="store_true",
        help="talk plain HTTP to agents whose endpoint is http:// (tests)",
    )
    parser.add_argument("--log-level")
    parser.add_argument("--plain-logs", action="store_true", help="text logs instead of JSON")
    parser.set_defaults(handler=run)  # fmt: skip


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> OperatorSettings:
    """Flags first, then `MODELSWAP_*` variables, then the defaults. SettingsError names
    the flag or variable at fault."""

    def pick(name: str) -> Any:
        value = getattr(args, name.replace("-", "_"), None)
        if value is not None and value is not False:
            return value
        return environ.get(ENV_PREFIX + name.replace("-", "_").upper()) or None

    base = OperatorSettings()
    values: dict[str, Any] = {}
    if (kubeconfig := pick("kubeconfig")) is not None:
        values["kubeconfig"] = Path(kubeconfig)
    namespaces = args.namespaces or [
        n for n in (environ.get(ENV_PREFIX + "NAMESPACES") or "").split(",") if n.strip()
    ]
    if namespaces and args.all_namespaces:
        raise SettingsError("--namespace and --all-namespaces exclude each other")
    values["namespaces"] = tuple(n.strip() for n in namespaces)
    listed = environ.get(ENV_PREFIX + "CREDENTIALS_NAMESPACES") or ""
    credential_namespaces = getattr(args, "credential_namespaces", None) or [
        n for n in listed.split(",") if n.strip()
    ]
    if pick("credentials-opt-in") not in (None, "", "0", "false"):
        values["credential_namespaces"] = tuple(n.strip() for n in credential_namespaces)
    elif credential_namespaces:
        raise SettingsError("--credentials-namespace is read only with --credentials-opt-in")
    unserved = sorted(set(values.get("credential_namespaces") or ()) - set(values["namespaces"]))
    if values["namespaces"] and unserved:
        raise SettingsError(f"--credentials-namespace {unserved[0]}: not served (no --namespace)")
    for option, key in (
        ("operator-namespace", "namespace"),
        ("identity", "identity"),
        ("token-secret", "token_secret"),
        ("leader-lease", "leader_lease"),
        ("node-lease-namespace", "node_lease_namespace"),
        ("log-level", "log_level"),
    ):
        if (value := pick(option)) is not None:
            values[key] = str(value)
    for option, key, kind in (
        ("grace-seconds", "grace_seconds", float),
        ("dead-node-retention-seconds", "dead_node_retention_seconds", float),
        ("http-port", "http_port", int),
        ("leader-lease-seconds", "leader_lease_seconds", int),
        ("leader-renew-seconds", "leader_renew_seconds", float),
    ):
        if (value := pick(option)) is not None:
            try:
                values[key] = kind(value)
            except ValueError as e:
                raise SettingsError(f"--{option}: {value!r} is not a number") from e
    if values.get("grace_seconds", base.grace_seconds) <= 0:
        raise SettingsError("--grace-seconds must be more than 0")
    if values.get("dead_node_retention_seconds", base.dead_node_retention_seconds) < 0:
        raise SettingsError("--dead-node-retention-seconds must not be negative")
    values["allow_plain_http"] = bool(pick("allow-plain-http") not in (None, "", "0", "false"))
    values["json_logs"] = not args.plain_logs
    values["defaults"] = _defaults(pick("defaults"))
    return OperatorSettings(**values)


def _defaults(path: str | Path | None) -> dict[str, Any]:
    try:
        if path is None:
            return check_defaults(BUILTIN_DEFAULTS)
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        return check_defaults(loaded or {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SettingsError(f"--defaults {path}: {e}") from e
    except PolicyError as e:
        raise SettingsError(f"--defaults {path}: {e}") from e


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args, os.environ)
    except SettingsError as e:
        sys.stderr.write(f"modelswap operator: {e}\n")
        return 2
    handler = configure_logging(settings.log_level.upper(), json_lines=settings.json_logs)
    handler.addFilter(_without_kopf_settings)
    return asyncio.run(operate(settings))


def _without_kopf_settings(record: logging.LogRecord) -> bool:
    """kopf attaches its whole OperatorSettings to every record it logs (`settings`): a few
    kilobytes of repr on every JSON line. Keep the record, drop that attribute."""
    record.__dict__.pop("settings", None)
    return True


async def operate(settings: OperatorSettings) -> int:
    stop = asyncio.Event()
    runtime = Runtime(settings, on_lost=stop.set)
    registry = kopf.OperatorRegistry()
    register_handlers(registry, runtime, login=lambda **_: connection_info(runtime.api))
    kopf_settings = kopf.OperatorSettings()
    configure(kopf_settings)
    await kopf.operator(
        registry=registry,
        settings=kopf_settings,
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        stop_flag=stop,
    )
    return 1 if runtime.lost else 0
