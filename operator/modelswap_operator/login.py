"""kopf's connection from the same client configuration the operator's own calls use
(`modelswap_api.kube.api_client`: a kubeconfig path, or the in-cluster service account),
so `--kubeconfig` means the same thing to both."""

from __future__ import annotations

from typing import Any

import kopf


def connection_info(api: Any, *, default_namespace: str | None = None) -> kopf.ConnectionInfo:
    """A kopf ConnectionInfo from a `kubernetes.client.ApiClient`'s configuration."""
    configuration = api.configuration
    # The client keeps a kubeconfig's or service account's token under `BearerToken` (older
    # releases: `authorization`) with its prefix apart; this call also runs the refresh hook
    # that re-reads a rotated service-account token.
    authorization = (
        configuration.get_api_key_with_prefix("BearerToken", alias="authorization") or ""
    )
    scheme, _, token = authorization.partition(" ")
    if not token:
        scheme, token = "Bearer", authorization or None
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        default_namespace=default_namespace,
    )
