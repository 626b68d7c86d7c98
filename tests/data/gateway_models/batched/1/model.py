"""Doubles INPUT0 (a batch of [2, 3] rows) and echoes LABEL (empty when not sent). A LABEL
`raise` makes execute raise, for the tests of what a model's exception looks like to a
client (the python backend puts the stub's traceback in its error message)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            label = pb_utils.get_input_tensor_by_name(request, "LABEL")
            labels = (
                label.as_numpy()
                if label is not None
                else np.zeros((x.shape[0], 0), dtype=np.object_)
            )
            if b"raise" in labels.ravel().tolist():
                raise RuntimeError("the batched toy was asked to fail")
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32)),
                        pb_utils.Tensor("LABEL_OUT", labels.astype(np.object_)),
                    ]
                )
            )
        return responses
