"""`modelswap uninstall`: make a release safe to `helm uninstall` (see `uninstall.py`).

    modelswap uninstall --release NAME [--operator-namespace NS] [--kubeconfig PATH]
        [--namespace NS ...] [--wait-seconds S]

The chart's pre-delete hook runs it, so `helm uninstall` does this by itself; by hand, run
it before `helm uninstall --no-hooks`. The operator's Deployment and leader Lease default
to the chart's names (`<release>-modelswap-operator`, `modelswap-operator`). Each flag
falls back to `MODELSWAP_` + its name (`MODELSWAP_RELEASE`, ...); `--kubeconfig` to
`MODELSWAP_KUBECONFIG`, then the in-cluster config. Exit status: 0 done, 1 failed (the
message says at what; running it again goes on from there), 2 invalid flags.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import Any

from modelswap_api import kube
from modelswap_api.errors import KubeConfigError
from modelswap_api.logs import configure_logging
from modelswap_operator.uninstall import Target, Uninstaller, UninstallError

ENV_PREFIX = "MODELSWAP_"
#: Helm's rule for release names (and a Kubernetes name's for the rest).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?$")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "uninstall",
        help="stop the operator and release every ModelDeployment before helm uninstall",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--release", help="the helm release (names the operator's objects)")
    parser.add_argument("--operator-namespace", help="the release's namespace")
    parser.add_argument("--operator-deployment", help="default: <release>-modelswap-operator")
    parser.add_argument("--leader-lease", help="default: modelswap-operator (the chart's)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster)")
    parser.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        help="release ModelDeployments of this namespace (repeatable; default: every one)",
    )
    parser.add_argument("--wait-seconds", type=float, help="for the operator to stop (default 120)")
    parser.set_defaults(handler=run)


def operator_name(release: str) -> str:
    """The chart's name for the operator's Deployment (`modelswap.operator.name`)."""
    fullname = release if "modelswap" in release else f"{release}-modelswap"
    return f"{fullname[:63].rstrip('-')}-operator"[:63].rstrip("-")


def target_from(args: argparse.Namespace, environ: dict[str, str]) -> Target:
    def pick(name: str) -> str | None:
        value = getattr(args, name.replace("-", "_"), None)
        if value is not None:
            return str(value)
        return environ.get(ENV_PREFIX + name.replace("-", "_").upper()) or None

    release = pick("release")
    for flag, value in (("release", release), ("operator-namespace", pick("operator-namespace"))):
        if value is not None and not _NAME.match(value):
            raise ValueError(f"--{flag}: {value!r} is not a valid name (lower case letters, "
                             "digits and '-', at most 53 characters)")  # fmt: skip
    operator_namespace = pick("operator-namespace")
    if operator_namespace is None:
        raise ValueError("--operator-namespace (or MODELSWAP_OPERATOR_NAMESPACE) is required")
    deployment = pick("operator-deployment") or (operator_name(release) if release else None)
    if deployment is None:
        raise ValueError("--release or --operator-deployment is required")
    lease = pick("leader-lease") or "modelswap-operator"
    wait = pick("wait-seconds")
    try:
        wait_seconds = 120.0 if wait is None else float(wait)
    except ValueError:
        raise ValueError(f"--wait-seconds: {wait!r} is not a number") from None
    if wait_seconds < 0:
        raise ValueError("--wait-seconds must not be negative")
    return Target(
        operator_namespace=operator_namespace,
        operator_deployment=deployment,
        leader_lease=lease,
        namespaces=tuple(args.namespaces or ()),
        wait_seconds=wait_seconds,
    )


def run(args: argparse.Namespace) -> int:
    try:
        target = target_from(args, dict(os.environ))
    except ValueError as e:
        sys.stderr.write(f"modelswap uninstall: {e}\n")
        return 2
    configure_logging("INFO", json_lines=False)
    kubeconfig = args.kubeconfig or os.environ.get(ENV_PREFIX + "KUBECONFIG") or None
    try:
        api_client = kube.api_client(kubeconfig)
    except (KubeConfigError, OSError) as e:
        where = kubeconfig or "the in-cluster config"
        sys.stderr.write(f"modelswap uninstall: cannot use {where}: {e}\n")
        return 2
    try:
        with api_client as api:
            Uninstaller(api, target).run()
    except (UninstallError, kube.KubeError) as e:
        logging.getLogger(__name__).error("uninstall failed: %s", e)
        return 1
    return 0
