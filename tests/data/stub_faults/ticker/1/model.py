"""The stub-fault tests' model: a known pattern in one weights region, streamed answers.

`initialize` attaches one weights region of `modelswap.weights_bytes`; unless the agent
restored it from its host store, it fills the region with `pattern_byte(i) = (i * 7 + 3)
mod 256` and commits it. Each request runs on its own thread inside `in_use()` until its
final response is sent, so a request holds the model (as a generating model's stream
does), and answers COUNT responses, one every INTERVAL_MS, each with the CRC-32 of the
whole region (the test computes the expected one from the pattern, independently).

Standard library, numpy and modelswap_client only (the stub's environment).
"""

import json
import os
import threading
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

from modelswap_client.client import RegionSpec, attach


def _param(config, key, default=None):
    entry = config.get("parameters", {}).get(key)
    return default if entry is None else entry["string_value"]


def fill_pattern(view):
    """The region's bytes: (i * 7 + 3) mod 256, written a 256-byte period at a time."""
    period = ((np.arange(256, dtype=np.uint32) * 7 + 3) % 256).astype(np.uint8).tobytes()
    size = len(view)
    view[: min(256, size)] = period[: min(256, size)]
    filled = min(256, size)
    while filled < size:  # doubling copies (256 divides every 2 MiB region)
        step = min(filled, size - filled)
        view[filled : filled + step] = view[:step]
        filled += step


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.att = attach(
            args["model_name"],
            [RegionSpec("weights", int(_param(config, "modelswap.weights_bytes")))],
            instance=args["model_instance_name"],
            socket_path=_param(config, "modelswap.agent_socket"),
            mapper=_param(config, "modelswap.mapper", "sim"),
        )
        self.restored = bool(self.att.restored)
        self.load_lock = threading.Lock()
        if not self.restored:
            self._load()

    def _load(self):
        fill_pattern(self.att.regions["weights"].view())
        self.att.commit()

    def _run(self, request, sender):
        try:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            interval = pb_utils.get_input_tensor_by_name(request, "INTERVAL_MS")
            interval_seconds = 0.0 if interval is None else interval.as_numpy()[0] / 1000.0
            with self.att.in_use():
                with self.load_lock:
                    if not self.att.committed:  # swapped in after a drop: fresh memory
                        self._load()
                for i in range(count):
                    if i and interval_seconds:
                        time.sleep(interval_seconds)
                    crc = zlib.crc32(self.att.regions["weights"].view())
                    sender.send(
                        pb_utils.InferenceResponse(
                            [
                                pb_utils.Tensor("INDEX", np.array([i], dtype=np.int32)),
                                pb_utils.Tensor("CHECKSUM", np.array([crc], dtype=np.int64)),
                                pb_utils.Tensor("RESTORED", np.array([self.restored])),
                                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                            ]
                        )
                    )
        except Exception as e:  # reported to the client rather than lost
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            threading.Thread(target=self._run, args=(request, sender), daemon=True).start()

    def finalize(self):
        self.att.close()
