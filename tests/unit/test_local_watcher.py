"""Local mode's folder watcher against a fake control API: a model whose file is removed is
left out of the next push and then forgotten (DELETE), so `GET /v1/models` stops listing it;
a DELETE that fails is sent again after the next push."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_sidecar.local.watcher import FolderWatcher

MODEL = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: {name}
spec:
  model:
    source: {{uri: /models/mlp}}
    weightsBytes: 32Mi
"""


class FakeControl:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.pushed: list[list[str]] = []
        self.refuse_deletes = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        if request.method == "PUT":
            entries = json.loads(request.content)["entries"]
            self.pushed.append(sorted(e["name"] for e in entries))
            results = [
                {"uid": e["uid"], "outcome": "applied", "reason": "Loading"} for e in entries
            ]
            return httpx.Response(200, json={"results": results})
        if self.refuse_deletes:
            return httpx.Response(503, json={"error": "busy"})
        return httpx.Response(200, json={"outcome": "completed", "reason": "Forgotten"})


def test_a_removed_file_is_pushed_out_then_forgotten_and_a_failed_delete_is_retried(
    tmp_path: Path,
) -> None:
    for name in ("classify", "embed"):
        (tmp_path / f"{name}.yaml").write_text(MODEL.format(name=name))
    control = FakeControl()
    watcher = FolderWatcher(
        tmp_path, BUILTIN_DEFAULTS, control_url="http://agent", token="t", node_name="local"
    )
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        assert control.pushed == [["classify", "embed"]]
        uid = next(m.uid for m in watcher.applied.models if m.name == "embed")
        assert not [c for c in control.calls if c[0] == "DELETE"]

        (tmp_path / "embed.yaml").unlink()
        control.refuse_deletes = True
        watcher.poll(client)
        assert control.pushed[-1] == ["classify"]
        assert control.calls[-1] == ("DELETE", f"/v1/models/{uid}")

        control.refuse_deletes = False
        watcher.resync_seconds = 0.0  # the next push is due at once
        watcher.poll(client)
        assert control.calls[-2:] == [("PUT", "/v1/desired"), ("DELETE", f"/v1/models/{uid}")]
        calls = len(control.calls)
        watcher.poll(client)
        assert [c[0] for c in control.calls[calls:]] == ["PUT"]  # forgotten once, not again
