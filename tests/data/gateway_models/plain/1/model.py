"""Doubles INPUT0 and answers with the modelswap UID it was loaded with."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.uid = config["parameters"]["modelswap.uid"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32)),
                        pb_utils.Tensor("UID", np.array([self.uid.encode()], dtype=np.object_)),
                    ]
                )
            )
        return responses
