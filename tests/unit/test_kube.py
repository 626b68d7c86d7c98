from pathlib import Path

import yaml

from modelswap_api import kube


def test_api_client_reads_an_explicit_kubeconfig(tmp_path: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:6553"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api = kube.api_client(str(path))
    assert api.configuration.host == "http://127.0.0.1:6553"
    assert api.configuration.auth_settings()["BearerToken"]["value"] == "Bearer t0ken"
    assert kube.custom_objects(api).api_client is api
