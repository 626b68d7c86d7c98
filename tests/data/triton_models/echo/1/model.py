"""Doubles INPUT0; answers with the modelswap UID it was loaded with and its own pid.

Imports numpy and the client library (with `modelswap_api.wire`) the way real modelswap
models do, proving the stub's environment can.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

import modelswap_api.wire
import modelswap_client.client


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.uid = config["parameters"]["modelswap.uid"]["string_value"]
        # Touch what the imports must provide.
        assert modelswap_api.wire.PROTOCOL_VERSION >= 1
        assert modelswap_client.client.SOCKET_ENV

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32)),
                        pb_utils.Tensor("UID", np.array([self.uid.encode()], dtype=np.object_)),
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                    ]
                )
            )
        return responses
