"""A decoupled "language model" with a known answer: it streams the prompt's words back
upper-cased, one response per word (`" A"`, `" B"`, ...), at most `max_tokens` of them
(a request parameter, default 16). It stops early when its request is cancelled (its
client went away), as every generating model should. Token counts for the gateway's
`usage`: a word is a token (`prompt_tokens`: the prompt's words; `token_ids`: the word's
index); the last response's `finish_reason` is "length" when max_tokens cut the words
short, else "stop".

Pacing for tests: when the model was loaded with the parameter `modelswap.pace_dir`, it
writes `<pace_dir>/sent-<i>` after sending token i, and before generating token i (i >= 1)
waits until `<pace_dir>/go-<i>` exists. A test can so hold the model between tokens and
observe, by ordering alone, that a token reached the client before the next was generated.
"""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

PACE_WAIT_SECONDS = 60.0


def _strings(value):
    return np.array([value.encode()], dtype=np.object_)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        pace = config["parameters"].get("modelswap.pace_dir")
        self.pace_dir = pace["string_value"] if pace else None

    def execute(self, requests):
        for request in requests:
            # Answer from a thread, so `execute` returns at once, as decoupled models may.
            threading.Thread(target=self._generate, args=(request,), daemon=True).start()

    def _generate(self, request):
        sender = request.get_response_sender()
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            text = prompt.reshape(-1)[0]
            if isinstance(text, bytes):
                text = text.decode()
            parameters = json.loads(request.parameters() or "{}")
            max_tokens = int(parameters.get("max_tokens", 16))
            words = text.split()
            answer = words[:max_tokens]
            reason = "length" if len(words) > max_tokens else "stop"
            for i, word in enumerate(answer):
                if request.is_cancelled():  # the client hung up: stop generating for no one
                    break
                if i and self.pace_dir:
                    self._wait_for(os.path.join(self.pace_dir, f"go-{i}"))
                tensors = [
                    pb_utils.Tensor("text_output", _strings(" " + word.upper())),
                    pb_utils.Tensor("token_ids", np.array([i], dtype=np.int32)),
                    pb_utils.Tensor("prompt_tokens", np.array([len(words)], dtype=np.int32)),
                ]
                if i == len(answer) - 1:
                    tensors.append(pb_utils.Tensor("finish_reason", _strings(reason)))
                sender.send(pb_utils.InferenceResponse(tensors))
                if self.pace_dir:
                    open(os.path.join(self.pace_dir, f"sent-{i}"), "w").close()
        except Exception as e:  # reported to the client rather than lost
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _wait_for(self, path):
        deadline = time.monotonic() + PACE_WAIT_SECONDS
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise RuntimeError(f"pacing: {path} did not appear")
            time.sleep(0.005)
