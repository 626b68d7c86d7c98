"""A slow generator inside `in_use()`: see config.pbtxt.

Its weights are 8 marker bytes in the `weights` region, committed once (a restore brings
them back); every response checks them, so an answer after a swap cycle proves the region
came back. Between tokens it checks `request.is_cancelled()` and stops, leaving `in_use()`:
a request its client dropped, or the gateway ended (a swap-out's drain past its deadline),
releases the drain.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from modelswap_client.triton import attach_model

MARKER = b"heldgen1"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.att = attach_model(args)
        if not self.att.restored:
            self.att.regions["weights"].view()[: len(MARKER)] = MARKER
            self.att.commit()

    def execute(self, requests):
        for request in requests:
            # answered from a thread, so `execute` returns at once, as decoupled models may
            threading.Thread(target=self._generate, args=(request,), daemon=True).start()

    def _generate(self, request):
        sender = request.get_response_sender()
        try:
            parameters = json.loads(request.parameters() or "{}")
            max_tokens = int(parameters.get("max_tokens", 1_000_000))
            token_seconds = float(parameters.get("token_seconds", 0.05))
            with self.att.in_use():
                weights = bytes(self.att.regions["weights"].view()[: len(MARKER)])
                if weights != MARKER:
                    raise RuntimeError(f"the weights region holds {weights!r}, not {MARKER!r}")
                for i in range(max_tokens):
                    if request.is_cancelled():  # the client hung up, or the gateway ended it
                        break
                    token = np.array([f" t{i}".encode()], dtype=np.object_)
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", token)]))
                    time.sleep(token_seconds)
        except Exception as e:  # reported to the client rather than lost
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=FINAL)
            return
        sender.send(flags=FINAL)
