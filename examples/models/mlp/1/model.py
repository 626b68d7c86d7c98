"""A small numpy MLP whose weights live in agent memory (modelswap client library).

`initialize` attaches to the agent with one weights region of `modelswap.weights_bytes`.
If the agent restored the region from its host store, nothing is read from the model
directory; otherwise the weight file is tiled across the region and committed (saved to
the host store, once). After a swap-out with `onSwapOut: drop` the next swap-in maps fresh
memory (`committed` is False): the weights are loaded from the file again. Every `execute`
runs inside `in_use()` (which swaps the model back in first if it is out) and computes only
from the region's bytes.

Standard library, numpy and modelswap_client only (the stub's environment).
"""

import json
import os
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

from modelswap_client.client import RegionSpec, attach


def _param(config, key, default=None):
    entry = config.get("parameters", {}).get(key)
    if entry is None:
        if default is None:
            raise ValueError(f"model parameter {key} is missing")
        return default
    return entry["string_value"]


def tile_into(view, data):
    """Fill `view` with `data` repeated (the last copy cut short)."""
    n = len(data)
    size = len(view)
    view[: min(n, size)] = data[: min(n, size)]
    filled = min(n, size)
    while filled < size:  # doubling copies: a few dozen memmoves for 32 MiB
        step = min(filled, size - filled)
        view[filled : filled + step] = view[:step]
        filled += step


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.sizes = [int(s) for s in _param(config, "layers").split(",")]
        weights_bytes = int(_param(config, "modelswap.weights_bytes"))
        minimum = int(_param(config, "min_weights_bytes", "0"))
        if weights_bytes < minimum:
            raise ValueError(f"weightsBytes {weights_bytes} is below this model's {minimum}")
        path = os.path.join(os.path.dirname(__file__), _param(config, "weights_file"))
        self.n_params = sum(a * b + b for a, b in zip(self.sizes, self.sizes[1:], strict=False))
        self.att = attach(
            args["model_name"],
            [RegionSpec("weights", weights_bytes)],
            instance=args["model_instance_name"],
            socket_path=_param(config, "modelswap.agent_socket"),
            mapper=_param(config, "modelswap.mapper", "sim"),
        )
        self.path = path
        self.restored = bool(self.att.restored)
        if not self.restored:
            self._load_weights()

    def _load_weights(self):
        """Tile the weight file across the region and have the agent save it (once)."""
        with open(self.path, "rb") as f:
            data = f.read()
        if len(data) != self.n_params * 4:
            raise ValueError(f"{self.path}: {len(data)} bytes, expected {self.n_params * 4}")
        tile_into(self.att.regions["weights"].view(), data)
        self.att.commit()

    def _layers(self):
        flat = self.att.regions["weights"].numpy("<f4")[: self.n_params]
        offset = 0
        layers = []
        for n_in, n_out in zip(self.sizes, self.sizes[1:], strict=False):
            w = flat[offset : offset + n_in * n_out].reshape(n_in, n_out)
            offset += n_in * n_out
            b = flat[offset : offset + n_out]
            offset += n_out
            layers.append((w.astype(np.float64), b.astype(np.float64)))
        return layers

    def execute(self, requests):
        responses = []
        with self.att.in_use():
            if not self.att.committed:  # swapped in after a drop: fresh memory
                self._load_weights()
                self.restored = False
            layers = self._layers()
            checksum = zlib.crc32(self.att.regions["weights"].view())
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                h = x.astype(np.float64)
                for i, (w, b) in enumerate(layers):
                    h = h @ w + b
                    if i < len(layers) - 1:
                        h = np.maximum(h, 0.0)
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("OUTPUT0", h.astype(np.float32)),
                            pb_utils.Tensor("CHECKSUM", np.array([checksum], dtype=np.int64)),
                            pb_utils.Tensor("RESTORED", np.array([self.restored], dtype=bool)),
                        ]
                    )
                )
            del layers  # no view of the region outlives in_use()
        return responses

    def finalize(self):
        self.att.close()
