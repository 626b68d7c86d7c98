"""The only module that imports `kubernetes`: API clients shared by the operator and agent.

Configuration is explicit — a kubeconfig path, or the in-cluster service account — and the
returned `ApiClient` is passed down; nothing here reads the environment at import time.
"""

from __future__ import annotations

from kubernetes import client, config


def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    """An ApiClient from `kubeconfig` (path), or the in-cluster config when None."""
    configuration = client.Configuration()
    if kubeconfig is None:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    return client.ApiClient(configuration)


def custom_objects(api: client.ApiClient) -> client.CustomObjectsApi:
    """Access to ModelDeployments and SwapNodes."""
    return client.CustomObjectsApi(api)
