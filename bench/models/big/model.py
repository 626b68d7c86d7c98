"""A generated large python-backend model for `bench.compare`: the example MLP's weights
tiled into one weights file of the region's size (1 GiB by default), read whole into the
weights region at load time (what a real model's cold start reads). Answers like the
example MLP; its CHECKSUM is a CRC-32 over SAMPLE_PAGES pages spread across the region
(the last one included), so a region that lost bytes anywhere shows without hashing the
whole GiB on every request. Standard library, numpy and modelswap_client only."""

import itertools
import json
import os
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

from modelswap_client.client import RegionSpec, attach

SIZES = (16, 64, 8)
PAGE = 4096
SAMPLE_PAGES = 64


def sampled_crc(view):
    """CRC-32 of SAMPLE_PAGES pages evenly spread over `view` (bench.compare checks it)."""
    pages = len(view) // PAGE
    crc = 0
    for i in range(SAMPLE_PAGES):
        p = (pages - 1) * i // (SAMPLE_PAGES - 1)
        crc = zlib.crc32(view[p * PAGE : (p + 1) * PAGE], crc)
    return crc


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        weights_bytes = int(params["modelswap.weights_bytes"])
        self.path = os.path.join(os.path.dirname(__file__), "weights.f32")
        self.n_params = sum(a * b + b for a, b in itertools.pairwise(SIZES))
        self.att = attach(
            args["model_name"],
            [RegionSpec("weights", weights_bytes)],
            instance=args["model_instance_name"],
            socket_path=params.get("modelswap.agent_socket"),
            mapper=params.get("modelswap.mapper", "sim"),
        )
        if not self.att.restored:
            self._load_weights()

    def _load_weights(self):
        view = self.att.regions["weights"].view()
        with open(self.path, "rb", buffering=0) as f:
            done = 0
            while done < len(view):
                n = f.readinto(view[done:])
                if not n:
                    raise ValueError(f"{self.path} is shorter than the region")
                done += n
        self.att.commit()

    def execute(self, requests):
        responses = []
        with self.att.in_use():
            if not self.att.committed:
                self._load_weights()
            view = self.att.regions["weights"].view()
            flat = np.frombuffer(view, dtype="<f4")[: self.n_params].astype(np.float64)
            checksum = sampled_crc(view)
            layers, offset = [], 0
            for n_in, n_out in itertools.pairwise(SIZES):
                w = flat[offset : offset + n_in * n_out].reshape(n_in, n_out)
                offset += n_in * n_out
                layers.append((w, flat[offset : offset + n_out]))
                offset += n_out
            for request in requests:
                h = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                h = h.astype(np.float64)
                for i, (w, b) in enumerate(layers):
                    h = h @ w + b
                    if i < len(layers) - 1:
                        h = np.maximum(h, 0.0)
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("OUTPUT0", h.astype(np.float32)),
                            pb_utils.Tensor("CHECKSUM", np.array([checksum], dtype=np.int64)),
                            pb_utils.Tensor("RESTORED", np.array([False], dtype=bool)),
                        ]
                    )
                )
            del view, flat
        return responses

    def finalize(self):
        self.att.close()
