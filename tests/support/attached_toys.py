"""The toys of tests/data/gateway_models, made to attach through the client library.

The toys do not use the client library; under the real agent a python-backend model must
attach (else its process counts as exited and it is loaded again and again). `attach_toy`
copies a toy into a model folder with its model.py renamed toy.py and a model.py that
attaches one small region (`modelswap.weights_bytes`), commits it once, and serves with the
toy's own class.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.gateway_triton import GATEWAY_MODELS

_ATTACHED = """\
import importlib.util
import json
import os

from modelswap_client.client import RegionSpec, attach

_spec = importlib.util.spec_from_file_location(
    "toy", os.path.join(os.path.dirname(__file__), "toy.py")
)
_toy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_toy)


def _param(config, key, default=None):
    value = config.get("parameters", {}).get(key)
    return value["string_value"] if value else default


class TritonPythonModel(_toy.TritonPythonModel):
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.att = attach(
            args["model_name"],
            [RegionSpec("weights", int(_param(config, "modelswap.weights_bytes")))],
            instance=args["model_instance_name"],
            socket_path=_param(config, "modelswap.agent_socket"),
            mapper=_param(config, "modelswap.mapper", "sim"),
        )
        if not self.att.restored:
            self.att.commit()
        if hasattr(_toy.TritonPythonModel, "initialize"):
            super().initialize(args)
"""

#: execute inside `in_use()`: a swap-out waits for the requests the model is running
_IN_USE = """
    def execute(self, requests):
        with self.att.in_use():
            return super().execute(requests)
"""

#: the attachment closed when Triton unloads the model
_FINALIZE = """
    def finalize(self):
        self.att.close()
"""


def attach_toy(root: Path, toy: str, *, execute_in_use: bool, close_on_finalize: bool) -> Path:
    """Copy toy `toy` into `root`, attaching; `execute_in_use` wraps its execute in
    `in_use()`, `close_on_finalize` closes the attachment when Triton unloads the model."""
    folder = root / toy
    shutil.copytree(GATEWAY_MODELS / toy, folder)
    version = folder / "1"
    (version / "model.py").rename(version / "toy.py")
    source = _ATTACHED + (_IN_USE if execute_in_use else "")
    (version / "model.py").write_text(source + (_FINALIZE if close_on_finalize else ""))
    return folder
