"""Cluster mode's API client, built once at agent start before anything else runs.

A kubeconfig that cannot be read or parsed, or `inCluster: true` outside a pod (no
service-account token, no `KUBERNETES_SERVICE_HOST`), is a `StartupError` naming the
setting (`kube.kubeconfig` / `kube.inCluster`): `modelswap sidecar` prints one line and
exits with status 2 instead of failing with a traceback after its servers started.
"""

from __future__ import annotations

from typing import Any

from modelswap_sidecar.agent.errors import StartupError
from modelswap_sidecar.agent.settings.values import AgentSettings


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


def api_client(settings: AgentSettings) -> Any | None:
    """The API client for the heartbeat; None without a `kube` section (or in local mode).
    The caller closes it."""
    access = settings.kube
    if access is None or settings.local_mode:
        return None
    from modelswap_api import kube  # noqa: PLC0415 - the kubernetes client only when used

    if access.kubeconfig is not None:
        try:
            return kube.api_client(str(access.kubeconfig))
        except Exception as e:  # KubeConfigError, OSError, YAML errors: all unusable
            raise StartupError(
                f"kube.kubeconfig: {access.kubeconfig} cannot be used: {_reason(e)}"
            ) from e
    try:
        return kube.api_client(None)
    except Exception as e:
        raise StartupError(
            f"kube.inCluster: no in-cluster service account here: {_reason(e)}"
        ) from e
