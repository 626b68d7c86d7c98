"""A toy model whose answer says which code and which weights it runs.

VERSION is this file's constant (a test edits it); the weights file is tiled across the
weights region unless the agent restored the region from its host store (RESTORED), and
CHECKSUM is the region's CRC-32, so an answer shows whether new weights were loaded.
"""

import json
import os
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

from modelswap_client.client import RegionSpec, attach

VERSION = 1


def _param(config, key):
    return config["parameters"][key]["string_value"]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.att = attach(
            args["model_name"],
            [RegionSpec("weights", int(_param(config, "modelswap.weights_bytes")))],
            instance=args["model_instance_name"],
            socket_path=_param(config, "modelswap.agent_socket"),
        )
        self.restored = bool(self.att.restored)
        if not self.restored:
            path = os.path.join(os.path.dirname(__file__), _param(config, "weights_file"))
            with open(path, "rb") as f:
                data = f.read()
            view = self.att.regions["weights"].view()
            for start in range(0, len(view), len(data)):
                end = min(start + len(data), len(view))
                view[start:end] = data[: end - start]
            self.att.commit()

    def execute(self, requests):
        with self.att.in_use():
            checksum = zlib.crc32(self.att.regions["weights"].view())
        answer = [
            pb_utils.Tensor("VERSION", np.array([VERSION], dtype=np.int64)),
            pb_utils.Tensor("CHECKSUM", np.array([checksum], dtype=np.int64)),
            pb_utils.Tensor("RESTORED", np.array([self.restored], dtype=bool)),
            pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
        ]
        return [pb_utils.InferenceResponse(answer) for _ in requests]

    def finalize(self):
        self.att.close()
