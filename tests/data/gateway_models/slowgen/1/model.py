"""A slow decoupled generator that stops when its request is cancelled.

Each request streams `" t0"`, `" t1"`, ... one response per token, a token every
`token_seconds` (request parameter, default 0.05 s), at most `max_tokens` of them (request
parameter, default 1,000,000). Between tokens it checks `request.is_cancelled()` (Triton
sets it when the client's connection closes, or the request is cancelled otherwise) and
stops without a further response. Each response also carries `token_ids` ([i]) and
`prompt_tokens` (the prompt's words), the last `finish_reason` "length" (the gateway's
OpenAI `usage` and finish reason).

Trace for tests: with the model parameter `modelswap.trace_dir`, each request's prompt
(first word) names a file `<trace_dir>/<word>` to which the model appends one line per
event: `started`, `token <i>` (every 10th), then `cancelled <tokens sent>` or
`finished <tokens sent>`. A test so sees, without timing guesses, whether a generation
stopped because its client went away.
"""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        trace = config["parameters"].get("modelswap.trace_dir")
        self.trace_dir = trace["string_value"] if trace else None

    def execute(self, requests):
        for request in requests:
            # answered from a thread, so `execute` returns at once, as decoupled models may
            threading.Thread(target=self._generate, args=(request,), daemon=True).start()

    def _trace(self, name, line):
        if self.trace_dir and name:
            with open(os.path.join(self.trace_dir, name), "a") as f:
                f.write(line + "\n")

    def _generate(self, request):
        sender = request.get_response_sender()
        name = ""
        sent = 0
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            text = prompt.reshape(-1)[0]
            if isinstance(text, bytes):
                text = text.decode()
            words = text.split()
            name = os.path.basename(words[0]) if words else ""
            parameters = json.loads(request.parameters() or "{}")
            max_tokens = int(parameters.get("max_tokens", 1_000_000))
            token_seconds = float(parameters.get("token_seconds", 0.05))
            self._trace(name, "started")
            for i in range(max_tokens):
                if request.is_cancelled():  # the client hung up: stop generating for no one
                    self._trace(name, f"cancelled {sent}")
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
                token = np.array([f" t{i}".encode()], dtype=np.object_)
                tensors = [
                    pb_utils.Tensor("text_output", token),
                    pb_utils.Tensor("token_ids", np.array([i], dtype=np.int32)),
                    pb_utils.Tensor("prompt_tokens", np.array([len(words)], dtype=np.int32)),
                ]
                if i == max_tokens - 1:  # it always runs to max_tokens
                    reason = np.array([b"length"], dtype=np.object_)
                    tensors.append(pb_utils.Tensor("finish_reason", reason))
                sender.send(pb_utils.InferenceResponse(tensors))
                sent += 1
                if i % 10 == 0:
                    self._trace(name, f"token {i}")
                time.sleep(token_seconds)
        except Exception as e:  # reported to the client rather than lost
            self._trace(name, f"error {e}")
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        self._trace(name, f"finished {sent}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
