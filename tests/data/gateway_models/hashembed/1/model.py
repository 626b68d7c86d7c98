"""A deterministic toy embedding with known answers (numpy only).

Each string's row is the first `WIDTH` bytes of the SHA-256 of its UTF-8 bytes, centred
(minus 127.5) and scaled to unit length, in float32; its token count is its UTF-8 byte
count, so a test sees whether the text arrived byte for byte. The string `raise` makes
the model answer an error, for the tests of a model's failure.
"""

import hashlib

import numpy as np
import triton_python_backend_utils as pb_utils

WIDTH = 16
FAILING_TEXT = b"raise"


def embed(text: bytes) -> np.ndarray:
    row = np.frombuffer(hashlib.sha256(text).digest()[:WIDTH], dtype=np.uint8)
    centred = row.astype(np.float32) - np.float32(127.5)
    return centred / np.linalg.norm(centred)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            texts = [t if isinstance(t, bytes) else str(t).encode() for t in texts.reshape(-1)]
            if FAILING_TEXT in texts:
                error = pb_utils.TritonError("the toy embedding was asked to fail")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            rows = np.zeros((len(texts), WIDTH), dtype=np.float32)
            for i, text in enumerate(texts):
                rows[i] = embed(text)
            tokens = np.array([len(t) for t in texts], dtype=np.int64)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("embedding", rows),
                        pb_utils.Tensor("prompt_tokens", tokens),
                    ]
                )
            )
        return responses
